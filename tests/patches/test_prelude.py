"""The prelude applies every patch once per process and reaches the driver, verl's workers and vLLM processes."""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from r1_ascend.patches import PATCHES, PatchConfigError, PatchTargetError, applied_names

REPO_ROOT = Path(__file__).resolve().parents[2]
STUB_SITE = REPO_ROOT / "tests" / "sitecustomize_npu"
ALL = [spec.name for spec in PATCHES]


def _fresh_prelude(monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.delitem(sys.modules, "r1_ascend.patches.prelude", raising=False)
    return importlib.import_module("r1_ascend.patches.prelude")


def test_import_applies_every_patch_and_logs_one_line(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    _fresh_prelude(monkeypatch)
    assert applied_names() == ALL
    err = capfd.readouterr().err
    assert err.count("r1-ascend overlay (pid") == 1
    assert f"applied={','.join(ALL)}" in err


def test_broken_upstream_target_makes_the_prelude_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    """A renamed upstream attribute stops the process at import, naming the target and the switch."""
    from vllm.v1.engine.core import EngineCore

    monkeypatch.setattr(EngineCore, "_initialize_kv_caches_renamed", EngineCore._initialize_kv_caches, raising=False)
    monkeypatch.delattr(EngineCore, "_initialize_kv_caches")
    with pytest.raises(PatchTargetError) as info:
        _fresh_prelude(monkeypatch)
    assert "vllm.v1.engine.core.EngineCore._initialize_kv_caches not found" in str(info.value)
    assert "R1_ASCEND_DISABLE=vllm_engine_kv_cache_configs" in str(info.value)
    assert "r1_ascend.patches.prelude" not in sys.modules


def test_disabled_patch_leaves_its_target_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.engine.core import EngineCore

    original = EngineCore.__dict__["_initialize_kv_caches"]
    monkeypatch.setenv("R1_ASCEND_DISABLE", "vllm_engine_kv_cache_configs")
    _fresh_prelude(monkeypatch)
    assert EngineCore.__dict__["_initialize_kv_caches"] is original
    assert "vllm_engine_kv_cache_configs" not in applied_names()


def test_log_level_switch_sets_the_r1_ascend_loggers(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """R1_ASCEND_LOG_LEVEL is applied to the package logger; at ERROR the summary line is not printed."""
    package_logger = logging.getLogger("r1_ascend")
    before = package_logger.level
    monkeypatch.setenv("R1_ASCEND_LOG_LEVEL", "error")
    try:
        _fresh_prelude(monkeypatch)
        assert package_logger.level == logging.ERROR
        assert not logging.getLogger("r1_ascend.patches.impl.rollout_vllm").isEnabledFor(logging.WARNING)
    finally:
        package_logger.setLevel(before)
    assert applied_names() == ALL
    assert "r1-ascend overlay (pid" not in capfd.readouterr().err


def test_bad_log_level_is_an_error_naming_the_valid_levels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("R1_ASCEND_LOG_LEVEL", "LOUD")
    with pytest.raises(PatchConfigError, match=r"R1_ASCEND_LOG_LEVEL='LOUD' is not a log level; use one of DEBUG"):
        _fresh_prelude(monkeypatch)
    assert applied_names() == []


def _run_child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    child_env = {**os.environ, "PYTHONPATH": str(STUB_SITE), **env}
    child_env.pop("R1_ASCEND_DISABLE", None)
    return subprocess.run(
        [sys.executable, "-c", code], env=child_env, capture_output=True, text=True, timeout=180, check=False
    )


def test_the_prelude_imports_nothing_to_patch_and_the_driver_no_vllm() -> None:
    """In a fresh process like the driver's: the prelude imports no upstream package and every target waits;
    verl's ``main_ppo`` (all the driver imports) replaces the trainer's targets and still imports no vLLM, whose
    own targets are replaced when the process imports it."""
    code = """
import sys
import r1_ascend.patches.prelude
from r1_ascend.patches import PATCHES, installed_targets, patched_by, waiting_targets
upstream = ("torch", "verl", "vllm", "vllm_ascend", "megatron")
assert not [m for m in upstream if m in sys.modules], [m for m in upstream if m in sys.modules]
assert installed_targets() == [], installed_targets()
declared = sorted(t.path for spec in PATCHES for t in spec.targets)
assert sorted(waiting_targets()) == declared, waiting_targets()
import verl.trainer.main_ppo
assert "vllm" not in sys.modules
assert "verl.trainer.ppo.ray_trainer.RayPPOTrainer.fit" in installed_targets()
import vllm.v1.sample.sampler as sampler
assert patched_by(sampler.Sampler.forward) == "verl_rollout_guard"
print("ok")
"""
    done = _run_child(code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok")


REPORT = "from r1_ascend.patches import applied_names; print('APPLIED', ','.join(applied_names()))"


@pytest.mark.slow
def test_verl_external_modules_hook_applies_the_overlay_in_a_new_process() -> None:
    """What every Ray worker does: `import verl` with VERL_USE_EXTERNAL_MODULES naming the prelude."""
    result = _run_child(f"import verl; {REPORT}", VERL_USE_EXTERNAL_MODULES="r1_ascend.patches.prelude")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"APPLIED {','.join(ALL)}" in result.stdout
    assert result.stderr.count("r1-ascend overlay (pid") == 1


@pytest.mark.slow
def test_vllm_general_plugin_applies_the_overlay_in_a_vllm_process() -> None:
    """What a process started by vLLM does: load the general plugins, one of which is ours."""
    names = [ep.name for ep in metadata.entry_points(group="vllm.general_plugins")]
    assert "r1_ascend_patches" in names
    result = _run_child(f"from vllm.plugins import load_general_plugins; load_general_plugins(); {REPORT}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"APPLIED {','.join(ALL)}" in result.stdout
