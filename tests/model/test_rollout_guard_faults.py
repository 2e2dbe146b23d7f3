"""The rollout guard on the real model path: healthy steps never warn at the levels a run calibrates, each planted
fault is stopped at the step it was planted in, refused with the engine's configuration before the first step, or
written down as not separable with its reason; every weight or layout fault is stopped by the weight-sync check at
its sync (the bench records the check's verdict and measures the guard on the same step anyway), and no healthy sync
trips it.

One process of ``benchmarks/rollout_guard_bench.py`` (megatron-core's DeepSeek-V3 actor from the converted
checkpoint, verl's weight export, the CPU rollout engine, a GRPO update per step), judged at the shipped settings
(``r1_ascend.rehearse.config.guard_config``: the 671B config's absolute levels as caps, calibrated over the first
steps): the faults are planted in the first step after calibration and judged at the levels calibrated from the
healthy steps before it. The separation figures are in docs/rollout_guard.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from r1_ascend.patches.rules import rollout_guard as guard
from r1_ascend.rehearse import rollout_faults
from r1_ascend.rehearse.config import guard_config
from r1_ascend.rehearse.guard_calibration import stats_from_partials

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
#: The shipped settings (the 671B config's), which the rehearsal runs with.
SETTINGS = guard_config()
#: The first step gated at calibrated levels; the healthy steps go on past it so that gated healthy steps are judged.
FAULT_STEP = SETTINGS.calibration.steps + 1
HEALTHY_STEPS = FAULT_STEP + 2
#: Also planted on a loop of its own (no snapshot): its step must equal the branched one. It replaces a module of
#: the engine (the rope), the hardest change for the snapshot to put back.
FRESH = "yarn-off"
#: Faults of the engine's configuration: refused with the engine's configuration before the first step (patch
#: verl_rollout_model_config), whatever the guard sees of them planted in a built engine.
ENGINE_CONFIG = sorted(name for name, fault in rollout_faults.FAULTS.items() if fault.engine_overrides is not None)
#: Faults whose effect on this tiny model is within a few times bf16 noise, and why (docs/rollout_guard.md); the
#: weight faults among them are stopped by the weight-sync check (test_every_weight_fault_is_stopped_by_the_check).
NOT_SEPARABLE = {
    **{
        name: "one random expert adds about 1 % of the residual stream's norm to the tokens routed to it, so a fault "
        "in its weights moves the log-probs by 1.1-8.8x the healthy bf16 maximum (docs/rollout_guard.md)"
        for name in ("expert-swap", "expert-transposed", "expert-negated")
    },
}
#: Faults planted with the weight-sync check, in the layer their class lives in: judged here by the check only (the
#: guard's separation of them is not measured; docs/rollout_guard.md).
CHECKED_ONLY = {
    "previous-sync-sent",
    "bias-missing",
    "converter-gate-up",
    "converter-mla-norm",
    "expert-transposed-load",
    "moe-loader-dropped",
    "expert-transposed-resume",
}
#: The faults of the bench (one rank: those that need a wider world are planted in test_weight_sync_check.py).
BENCHED = {name for name, fault in rollout_faults.FAULTS.items() if fault.needs is None}


@pytest.fixture(scope="module")
def measured(converted: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("guard") / "records.json"
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "rollout_guard_bench.py"),
        "--weights",
        str(converted),
        "--seeds",
        "0",
        "--dtypes",
        "bf16",
        "--steps",
        str(HEALTHY_STEPS),
        "--fault-step",
        str(FAULT_STEP),
        "--fresh",
        FRESH,
        "--json",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800, env=dict(os.environ))
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return json.loads(out.read_text(encoding="utf-8"))


def _stats(record: dict) -> guard.DiffStats:
    return stats_from_partials(record["partials"])


def _healthy(measured: list[dict]) -> list[tuple[int, guard.DiffStats]]:
    return sorted((r["step"], _stats(r)) for r in measured if r["kind"] == "healthy")


def _levels(measured: list[dict]) -> guard.Levels:
    """The levels the run has in force at the fault's step: calibrated from the healthy steps before it."""
    before = [(step, stats) for step, stats in _healthy(measured) if step < FAULT_STEP]
    levels = guard.GuardState.after(before, SETTINGS).levels(SETTINGS)
    assert levels.calibrated, "the faults are judged at calibrated levels"
    return levels


def test_a_branched_fault_equals_the_fault_planted_on_a_loop_of_its_own(measured: list[dict]) -> None:
    """The bench plants each fault on a snapshot of one loop after the healthy steps before it
    (guard_calibration.branched); the same fault planted after its own healthy steps gives the same step, bit for
    bit (the bench itself checks that a fault planted again after all the others repeats exactly)."""
    (branched,) = [r for r in measured if r["kind"] == "fault" and r["fault"] == FRESH]
    (fresh,) = [r for r in measured if r["kind"] == "fresh" and r["fault"] == FRESH]
    assert fresh["step"] == branched["step"] == FAULT_STEP
    assert fresh["partials"] == branched["partials"]
    assert fresh["reward"] == branched["reward"]


def test_healthy_steps_never_warn(measured: list[dict]) -> None:
    """Judged as a run judges them (calibration, then the calibrated levels, escalation): none warns."""
    healthy = _healthy(measured)
    assert [step for step, _ in healthy] == list(range(1, HEALTHY_STEPS + 1))
    state = guard.GuardState()
    gated = 0
    for step, stats in healthy:
        assert stats.mean > 0, "bf16 on both sides: never exactly equal"
        verdict = state.judge(stats, SETTINGS, step=step, in_update=False)
        assert not verdict.warned, (step, verdict.describe(verdict.warned, "warn"))
        gated += verdict.levels.calibrated
    assert gated == HEALTHY_STEPS - SETTINGS.calibration.steps >= 2


def test_engine_configuration_faults_are_refused_before_the_first_step(converted: Path) -> None:
    """The engine built with the fault's hf_overrides, as the run's config gives them, against the actor's config
    from the same checkpoint: the model-configuration check refuses it, naming the field."""
    from transformers import AutoConfig

    from r1_ascend.cpu.engine import with_hf_overrides
    from r1_ascend.patches import RolloutModelConfigError
    from r1_ascend.patches.verl_rollout_model_config import check_configs

    hf_dir = converted / "hf-bf16"
    raw = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    assert ENGINE_CONFIG == ["routing-ungrouped", "yarn-off"]
    for name in ENGINE_CONFIG:
        overrides = rollout_faults.get(name).engine_overrides(raw)
        engine = with_hf_overrides(AutoConfig.from_pretrained(str(hf_dir)), overrides)
        with pytest.raises(RolloutModelConfigError, match="|".join(f"{field}: actor" for field in overrides)):
            check_configs(AutoConfig.from_pretrained(str(hf_dir)), engine)
    check_configs(AutoConfig.from_pretrained(str(hf_dir)), AutoConfig.from_pretrained(str(hf_dir)))


@pytest.mark.parametrize(
    "fault",
    sorted(BENCHED - set(NOT_SEPARABLE) - CHECKED_ONLY - set(ENGINE_CONFIG)),
)
def test_planted_fault_is_stopped_at_its_step(measured: list[dict], fault: str) -> None:
    """At the levels calibrated over the healthy steps before it (seeds 0-4 of the bench: docs/rollout_guard.md)."""
    (record,) = [r for r in measured if r["kind"] == "fault" and r["fault"] == fault]
    assert record["step"] == FAULT_STEP
    stats = _stats(record)
    with pytest.raises(guard.RolloutActorMismatchError, match=f"at training step {FAULT_STEP} "):
        guard.check(stats, _levels(measured), step=FAULT_STEP, in_update=True)


@pytest.mark.parametrize("fault", sorted(NOT_SEPARABLE))
def test_not_separable_faults_are_written_down(measured: list[dict], fault: str) -> None:
    """Each such fault is named with its reason in the guard's docs, and measured at its step; the weight-sync check
    stops it (below)."""
    docs = (REPO / "docs" / "rollout_guard.md").read_text(encoding="utf-8")
    assert f"`{fault}`" in docs
    (record,) = [r for r in measured if r["kind"] == "fault" and r["fault"] == fault]
    assert record["step"] == FAULT_STEP


@pytest.mark.parametrize("fault", sorted(n for n in BENCHED if rollout_faults.get(n).where != "config"))
def test_every_weight_fault_is_stopped_by_the_check(measured: list[dict], fault: str) -> None:
    """Every weight or layout fault (among them the expert faults the guard cannot separate here) is stopped by the
    weight-sync check in the sync of its step, naming a tensor. Seeds 0-4 and the wider worlds:
    tests/model/test_weight_sync_check.py."""
    (record,) = [r for r in measured if r["kind"] == "fault" and r["fault"] == fault]
    assert record["step"] == FAULT_STEP
    stopped = record["weight_check"]
    assert stopped is not None, f"{fault}: the weight-sync check passed its sync"
    assert re.search(r"weight sync \d+ is wrong on 1 of 1 ranks", stopped), stopped[:300]
    assert re.search(r"model\.(layers\.\d+\.)?\S+\.weight|e_score_correction_bias|lm_head\.weight", stopped)


def test_healthy_syncs_pass_the_weight_check(measured: list[dict]) -> None:
    assert [r["weight_check"] for r in measured if r["kind"] == "healthy"] == [None] * HEALTHY_STEPS


def test_every_fault_is_documented() -> None:
    """A new fault needs its row in the docs' table."""
    docs = (REPO / "docs" / "rollout_guard.md").read_text(encoding="utf-8")
    for name in rollout_faults.FAULTS:
        assert f"`{name}`" in docs, name
