"""A target is replaced when its process imports its module, never by importing it: the installer's waiting side.

The upstream here is a throw-away package written to ``tmp_path`` (a module, a submodule and a package ``__init__``
that copies a function with ``from .impl import ...``, as verl's ``verl.models.mcore`` does), imported by the real
import system. The prelude's own boundary (the driver imports no vLLM) is checked in a fresh process in
test_prelude.py.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import itertools
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from r1_ascend.patches import (
    PatchSpec,
    PatchTargetError,
    Target,
    check_targets,
    get_original,
    install_on_import,
    installed_targets,
    patched_by,
    restore_all,
    waiting_targets,
)

_names = itertools.count()

PACKAGE_INIT = "from .impl import scale\n\nBEFORE = 1\n"
IMPL = "def scale(x, factor):\n    return x * factor\n\n\ndef other(x):\n    return x\n"
TOOLS = "class Tool:\n    def run(self, data):\n        return data\n"


def wrap_scale(original: Callable[..., Any]) -> Callable[..., Any]:
    def scale(x: Any, factor: Any) -> Any:
        return original(x, factor) + 1

    return scale


def wrap_run(original: Callable[..., Any]) -> Callable[..., Any]:
    def run(self: Any, data: Any) -> Any:
        return ("patched", original(self, data))

    return run


@contextlib.contextmanager
def fake_upstream(root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh, never imported package ``<name>`` with ``impl`` (aliased in ``__init__``) and ``tools``; afterwards
    every install and every module of it is gone."""
    name = f"r1_fake_upstream_{os.getpid()}_{next(_names)}"
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text(PACKAGE_INIT)
    (package / "impl.py").write_text(IMPL)
    (package / "tools.py").write_text(TOOLS)
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    try:
        yield name
    finally:
        restore_all()
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]


@pytest.fixture
def upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with fake_upstream(tmp_path, monkeypatch) as name:
        yield name


def scale_target(package: str, *, aliased: bool = True) -> Target:
    aliases = (f"{package}:scale",) if aliased else ()
    return Target(f"{package}.impl", "scale", "fake-upstream", params=("x", "factor"), aliases=aliases)


def run_target(package: str) -> Target:
    return Target(f"{package}.tools", "Tool.run", "fake-upstream", params=("self", "data"))


def test_a_target_not_imported_waits_and_is_not_imported(upstream: str) -> None:
    target = run_target(upstream)

    assert install_on_import("fake", target, wrap_run) is False
    assert f"{upstream}.tools" not in sys.modules
    assert waiting_targets("fake") == [target.path]
    assert installed_targets("fake") == []

    tools = importlib.import_module(f"{upstream}.tools")

    assert tools.Tool().run(3) == ("patched", 3)
    assert patched_by(tools.Tool.__dict__["run"]) == "fake"
    assert waiting_targets() == []
    assert installed_targets("fake") == [target.path]


def test_a_target_already_imported_is_replaced_at_once(upstream: str) -> None:
    tools = importlib.import_module(f"{upstream}.tools")

    assert install_on_import("fake", run_target(upstream), wrap_run) is True
    assert tools.Tool().run(1) == ("patched", 1)
    assert waiting_targets() == []


def test_the_module_keeps_its_own_loader(upstream: str) -> None:
    install_on_import("fake", run_target(upstream), wrap_run)
    tools = importlib.import_module(f"{upstream}.tools")

    assert type(tools.__loader__).__name__ == "SourceFileLoader"
    assert tools.__spec__.loader is tools.__loader__
    assert "class Tool" in inspect.getsource(tools)


def test_an_alias_is_rebound_only_once_its_package_has_bound_it(upstream: str) -> None:
    """The submodule finishes importing inside its package's ``__init__``, before the package copies the function:
    the install waits for the package, then rebinds both places to one replacement."""
    install_on_import("fake", scale_target(upstream), wrap_scale)

    package = importlib.import_module(upstream)
    impl = sys.modules[f"{upstream}.impl"]

    assert package.scale is impl.scale
    assert package.scale(2, 3) == 7
    assert get_original(scale_target(upstream))(2, 3) == 6


def test_a_failing_install_makes_the_import_raise_every_time(upstream: str) -> None:
    """Nothing is imported unpatched in silence: the install that failed stays waiting, and so does the error."""
    drifted = Target(f"{upstream}.tools", "Tool.run", "fake-upstream", params=("self", "batch"))
    install_on_import("fake", drifted, wrap_run)

    for _ in range(2):
        with pytest.raises(PatchTargetError, match=r"signature of .*Tool\.run drifted"):
            importlib.import_module(f"{upstream}.tools")
        assert f"{upstream}.tools" not in sys.modules
        assert waiting_targets("fake") == [drifted.path]


def test_a_module_whose_own_code_fails_keeps_its_installs_waiting(upstream: str, tmp_path: Path) -> None:
    tools_path = tmp_path / upstream / "tools.py"
    tools_path.write_text("raise RuntimeError('upstream broke')\n")
    install_on_import("fake", run_target(upstream), wrap_run)

    with pytest.raises(RuntimeError, match="upstream broke"):
        importlib.import_module(f"{upstream}.tools")
    assert waiting_targets("fake") == [run_target(upstream).path]

    tools_path.write_text(TOOLS)
    importlib.invalidate_caches()
    tools = importlib.import_module(f"{upstream}.tools")
    assert tools.Tool().run(0) == ("patched", 0)


def test_restore_all_drops_what_is_waiting(upstream: str) -> None:
    install_on_import("fake", run_target(upstream), wrap_run)
    restore_all()

    tools = importlib.import_module(f"{upstream}.tools")

    assert tools.Tool().run(5) == 5
    assert waiting_targets() == []


def test_two_patches_cannot_wait_for_one_target(upstream: str) -> None:
    install_on_import("first", run_target(upstream), wrap_run)
    with pytest.raises(PatchTargetError, match="already to be replaced by patch 'first'"):
        install_on_import("second", run_target(upstream), wrap_run)


@settings(max_examples=30, deadline=None)
@given(
    order=st.permutations(["package", "impl", "tools"]),
    registered_after=st.integers(min_value=0, max_value=3),
)
def test_every_target_is_replaced_once_whatever_the_import_order(order: list[str], registered_after: int) -> None:
    """Imports in any order, with the patch registered before, between or after them: once all are imported, each
    target is replaced exactly once, aliases included, and nothing waits."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        pytest.MonkeyPatch.context() as monkeypatch,
        fake_upstream(Path(tmp), monkeypatch) as package,
    ):
        modules = {"package": package, "impl": f"{package}.impl", "tools": f"{package}.tools"}
        builds = {"scale": 0, "run": 0}

        def counted(key: str, wrap: Callable[..., Any]) -> Callable[..., Any]:
            def build(original: Any) -> Any:
                builds[key] += 1
                return wrap(original)

            return build

        def register() -> None:
            install_on_import("fake", scale_target(package), counted("scale", wrap_scale))
            install_on_import("fake", run_target(package), counted("run", wrap_run))

        for index, name in enumerate(order):
            if index == registered_after:
                register()
            importlib.import_module(modules[name])
        if registered_after == len(order):
            register()

        root = sys.modules[package]
        assert builds == {"scale": 1, "run": 1}
        assert root.scale is sys.modules[modules["impl"]].scale
        assert root.scale(1, 1) == 2
        assert sys.modules[modules["tools"]].Tool().run(0) == ("patched", 0)
        assert waiting_targets() == []


def test_a_target_not_imported_is_checked_in_the_installed_source(upstream: str, tmp_path: Path) -> None:
    """Drift in a module the process has not imported still stops the patch before anything is installed, and the
    module stays unimported."""
    (tmp_path / upstream / "tools.py").write_text("class Tool:\n    def run(self, batch):\n        return batch\n")
    spec = PatchSpec(
        name="fake",
        targets=(scale_target(upstream, aliased=False), run_target(upstream)),
        requires={},
        processes=("worker",),
    )

    with pytest.raises(PatchTargetError) as info:
        check_targets(spec)

    message = str(info.value)
    assert f"{upstream}.tools.Tool.run does not match the installed source" in message
    assert "expected ('self', 'data'), found ('self', 'batch')" in message
    assert "R1_ASCEND_DISABLE=fake" in message
    assert f"{upstream}.tools" not in sys.modules
    assert f"{upstream}.impl" not in sys.modules
