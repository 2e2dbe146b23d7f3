"""``r1-ascend rehearse --fault dead-expert | stale-bias``: MoE faults the expert verdicts must catch.

The fast tests feed the fault run's judge recorded runs (caught, missed, caught without naming the fault); the slow
ones plant each fault in the real run. ``stale-bias`` runs there with the weight-sync check off, so that the
rehearsal's own bias check is what must catch it: the check's stop of a sync in verl's loop is proven once by
test_rehearse_rollout_fault.py, and of this fault at the model level, in seeds 0-4, by
tests/model/test_weight_sync_check.py.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from r1_ascend.rehearse import moe_fault_run as moe
from r1_ascend.rehearse.config import Plan
from r1_ascend.rehearse.faults import FaultError

pytestmark = pytest.mark.machine

LAYER, EXPERT = moe.DEAD_EXPERT


def records(dead: bool = False, stale: bool = False, steps: int = 3) -> list[dict]:
    """One worker's records: a sync then an update per step; the bias moves 0.01 per update."""

    def bias(step: int) -> dict[str, list[float]]:
        values = [0.2 + 0.01 * step * (-1) ** e for e in range(4)]
        if dead:
            values[EXPERT] = -math.inf
        return {str(LAYER): values}

    events, t = [], 0.0
    for step in range(1, steps + 1):
        t += 1
        synced = bias(0) if stale and step >= 2 else bias(step - 1)
        events.append({"t": t, "pid": 7, "event": "engine_bias", "bias": synced})
        tokens = [10.0, 10.0, 10.0, 10.0]
        if dead:
            tokens[EXPERT] = 0.0
        t += 1
        events.append(
            {
                "t": t,
                "pid": 7,
                "event": "expert_load",
                "step": step,
                "ep": 2,
                "tokens": {str(LAYER): tokens},
                "bias": bias(step),
            }
        )
    return events


def test_plans_are_three_steps_and_plant_the_named_fault() -> None:
    dead = moe.plan_for("dead-expert", Plan())
    stale = moe.plan_for("stale-bias", Plan())
    assert (dead.total_steps, dead.min_reward_rise) == (3, None)
    assert dead.actor_fault == f"dead-expert@{LAYER}:{EXPERT}"
    assert dead.rollout_fault is None
    assert stale.rollout_fault == "stale-bias@2"
    assert stale.actor_fault is None
    with pytest.raises(ValueError, match="unknown MoE fault"):
        moe.plan_for("hang", Plan())


def test_a_dead_expert_caught_by_the_verdict_that_names_it_passes(tmp_path: Path) -> None:
    outcome = moe.judge_moe_fault("dead-expert", 0, "", records(dead=True), tmp_path / "run1.log")
    assert outcome["caught_by"] == "expert verdicts"
    assert f"layer {LAYER}: expert {EXPERT}" in outcome["message"]


def test_a_stale_bias_is_caught_with_its_drift_per_step(tmp_path: Path) -> None:
    outcome = moe.judge_moe_fault("stale-bias", 0, "", records(stale=True), tmp_path / "run1.log", weight_check=False)
    assert outcome["caught_by"] == "expert verdicts"
    assert "differs from the actor's" in outcome["message"]
    assert [d["after_update_of_step"] for d in outcome["bias_drift_per_step"]] == [1, 2]
    assert [d["engine_vs_actor"] for d in outcome["bias_drift_per_step"]] == pytest.approx([0.01, 0.02])


def test_a_stale_bias_stopped_by_the_guard_passes(tmp_path: Path) -> None:
    line = "rollout guard: at training step 3 the rollout disagrees: beyond the stop level: rollout_guard/x = 1; over"
    outcome = moe.judge_moe_fault("stale-bias", 1, line, records(stale=True), tmp_path / "run1.log", weight_check=False)
    assert (outcome["caught_by"], outcome["step"]) == ("rollout guard", 3)


def _check_stop(sync: int, tensor: str) -> str:
    """The weight-sync check's error line (patch verl_weight_sync_check) for one tensor of one sync."""
    return (
        f"r1_ascend.patches._errors.WeightSyncError: weight sync {sync} is wrong on 2 of 2 ranks (6 mismatches); "
        f"nothing was generated from it. First: rank 0, sync {sync}: {tensor} -> share 0 (cols 0:16): the rollout "
        "received other values than the actor's own shards predict: fingerprint expected proj 0.1\nnext line"
    )


def test_a_stale_bias_stopped_by_the_weight_check_at_its_sync_passes(tmp_path: Path) -> None:
    bias = f"model.layers.{LAYER}.mlp.gate.e_score_correction_bias"
    outcome = moe.judge_moe_fault("stale-bias", 1, _check_stop(moe.STALE_FROM_SYNC, bias), [], tmp_path / "r.log")
    assert (outcome["caught_by"], outcome["sync"], outcome["named"]) == (
        "weight-sync check",
        moe.STALE_FROM_SYNC,
        bias,
    )
    assert outcome["message"].endswith("expected proj 0.1"), "one line of the error"


@pytest.mark.parametrize(
    ("code", "sync", "tensor", "match"),
    [
        (1, moe.STALE_FROM_SYNC + 1, "model.layers.2.mlp.gate.e_score_correction_bias", "stopped weight sync 3"),
        (1, moe.STALE_FROM_SYNC, "model.layers.2.mlp.gate.weight", "naming model.layers.2.mlp.gate.weight"),
        (0, moe.STALE_FROM_SYNC, "model.layers.2.mlp.gate.e_score_correction_bias", "did not stop"),
    ],
)
def test_with_the_weight_check_on_a_stale_bias_must_be_its_stop_at_the_planted_sync(
    tmp_path: Path, code: int, sync: int, tensor: str, match: str
) -> None:
    with pytest.raises(FaultError, match=match):
        moe.judge_moe_fault("stale-bias", code, _check_stop(sync, tensor), records(stale=True), tmp_path / "r.log")
    with pytest.raises(FaultError, match="did not stop"):
        moe.judge_moe_fault("stale-bias", 0, "", records(stale=True), tmp_path / "r.log")


@pytest.mark.parametrize("name", ["dead-expert", "stale-bias"])
def test_a_fault_that_passes_every_verdict_fails_the_rehearsal(tmp_path: Path, name: str) -> None:
    with pytest.raises(FaultError, match="passed every expert verdict"):
        moe.judge_moe_fault(name, 0, "", records(), tmp_path / "run1.log", weight_check=False)


def test_a_crash_is_not_a_catch(tmp_path: Path) -> None:
    with pytest.raises(FaultError, match="not by a check naming it"):
        moe.judge_moe_fault("dead-expert", 1, "Traceback ...", records(dead=True), tmp_path / "run1.log")


def test_a_failure_that_does_not_name_the_fault_is_not_a_catch(tmp_path: Path) -> None:
    """A dead-expert run that fails on the engine's bias instead is a different fault."""
    with pytest.raises(FaultError, match="without naming it"):
        moe.judge_moe_fault("dead-expert", 0, "", records(stale=True), tmp_path / "run1.log")


# --- slow: each fault in the real run -------------------------------------------------------------------------------


def _rehearse(rehearse, tmp_path: Path, weights: Path, name: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / name
    done = rehearse("--output-dir", str(out), "--fault", name, "--weights", str(weights), timeout=1500)
    summary = out / f"summary-{name}.json"
    return done, json.loads(summary.read_text()) if summary.is_file() else {}


@pytest.mark.slow
def test_a_dead_expert_fails_the_rehearsal_naming_layer_and_expert(tmp_path: Path, weights: Path, rehearse) -> None:
    done, summary = _rehearse(rehearse, tmp_path, weights, "dead-expert")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    fault = summary["fault"]
    assert fault["caught_by"] == "expert verdicts"
    assert f"layer {LAYER}: expert {EXPERT}" in fault["message"]


@pytest.mark.slow
def test_with_the_weight_check_off_a_stale_bias_fails_the_rehearsals_own_checks(
    tmp_path: Path, weights: Path, rehearse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rehearsal's bias check and the guard, behind the weight check: what catches a stale bias without it."""
    monkeypatch.setenv("R1_ASCEND_DISABLE", "verl_weight_sync_check")
    done, summary = _rehearse(rehearse, tmp_path, weights, "stale-bias")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    fault = summary["fault"]
    assert fault["caught_by"] in {"expert verdicts", "rollout guard"}
    drift = [d["engine_vs_actor"] for d in fault["bias_drift_per_step"]]
    assert drift
    assert all(d > 0 for d in drift)


def test_the_plans_save_the_last_step_validate_never_and_use_the_fault_batch() -> None:
    from r1_ascend.rehearse.config import FAULT_BATCH

    for name in moe.MOE_FAULTS:
        plan = moe.plan_for(name, Plan())
        assert (plan.save_freq, plan.test_freq) == (moe.STEPS, moe.STEPS + 1)
        assert all(getattr(plan, key) == value for key, value in FAULT_BATCH.items())
    with pytest.raises(ValueError, match=r"known: dead-expert, stale-bias$"):
        moe.plan_for("hang", Plan())


def test_the_outcome_names_the_fault_and_its_exit_code(tmp_path: Path) -> None:
    outcome = moe.judge_moe_fault("dead-expert", 0, "", records(dead=True), tmp_path / "run1.log")
    assert (outcome["name"], outcome["exit_code"]) == ("dead-expert", 0)
    line = "rollout guard: at training step 3 the rollout disagrees: beyond the stop level: rollout_guard/x = 1; over"
    guard = moe.judge_moe_fault("stale-bias", 1, line, records(stale=True), tmp_path / "r.log", weight_check=False)
    assert (guard["name"], guard["exit_code"], guard["message"]) == ("stale-bias", 1, line)
    slow = [{"t": 1, "pid": 7, "event": "x"}]
    assert moe.bias_drift(slow) == [], "no sync after an update: no drift, not an error"


def test_the_drift_is_rounded_to_five_digits(tmp_path: Path) -> None:
    events = records(stale=True)
    for event in events:
        if event["event"] == "expert_load":
            event["bias"] = {k: [b + 1.234567e-6 for b in v] for k, v in event["bias"].items()}
    outcome = moe.judge_moe_fault("stale-bias", 0, "", events, tmp_path / "r.log", weight_check=False)
    drift = [d["engine_vs_actor"] for d in outcome["bias_drift_per_step"]]
    assert drift == [0.01, 0.02], "the raw drift is 0.0100012..., 0.0200012..."


def test_a_dead_expert_run_the_guard_stopped_is_not_its_catch(tmp_path: Path) -> None:
    """The guard is a stale-bias catch only: a dead expert is the actor's own weights, which the guard compares with."""
    line = "rollout guard: at training step 3 the rollout disagrees: beyond the stop level: rollout_guard/x = 1; over"
    with pytest.raises(FaultError, match="not by a check naming it"):
        moe.judge_moe_fault("dead-expert", 1, line, records(dead=True), tmp_path / "run1.log")


def test_the_weight_check_stop_keeps_one_line_of_at_most_600_characters_and_names_the_log(tmp_path: Path) -> None:
    bias = f"model.layers.{LAYER}.mlp.gate.e_score_correction_bias"
    text = _check_stop(moe.STALE_FROM_SYNC, bias) + "\nthird line"
    outcome = moe.judge_moe_fault("stale-bias", 1, text, [], tmp_path / "r.log")
    assert outcome["message"].endswith("expected proj 0.1")
    long = text.replace("expected proj 0.1", "expected proj 0.1" + "x" * 700)
    assert len(moe.judge_moe_fault("stale-bias", 1, long, [], tmp_path / "r.log")["message"]) == 600
    with pytest.raises(FaultError, match=str(tmp_path / "r.log")):
        moe.judge_moe_fault("stale-bias", 1, _check_stop(3, bias), [], tmp_path / "r.log")
