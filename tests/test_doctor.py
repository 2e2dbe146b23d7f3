"""`r1-ascend doctor` reports the stack, the environment and every patch target, and fails on drift."""

from __future__ import annotations

import dataclasses

import pytest

from r1_ascend import doctor
from r1_ascend.patches import PATCHES, Target


def test_all_patches_applicable_on_the_cpu_environment(capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    for spec in PATCHES:
        assert f"[ok  ] {spec.name}" in out
    assert "all checks passed" in out


def test_signature_drift_is_reported_and_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = PATCHES[0]
    drifted_target = dataclasses.replace(spec.targets[0], params=("self", "vllm_config", "extra"))
    drifted = (dataclasses.replace(spec, targets=(drifted_target,)), *PATCHES[1:])
    monkeypatch.setattr("r1_ascend.patches.PATCHES", drifted)
    assert doctor.main([]) == 1
    captured = capsys.readouterr()
    assert f"[FAIL] {spec.name}" in captured.out
    assert "signature drifted" in captured.err


def test_missing_registry_key_is_reported(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    wrong = Target("verl.workers.rollout.base", "_ROLLOUT_REGISTRY", "verl", key=("vllm", "spmd"))
    spec = dataclasses.replace(PATCHES[0], targets=(wrong,))
    monkeypatch.setattr("r1_ascend.patches.PATCHES", (spec,))
    assert doctor.main([]) == 1
    assert "key ('vllm', 'spmd') missing" in capsys.readouterr().out


def test_unpinned_version_fails(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("r1_ascend.stack.installed_version", lambda dist: "9.9.9" if dist == "verl" else None)
    assert doctor.main([]) == 1
    assert "verl" in capsys.readouterr().err


@pytest.mark.slow
def test_import_mode_resolves_targets_at_run_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert doctor.main(["--import"]) == 0
    assert "resolves at run time" in capsys.readouterr().out


@pytest.mark.slow
def test_import_mode_reports_drift_with_versions_and_switch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under --import a drifted target fails with the installer's message: versions and the disable switch."""
    spec = PATCHES[0]
    drifted_target = dataclasses.replace(spec.targets[0], params=("self", "vllm_config", "extra"))
    monkeypatch.setattr("r1_ascend.patches.PATCHES", (dataclasses.replace(spec, targets=(drifted_target,)),))
    assert doctor.main(["--import"]) == 1
    captured = capsys.readouterr()
    assert f"[FAIL] {spec.name}" in captured.out
    assert f"signature of {drifted_target.path} drifted" in captured.err
    assert "Installed vllm: 0.9.1; the patch was written for vllm 0.9.1" in captured.err
    assert f"R1_ASCEND_DISABLE={spec.name}" in captured.err
