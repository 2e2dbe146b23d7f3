"""Every registered patch refuses a drifted upstream with the documented error, and installs nothing then.

Drift is simulated on the real installed upstream (the target is removed from its owner, or its registry key),
for each target of each patch in turn: the error must name the target, the installed and the expected version
and the switch that disables the patch, and no other target of that patch may have been replaced.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

from r1_ascend.patches import PATCHES, PatchTargetError, Target, apply_one, installed_targets, resolve_owner
from r1_ascend.stack import installed_version, pins

CASES = [(spec, target) for spec in PATCHES for target in spec.targets]


def _remove_target(target: Target, patch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    owner, name = resolve_owner(target, patch=patch)
    if target.is_dict_entry:
        monkeypatch.delitem(getattr(owner, name), target.key)
    elif inspect.isclass(owner) or inspect.ismodule(owner):
        monkeypatch.delattr(owner, name)
    else:  # pragma: no cover - every declared target lives on a class or a module
        pytest.fail(f"cannot simulate drift of {target.path}")


@pytest.mark.parametrize(("spec", "target"), CASES, ids=[f"{s.name}:{t.attribute}" for s, t in CASES])
def test_missing_target_is_the_documented_error_and_nothing_is_installed(
    spec: object, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    importlib.import_module(target.module)
    _remove_target(target, spec.name, monkeypatch)

    with pytest.raises(PatchTargetError) as info:
        apply_one(spec)

    message = str(info.value)
    assert f"{target.path} not found" in message
    assert f"Installed {target.distribution}: {installed_version(target.distribution)}" in message
    assert f"written for {target.distribution} {pins()['packages'][target.distribution]}" in message
    assert f"R1_ASCEND_DISABLE={spec.name}" in message
    assert installed_targets(spec.name) == []


@pytest.mark.parametrize(
    ("spec", "target"),
    [(s, t) for s, t in CASES if t.params is not None],
    ids=[f"{s.name}:{t.attribute}" for s, t in CASES if t.params is not None],
)
def test_signature_drift_is_the_documented_error_and_nothing_is_installed(
    spec: object, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    importlib.import_module(target.module)
    owner, name = resolve_owner(target, patch=spec.name)

    def drifted(*, renamed_parameter: object = None) -> None:
        """Stands in for an upstream function whose parameters changed."""

    monkeypatch.setattr(owner, name, drifted)

    with pytest.raises(PatchTargetError) as info:
        apply_one(spec)

    message = str(info.value)
    assert f"signature of {target.path} drifted: expected ({', '.join(target.params)}), found (renamed_parameter)" in (
        message
    )
    assert f"R1_ASCEND_DISABLE={spec.name}" in message
    assert installed_targets(spec.name) == []
