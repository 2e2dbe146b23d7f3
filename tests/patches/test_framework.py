"""The patch framework: strict targets, originals kept, idempotent, switchable, loud on drift."""

from __future__ import annotations

import sys
import types
from types import MappingProxyType

import pytest

from r1_ascend.patches import (
    PatchConfigError,
    PatchSpec,
    PatchTargetError,
    PatchVersionError,
    Status,
    Target,
    apply_all,
    get_original,
    install,
    patched_by,
)
from r1_ascend.stack import installed_version

FAKE = "r1_ascend_fake_upstream"


def _original_greet(self, name):
    return f"hello {name}"


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A small upstream module: a class with a method, a registry dict and a re-export alias."""
    module = types.ModuleType(FAKE)
    module.Greeter = type("Greeter", (), {"greet": _original_greet})
    module.REGISTRY = {("vllm", "sync"): "stock.Rollout"}
    alias_module = types.ModuleType(f"{FAKE}_alias")
    alias_module.greet = module.Greeter.greet
    monkeypatch.setitem(sys.modules, FAKE, module)
    monkeypatch.setitem(sys.modules, f"{FAKE}_alias", alias_module)
    return module


def _greet_target(**kw: object) -> Target:
    return Target(FAKE, "Greeter.greet", "verl", params=("self", "name"), **kw)  # type: ignore[arg-type]


def _shout(original):
    def greet(self, name):
        return original(self, name).upper()

    return greet


class TestInstall:
    def test_replaces_marks_and_keeps_original(self, upstream: types.ModuleType) -> None:
        """The replacement is bound, carries the patch name, and the original stays reachable."""
        target = _greet_target()
        install("demo", target, _shout)
        assert upstream.Greeter().greet("npu") == "HELLO NPU"
        assert patched_by(upstream.Greeter.greet) == "demo"
        assert get_original(target) is _original_greet

    def test_is_idempotent(self, upstream: types.ModuleType) -> None:
        """Installing the same patch twice neither wraps the wrapper nor changes the binding."""
        target = _greet_target()
        first = install("demo", target, _shout)
        second = install("demo", target, _shout)
        assert first is second is upstream.Greeter.greet
        assert upstream.Greeter().greet("x") == "HELLO X"

    def test_missing_target_names_target_versions_and_switch(self, upstream: types.ModuleType) -> None:
        """A renamed upstream attribute raises with the target, both versions and how to disable."""
        del upstream.Greeter.greet
        upstream.Greeter.greet_v2 = _original_greet
        with pytest.raises(PatchTargetError) as info:
            install("demo", _greet_target(), _shout)
        message = str(info.value)
        assert f"{FAKE}.Greeter.greet not found" in message
        assert f"Installed verl: {installed_version('verl')}" in message
        assert "written for verl 0.6.1" in message
        assert "R1_ASCEND_DISABLE=demo" in message

    def test_signature_drift_is_an_error(self, upstream: types.ModuleType) -> None:
        """A changed parameter list is reported with expected and found parameters."""
        upstream.Greeter.greet = lambda self, name, loud: name
        with pytest.raises(PatchTargetError, match=r"drifted: expected \(self, name\), found \(self, name, loud\)"):
            install("demo", _greet_target(), _shout)
        assert patched_by(upstream.Greeter.greet) is None

    def test_inherited_attribute_counts_as_moved(self, upstream: types.ModuleType) -> None:
        """A method now defined on a base class is drift, not something to patch on the subclass."""
        base = upstream.Greeter
        upstream.Greeter = type("Greeter", (base,), {})
        with pytest.raises(PatchTargetError, match="not found"):
            install("demo", _greet_target(), _shout)

    def test_dict_entry_requires_existing_key(self, upstream: types.ModuleType) -> None:
        """Registry entries are replaced only when the key exists (no silent new key)."""
        target = Target(FAKE, "REGISTRY", "verl", key=("vllm", "sync"))
        install("demo", target, lambda original: "ours.Rollout")
        assert upstream.REGISTRY[("vllm", "sync")] == "ours.Rollout"
        assert get_original(target) == "stock.Rollout"
        del upstream.REGISTRY[("vllm", "sync")]
        missing = Target(FAKE, "REGISTRY", "verl", key=("vllm", "spmd"))
        with pytest.raises(PatchTargetError, match=r"\('vllm', 'spmd'\)\] not found"):
            install("other", missing, lambda original: "x")

    def test_aliases_are_rebound_by_identity(self, upstream: types.ModuleType) -> None:
        """A re-exported copy of the target is rebound too, and restored afterwards."""
        alias_module = sys.modules[f"{FAKE}_alias"]
        target = _greet_target(aliases=(f"{FAKE}_alias:greet",))
        replacement = install("demo", target, _shout)
        assert alias_module.greet is replacement
        from r1_ascend.patches import restore_all

        restore_all()
        assert alias_module.greet is _original_greet
        assert upstream.Greeter.greet is _original_greet

    def test_alias_pointing_elsewhere_is_an_error(self, upstream: types.ModuleType) -> None:
        """If upstream stopped re-exporting the same object, the alias check fails loudly."""
        sys.modules[f"{FAKE}_alias"].greet = lambda self, name: name
        with pytest.raises(PatchTargetError, match="no longer refers"):
            install("demo", _greet_target(aliases=(f"{FAKE}_alias:greet",)), _shout)

    def test_two_patches_cannot_claim_one_target(self, upstream: types.ModuleType) -> None:
        install("demo", _greet_target(), _shout)
        with pytest.raises(PatchTargetError, match="already replaced by patch 'demo'"):
            install("other", _greet_target(), _shout)


def _demo_spec(name: str = "demo_patch", requires: dict[str, str] | None = None) -> PatchSpec:
    return PatchSpec(
        name=name,
        targets=(_greet_target(),),
        requires=MappingProxyType(requires if requires is not None else {"verl": "0.6.1"}),
        processes=("worker",),
    )


@pytest.fixture
def demo_patch_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType("r1_ascend.patches.demo_patch")

    def apply(spec: PatchSpec) -> None:
        install(spec.name, spec.target("Greeter.greet"), _shout)

    module.apply = apply
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


class TestApplyAll:
    def test_applies_once_and_reports(self, upstream: types.ModuleType, demo_patch_module: object) -> None:
        specs = (_demo_spec(),)
        assert [r.status for r in apply_all([], specs=specs)] == [Status.APPLIED]
        assert [r.status for r in apply_all([], specs=specs)] == [Status.ALREADY_APPLIED]
        assert upstream.Greeter().greet("a") == "HELLO A"

    def test_disabled_patch_leaves_target_untouched(
        self, upstream: types.ModuleType, demo_patch_module: object
    ) -> None:
        results = apply_all(["demo_patch"], specs=(_demo_spec(),))
        assert [r.status for r in results] == [Status.DISABLED]
        assert upstream.Greeter.greet is _original_greet

    def test_disable_all_switch(self, upstream: types.ModuleType, demo_patch_module: object) -> None:
        results = apply_all(disable_all=True, specs=(_demo_spec(),))
        assert [r.status for r in results] == [Status.DISABLED]
        assert upstream.Greeter.greet is _original_greet

    def test_switches_come_from_the_environment(
        self, upstream: types.ModuleType, demo_patch_module: object, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("R1_ASCEND_DISABLE", " demo_patch , ")
        assert [r.status for r in apply_all(specs=(_demo_spec(),))] == [Status.DISABLED]
        monkeypatch.delenv("R1_ASCEND_DISABLE")
        monkeypatch.setenv("R1_ASCEND_DISABLE_ALL", "1")
        assert [r.status for r in apply_all(specs=(_demo_spec(),))] == [Status.DISABLED]

    def test_unknown_disable_name_is_an_error(self, demo_patch_module: object) -> None:
        with pytest.raises(PatchConfigError, match=r"unknown patch name\(s\) in R1_ASCEND_DISABLE: demo_pach"):
            apply_all(["demo_pach"], specs=(_demo_spec(),))

    def test_version_mismatch_is_an_error(self, upstream: types.ModuleType, demo_patch_module: object) -> None:
        spec = _demo_spec(requires={"verl": "0.5.0"})
        with pytest.raises(PatchVersionError, match=r"written for verl==0.5.0, but verl is 0.6.1.*demo_patch"):
            apply_all([], specs=(spec,))
        assert upstream.Greeter.greet is _original_greet
