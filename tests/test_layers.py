"""The import rules of the project, read from every Python file git tracks (``ast``; function-level imports too).

Layers, lowest first; a module may import its own layer and the layers below it, never one above:

1. base: ``r1_ascend`` (the package), ``r1_ascend.envs``, ``r1_ascend.stack``, ``r1_ascend.atomic``,
   ``r1_ascend.parallel``, ``r1_ascend.ports``: the standard library and third-party packages only;
2. patches: ``r1_ascend.patches`` and everything in it;
3. ``r1_ascend.data`` and ``r1_ascend.recipe`` (the recipe may import data, data not the recipe);
4. platform: ``r1_ascend.cpu``, the CPU platform the rehearsal and ``check-model --cpu`` run on (it never imports a
   tool, so the rehearsal attaches to it, not it to the rehearsal);
5. tools: ``r1_ascend.launch``, ``weights``, ``report``, ``evaluate``, ``rehearse``, ``doctor``, ``cli``,
   ``mindspeed_source``, and the benchmark scripts;
6. ``r1_ascend.testing``: test support. Only tests, ``conftest.py``, the rehearsal's CPU site
   (``r1_ascend/rehearse/site/``, a CPU stand-in by design) and ``r1_ascend.testing`` itself import it.

Across layers, only the public modules of ``r1_ascend.patches`` may be imported: a module whose dotted name has a
part starting with ``_`` below ``r1_ascend.patches`` is private to the package, tests included (what a patch
installs is public in ``r1_ascend.patches.impl``, so its tests need no private import). Outside the tests, a
``_name`` (module or attribute) is imported only from within the module or package that owns it.

No import cycle among the project's modules, at any depth (a function-level import that closes a cycle still ties
the two modules together): :func:`import_cycle`.
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Folder (as git lists it) -> the package it installs as (pyproject.toml ``package-dir``).
PACKAGE_DIRS = {
    "src/r1_ascend": "r1_ascend",
    "patches": "r1_ascend.patches",
    "recipe": "r1_ascend.recipe",
    "data": "r1_ascend.data",
}

BASE, PATCHES, DATA, RECIPE = "base", "patches", "data", "recipe"
PLATFORM, TOOLS, TESTING, TESTS = "platform", "tools", "testing", "tests"
#: Which layers each layer may import.
ALLOWED = {
    BASE: {BASE},
    PATCHES: {BASE, PATCHES},
    DATA: {BASE, PATCHES, DATA},
    RECIPE: {BASE, PATCHES, DATA, RECIPE},
    PLATFORM: {BASE, PATCHES, DATA, RECIPE, PLATFORM},
    TOOLS: {BASE, PATCHES, DATA, RECIPE, PLATFORM, TOOLS},
    TESTING: {BASE, PATCHES, DATA, RECIPE, PLATFORM, TOOLS, TESTING},
    TESTS: {BASE, PATCHES, DATA, RECIPE, PLATFORM, TOOLS, TESTING, TESTS},
}
BASE_MODULES = (
    "r1_ascend.envs",
    "r1_ascend.stack",
    "r1_ascend.atomic",
    "r1_ascend.parallel",
    "r1_ascend.ports",
    "r1_ascend.checkout",
)
TOOL_MODULES = (
    "r1_ascend.launch",
    "r1_ascend.weights",
    "r1_ascend.report",
    "r1_ascend.evaluate",
    "r1_ascend.rehearse",
    "r1_ascend.doctor",
    "r1_ascend.cli",
    "r1_ascend.mindspeed_source",
)
#: The rehearsal's CPU site: a tool that stands in for the NPU machine, so it may use the test support.
REHEARSAL_SITE = "src/r1_ascend/rehearse/site/"


@dataclass(frozen=True)
class Edge:
    path: str  # the importing file, relative to the repository
    line: int
    imported: str  # dotted project module


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def module_name(path: str) -> str | None:
    """The dotted module a tracked file installs as, or None for files outside the packages (tests, scripts)."""
    parts = path.removesuffix(".py").split("/")
    folder = next((f for f in PACKAGE_DIRS if parts[: f.count("/") + 1] == f.split("/")), None)
    if folder is None:
        return None
    package = PACKAGE_DIRS[folder]
    rest = parts[folder.count("/") + 1 :]
    if rest and rest[-1] == "__init__":
        rest = rest[:-1]
    return ".".join([package, *rest])


def layer_of_file(path: str) -> str:
    """The layer of a tracked file; a file no rule places is an error, never skipped."""
    if path.startswith(("tests/",)) or path == "conftest.py":
        return TESTS
    if path.startswith("benchmarks/"):
        return TOOLS
    if path.startswith(REHEARSAL_SITE):
        return TESTING
    name = module_name(path)
    if name is None:
        msg = f"{path}: no layer rule places this file; add it to tests/test_layers.py"
        raise AssertionError(msg)
    return layer_of_module(name, where=path)


def layer_of_module(name: str, *, where: str) -> str:
    if name == "r1_ascend" or any(_under(name, m) for m in BASE_MODULES):
        return BASE
    for prefix, layer in (
        ("r1_ascend.patches", PATCHES),
        ("r1_ascend.data", DATA),
        ("r1_ascend.recipe", RECIPE),
        ("r1_ascend.cpu", PLATFORM),
        ("r1_ascend.testing", TESTING),
    ):
        if _under(name, prefix):
            return layer
    if any(_under(name, m) for m in TOOL_MODULES):
        return TOOLS
    msg = f"{where}: module {name} is in no layer; add it to the layer table in tests/test_layers.py"
    raise AssertionError(msg)


def _is_private_name(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_owner(name: str) -> str | None:
    """The module a ``_private`` part of ``name`` belongs to (``a.b._c.d`` -> ``a.b``), or None if all public."""
    parts = name.split(".")
    for index, part in enumerate(parts):
        if _is_private_name(part):
            return ".".join(parts[:index])
    return None


def is_private_patches_module(name: str) -> bool:
    owner = private_owner(name)
    return owner is not None and _under(owner, "r1_ascend.patches")


def project_imports(path: str, source: str, known: set[str]) -> list[Edge]:
    """Every import of a project module in ``source`` (any depth), resolved to a dotted module name."""
    tree = ast.parse(source, filename=path)
    own = module_name(path) or ""
    is_package = path.endswith("__init__.py")
    edges = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = own.split(".") if is_package else own.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            # ``from pkg import sub`` imports the submodule ``pkg.sub`` when there is one; a ``_name`` taken from a
            # package counts as private to it whether it is a module or not.
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known or _is_private_name(a.name) else base
                for a in node.names
            ]
        else:
            continue
        edges += [Edge(path, node.lineno, name) for name in names if _under(name, "r1_ascend")]
    return edges


def violations(files: dict[str, str]) -> list[str]:
    """Rule breaks in ``files`` (path -> source) as messages."""
    known = {name for path in files if (name := module_name(path))}
    problems = []
    for path, source in sorted(files.items()):
        layer = layer_of_file(path)
        for edge in project_imports(path, source, known):
            target = layer_of_module(edge.imported, where=f"{path}:{edge.line}")
            problem = None
            if target not in ALLOWED[layer]:
                problem = f"{layer} may not import {target} ({edge.imported})"
            elif target == TESTING and layer not in (TESTING, TESTS):
                problem = f"production code may not import the test support ({edge.imported})"
            elif is_private_patches_module(edge.imported) and layer != PATCHES:
                problem = f"{edge.imported} is private to r1_ascend.patches; import a public module or name"
            elif (
                layer != TESTS
                and (owner := private_owner(edge.imported))
                and not _under(module_name(path) or "", owner)
            ):
                problem = f"{edge.imported} is private to {owner}; make it public there or move it to a shared module"
            if problem is not None:
                problems.append(f"{path}:{edge.line}: {problem}")
    return problems


def import_cycle(files: dict[str, str]) -> list[str] | None:
    """One cycle of imports among the project modules in ``files`` (``[a, b, a]``), or None.

    An import resolves to the module it names: ``from pkg.mod import name`` is an edge to ``pkg.mod`` (importing a
    submodule also runs its package's ``__init__``, which is no edge unless that file imports the submodule back)."""
    known = {name for path in files if (name := module_name(path))}
    graph: dict[str, set[str]] = {}
    for path, source in files.items():
        own = module_name(path)
        if own is None:
            continue
        targets = graph.setdefault(own, set())
        for edge in project_imports(path, source, known):
            target = edge.imported
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != own:
                targets.add(target)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as cycle:
        return list(cycle.args[1])
    return None


def _tracked_sources() -> dict[str, str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {path: (REPO / path).read_text(encoding="utf-8") for path in listed if (REPO / path).is_file()}


def test_every_import_follows_the_layers() -> None:
    files = _tracked_sources()
    assert "patches/_apply.py" in files, "git listed the wrong tree"
    assert "tests/test_layers.py" in files, "git listed the wrong tree"
    assert violations(files) == []


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        (
            "src/r1_ascend/launch/new.py",
            "from r1_ascend.patches._apply import resolve\n",
            "private to r1_ascend.patches",
        ),
        ("tests/launch/test_new.py", "from r1_ascend.patches import _apply\n", "private to r1_ascend.patches"),
        ("conftest.py", "def f():\n    from r1_ascend.patches._target import Target\n", "private"),
        ("patches/new.py", "from r1_ascend.launch import checks\n", "patches may not import tools"),
        ("src/r1_ascend/stack.py", "import r1_ascend.patches\n", "base may not import patches"),
        ("recipe/new.py", "from r1_ascend.launch.layout import x\n", "recipe may not import tools"),
        ("data/new.py", "from r1_ascend.recipe import checks\n", "data may not import recipe"),
        ("src/r1_ascend/doctor.py", "def f():\n    from r1_ascend.testing import npu_stub\n", "may not import testing"),
        ("patches/rules/new.py", "from ...launch import checks\n", "patches may not import tools"),
        ("recipe/new.py", "from r1_ascend.patches.rules import _hidden\n", "private to r1_ascend.patches"),
        (
            "src/r1_ascend/rehearse/new.py",
            "from r1_ascend.rehearse.run import _log\n",
            "private to r1_ascend.rehearse.run",
        ),
        ("src/r1_ascend/launch/new.py", "from r1_ascend.weights import _inner\n", "private to r1_ascend.weights"),
        ("recipe/new.py", "from .watchdog import _decide\n", "private to r1_ascend.recipe.watchdog"),
    ],
)
def test_a_forbidden_import_is_reported(path: str, source: str, expected: str) -> None:
    """The checker trips on each kind of rule break (so the test above can fail)."""
    files = {path: source, "src/r1_ascend/launch/checks.py": "", "patches/rules/__init__.py": ""}
    problems = violations(files)
    assert any(expected in problem for problem in problems), problems


def test_allowed_imports_are_not_reported() -> None:
    files = {
        "src/r1_ascend/launch/new.py": "from r1_ascend.patches.rules.dp_layout import rollout_dp_size\n",
        "recipe/new.py": "from r1_ascend.data import files\nfrom r1_ascend import envs\n",
        "patches/new.py": "from ._apply import apply_all\nfrom r1_ascend import envs\n",
        "tests/patches/test_new.py": "from r1_ascend.patches.impl import dp_net\n",
        "src/r1_ascend/rehearse/site/sitecustomize.py": "from r1_ascend.testing import npu_stub\n",
        "src/r1_ascend/weights/__init__.py": "from r1_ascend.weights._inner import x\n",  # its own private module
        "src/r1_ascend/weights/_inner.py": "from r1_ascend.weights._inner import _y\n",  # a module's own private name
        "src/r1_ascend/envs.py": "",
        "data/files.py": "",
    }
    assert violations(files) == []


def test_no_import_cycle() -> None:
    assert import_cycle(_tracked_sources()) is None


@pytest.mark.parametrize(
    "files",
    [
        {"src/r1_ascend/a.py": "from r1_ascend import b\n", "src/r1_ascend/b.py": "import r1_ascend.a\n"},
        # a dispatch import inside a function closes the cycle too
        {
            "src/r1_ascend/a.py": "def f():\n    from r1_ascend.b import g\n",
            "src/r1_ascend/b.py": "from r1_ascend.a import f\n",
        },
        {
            "src/r1_ascend/r/a.py": "from r1_ascend.r.b import x\n",
            "src/r1_ascend/r/b.py": "from .c import y\n",
            "src/r1_ascend/r/c.py": "from r1_ascend.r import a\n",
        },
        {
            "src/r1_ascend/report/x.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from r1_ascend.report.y import Y\n"
            ),
            "src/r1_ascend/report/y.py": "from r1_ascend.report.x import X\n",
        },
    ],
)
def test_an_import_cycle_is_reported(files: dict[str, str]) -> None:
    cycle = import_cycle(files)
    assert cycle is not None
    assert cycle[0] == cycle[-1]
    assert len(cycle) == len(files) + 1


def test_imports_without_a_cycle_are_not_reported() -> None:
    files = {
        "src/r1_ascend/r/__init__.py": "",
        "src/r1_ascend/r/run.py": "from r1_ascend.r import cluster, verdicts\n",
        "src/r1_ascend/r/cluster.py": "from r1_ascend.r.progress import log\n",
        "src/r1_ascend/r/verdicts.py": "from r1_ascend.r.progress import log\nfrom r1_ascend.r import cluster\n",
        "src/r1_ascend/r/progress.py": "import r1_ascend\n",
    }
    assert import_cycle(files) is None


def test_an_unplaced_file_is_an_error() -> None:
    with pytest.raises(AssertionError, match="no layer rule places"):
        violations({"scripts/new_tool.py": ""})
