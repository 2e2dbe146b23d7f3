"""``r1-ascend rehearse --rollout-fault NAME``: a rollout fault planted into the real run's weight sync is stopped at
that step, before it is checkpointed, and the run leaves nothing behind: by the weight-sync check at the sync, or by
the rollout guard in the step.

The fast tests feed the run's verdict logs of a stopped, a missed and a late stop. The slow tests plant faults into
the real 2-step run: ``expert-transposed-resume`` (after the rollout's release / resume the experts' layout is
transposed again), stopped by the weight-sync check in sync 2 on every worker; ``stale-layers`` (the engine's last
two layers keep the previous step's weights) with the weight check switched off, stopped by the guard.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r1_ascend.rehearse.config import Plan
from r1_ascend.rehearse.lifecycle import read_lifecycle
from r1_ascend.rehearse.progress import RehearsalError
from r1_ascend.rehearse.rollout_fault_run import FAULT_STEP, STOP_BOUND_S, judge_stop, plan_for

pytestmark = pytest.mark.machine

STOP = (
    "r1_ascend.patches._errors.RolloutActorMismatchError: rollout guard: at training step {step} the rollout's "
    "log-probs of its own sampled tokens disagree with the actor's beyond the stop level: "
    "rollout_guard/seq_abs_diff_median = 0.04 nats (level 0.015), rollout_guard/kl_k3 = 0.02 nats (level 0.0097); "
    "over 256 response tokens in 32 sequences (mean |Δ| 0.045, max 0.3 nats), measured inside the actor update.\n"
)


def _out(tmp_path: Path, steps: list[int]) -> Path:
    for step in steps:
        (tmp_path / "checkpoints" / f"global_step_{step}").mkdir(parents=True)
    return tmp_path


def test_the_plan_is_two_steps_with_the_fault_in_the_second_sync() -> None:
    plan = plan_for("stale-layers", Plan())
    assert (plan.total_steps, plan.save_freq, plan.rollout_fault, plan.min_reward_rise) == (
        2,
        1,
        "stale-layers@2",
        None,
    )
    assert plan.test_freq > plan.total_steps, "no validation sync before the planted one"
    with pytest.raises(KeyError, match="unknown rollout fault"):
        plan_for("no-such-fault", Plan())


def test_a_stop_in_the_planted_step_passes_and_names_the_statistics(tmp_path: Path) -> None:
    text = "step:1 - critic/score/mean:0.2\n" + STOP.format(step=FAULT_STEP)
    verdict = judge_stop(text, tmp_path / "run1.log", _out(tmp_path, [1]), "routing-ungrouped", 1, 42.0)
    assert verdict["statistics_above_stop"] == ["seq_abs_diff_median", "kl_k3"]
    assert verdict["checkpoints_left"] == ["global_step_1"]


REFUSED = (
    "ray.exceptions.RayTaskError(WeightSyncError): r1_ascend.cpu.engine.WeightSyncError: vLLM's DeepSeek-V3 "
    "load_weights (CustomDeepseekV3ForCausalLM) refused 'model.layers.1.mlp.experts.0.down_proj.weight' of shape "
    "(320, 64): RuntimeError: The size of tensor a (64) must match the size of tensor b (320).\n"
)


CHECKED = (
    "ray.exceptions.RayTaskError(WeightSyncError): r1_ascend.patches._errors.WeightSyncError: weight sync 2 is wrong "
    "on 2 of 2 ranks (288 mismatches); nothing was generated from it. First: rank 0, sync 2: "
    "model.layers.1.mlp.experts.0.gate_proj.weight -> model.layers.1.mlp.experts.w13_weight[0, 0:96]: vLLM holds other "
    "values than it received: fingerprint expected proj 1.6, total 3.1, checksum 14; found proj 0.1 (differs by 1.5, "
    "bound 0.0045), total -1.7 (bound 0.0044), checksum 99.\n"
)


def test_a_sync_the_weight_check_stops_names_the_sync_the_ranks_and_the_tensor(tmp_path: Path) -> None:
    text = "step:1 - critic/score/mean:0.2\n" + CHECKED
    verdict = judge_stop(text, tmp_path / "run1.log", _out(tmp_path, [1]), "expert-transposed-resume", 1, 20.0)
    assert verdict["stopped_by"] == "the weight-sync check"
    assert verdict["stopped_in_sync"] == FAULT_STEP
    assert verdict["ranks"] == "2 of 2"
    assert verdict["named"] == "model.layers.1.mlp.experts.0.gate_proj.weight"
    with pytest.raises(RehearsalError, match="stopped sync 1"):
        judge_stop(CHECKED.replace("sync 2", "sync 1"), tmp_path / "r.log", tmp_path, "x", 1, 20.0)
    _out(tmp_path, [2])
    with pytest.raises(RehearsalError, match="global_step_2 was saved"):
        judge_stop(CHECKED, tmp_path / "r.log", tmp_path, "x", 1, 20.0)


def test_a_sync_the_loader_refuses_stops_the_run_naming_the_tensor(tmp_path: Path) -> None:
    text = "step:1 - critic/score/mean:0.2\n" + REFUSED
    verdict = judge_stop(text, tmp_path / "run1.log", _out(tmp_path, [1]), "expert-transposed-load", 1, 30.0)
    assert verdict["stopped_by"] == "vLLM's weight loader"
    assert verdict["refused"] == "model.layers.1.mlp.experts.0.down_proj.weight"
    assert verdict["checkpoints_left"] == ["global_step_1"]


@pytest.mark.parametrize(
    ("text", "code", "steps", "expected"),
    [
        ("step:1 - a:1\nstep:2 - a:1\n", 0, [1, 2], "did not stop the run"),
        (STOP.format(step=1), 1, [], "stopped the run in step 1"),
        ("step:1 - a:1\nstep:2 - a:1\n" + STOP.format(step=2), 1, [1], "logged as a finished step"),
        (STOP.format(step=2), 1, [1, 2], "global_step_2 was saved"),
        (REFUSED, 0, [1, 2], "did not stop the run"),
        ("step:1 - a:1\nstep:2 - a:1\n" + REFUSED, 1, [1], "logged as a finished step"),
        (REFUSED, 1, [1, 2], "global_step_2 was saved"),
    ],
    ids=["missed", "wrong-step", "step-finished", "checkpointed", "refused-exit-0", "refused-late", "refused-saved"],
)
def test_a_broken_stop_fails(tmp_path: Path, text: str, code: int, steps: list[int], expected: str) -> None:
    with pytest.raises(RehearsalError, match=expected):
        judge_stop(text, tmp_path / "run1.log", _out(tmp_path, steps), "routing-ungrouped", code, 1.0)


@pytest.mark.slow
def test_a_weight_fault_planted_in_the_real_run_is_stopped_by_the_weight_check(
    tmp_path: Path, weights: Path, rehearse
) -> None:
    """expert-transposed-resume: after the rollout's first release / resume (verl's trainer_mode, then rollout_mode)
    the experts' layout is transposed again in vLLM's model; the weight-sync check, run by verl's rollout_mode on
    every sync, stops sync 2 on every worker before anything is generated from it, naming an expert tensor; step 1's
    sync was checked and passed. Every other weight fault, in seeds 0-4: tests/model/test_weight_sync_check.py."""
    out = tmp_path / "weight-fault"
    fault = "expert-transposed-resume"
    done = rehearse("--output-dir", str(out), "--weights", str(weights), "--rollout-fault", fault)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    verdict = json.loads((out / f"summary-{fault}.json").read_text())["rollout_fault"]
    assert verdict["stopped_by"] == "the weight-sync check"
    assert verdict["stopped_in_sync"] == FAULT_STEP
    assert verdict["ranks"] == "2 of 2"
    assert ".mlp.experts." in verdict["named"]
    assert verdict["time_to_stop_s"] <= STOP_BOUND_S
    assert verdict["checkpoints_left"] == ["global_step_1"]
    records = read_lifecycle(out / "lifecycle")
    checked = sorted((e["sync"], e["mismatches"] > 0) for e in records if e["event"] == "weight_checked")
    assert checked == [(1, False), (1, False), (2, True), (2, True)], "sync 1 passed and sync 2 failed on both"


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["stale-layers"])
def test_a_rollout_fault_planted_in_the_real_run_is_stopped(
    tmp_path: Path, weights: Path, rehearse, fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stale-layers, with the weight-sync check switched off (it would stop the sync first): the fault with the
    widest margin over the stop level that is not a whole sync missed (the one-process bench, seed 0: median 0.030
    against the stop level 0.017, docs/rollout_guard.md). The other rollout faults are stopped (or written down as
    not separable) by the bench in tests/model/test_rollout_guard_faults.py; each real-loop run costs the full tier
    two to four minutes, so one runs here (``sampler-unpatched`` in the real loop: docs/benchmarks.md).

    It runs at the layout the trivial one leaves out: 2 nodes x 2 fake NPUs, the actor in 2 pipeline stages (megatron's
    1F1B schedule and its p2p over gloo, verl's export across the stages) and the rollout at TP 2 x DP 2 with EP 4 (the
    overlay's vllm_dp_ep_groups builds vLLM's DP and EP groups; every worker's are checked against the layout rule)."""
    monkeypatch.setenv("R1_ASCEND_DISABLE", "verl_weight_sync_check")
    out = tmp_path / "rollout-fault"
    layout = ["--npus-per-node", "2", "--actor-pp", "2", "--rollout-dp", "2"]
    done = rehearse("--output-dir", str(out), "--weights", str(weights), *layout, "--rollout-fault", fault)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    summary = json.loads((out / f"summary-{fault}.json").read_text())
    assert summary["vllm_groups"] == "4 workers built vLLM's groups as the DP/EP layout plans them (TP 2 x DP 2, EP 4)"
    verdict = summary["rollout_fault"]
    assert verdict["stopped_in_step"] == FAULT_STEP
    assert verdict["statistics_above_stop"], "the error names the statistics"
    assert verdict["time_to_stop_s"] <= STOP_BOUND_S
    assert verdict["checkpoints_left"] == ["global_step_1"]
