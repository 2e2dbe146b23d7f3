"""The rehearsal's MoE verdicts (r1_ascend.rehearse.expert_checks) on recorded runs, healthy and broken.

A run is built as the stand-in workers record it: per worker (pid) an ``expert_load`` record after each actor update
(the step's whole-actor tokens per expert, this rank's biases after the update) and an ``engine_bias`` record after
each weight sync.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from r1_ascend.rehearse import expert_checks as checks

LAYERS = (1, 2)
EXPERTS = 4
BALANCED = [10.0, 10.0, 10.0, 10.0]


def bias_after(step: int) -> dict[str, list[float]]:
    """Every expert's bias moves by 0.001 per update, as megatron-core's sign update does."""
    return {str(layer): [0.1 * e + 0.001 * step * (-1) ** e for e in range(EXPERTS)] for layer in LAYERS}


def run(
    steps: int = 3,
    pids: tuple[int, ...] = (11, 12),
    tokens: dict[int, dict[str, list[float]]] | None = None,
    engine: dict[int, dict[str, list[float]]] | None = None,
) -> list[dict[str, Any]]:
    """Per step and worker: a sync (the engine gets the bias of the previous update), then the update."""
    events: list[dict[str, Any]] = []
    t = 0.0
    for step in range(1, steps + 1):
        for pid in pids:
            t += 1.0
            synced = (engine or {}).get(step, bias_after(step - 1))
            events.append({"t": t, "pid": pid, "event": "engine_bias", "bias": synced})
        for pid in pids:
            t += 1.0
            step_tokens = (tokens or {}).get(step, {str(layer): list(BALANCED) for layer in LAYERS})
            events.append(
                {
                    "t": t,
                    "pid": pid,
                    "event": "expert_load",
                    "step": step,
                    "rank": pids.index(pid),
                    "ep": 2,
                    "optimizer_steps": 1,
                    "tokens": step_tokens,
                    "bias": bias_after(step),
                }
            )
    return events


def test_a_healthy_run_passes_and_reports_what_it_saw() -> None:
    summary = checks.judge(run())
    assert summary["experts"] == {"layers": 2, "experts_per_layer": 4, "fewest_tokens": 30.0}
    assert summary["smallest_ep_share"] == 0.5
    assert [m["step"] for m in summary["bias_moves"]] == [2, 3]
    assert all(m["largest_bias_change"] == pytest.approx(0.001) for m in summary["bias_moves"])
    assert [d["after_update_of_step"] for d in summary["engine_bias"]] == [1, 2]
    assert all(d["engine_vs_actor"] == 0.0 for d in summary["engine_bias"])
    assert summary["engine_bias"][-1]["actor_moved_since_first_update"] == pytest.approx(0.001)


def test_no_record_names_the_patch() -> None:
    with pytest.raises(checks.ExpertLoadError, match="verl_moe_expert_load"):
        checks.judge([e for e in run() if e["event"] != "expert_load"])


def test_an_expert_without_tokens_in_every_step_is_named_with_its_layer() -> None:
    dead = {step: {"1": [10.0, 0.0, 10.0, 20.0], "2": list(BALANCED)} for step in (1, 2, 3)}
    with pytest.raises(checks.ExpertLoadError, match=r"steps 1-3\): layer 1: expert 1\. A dead expert"):
        checks.judge(run(tokens=dead))


def test_an_expert_idle_in_some_steps_only_is_not_dead() -> None:
    """One step with tokens anywhere in the run is enough: 'no token in the whole run' is the rule."""
    idle = {1: {"1": [10.0, 0.0, 15.0, 15.0], "2": list(BALANCED)}, 2: {"1": [0.0, 1.0, 20.0, 19.0], "2": BALANCED}}
    loads = checks.step_loads(run(steps=2, tokens=idle))
    assert checks.check_every_expert_routed(loads)["fewest_tokens"] == 1.0


def test_several_dead_experts_are_all_named() -> None:
    dead = {step: {"1": list(BALANCED), "2": [0.0, 0.0, 30.0, 10.0]} for step in (1, 2, 3)}
    with pytest.raises(checks.ExpertLoadError, match="layer 2: experts 0, 1"):
        checks.check_every_expert_routed(checks.step_loads(run(tokens=dead)))


@pytest.mark.parametrize(
    ("low", "fails"),
    [(0.19, True), (0.2, False), (0.25, False)],
    ids=["below", "at-the-limit", "above"],
)
def test_an_ep_rank_below_a_fifth_of_a_layer_fails_naming_step_layer_and_rank(low: float, fails: bool) -> None:
    share = [50.0 * low, 50.0 * low, 50.0 * (1 - low), 50.0 * (1 - low)]  # rank 0 holds experts 0 and 1
    events = run(tokens={2: {"1": list(BALANCED), "2": share}})
    if fails:
        with pytest.raises(
            checks.ExpertLoadError, match=r"rank 0 received 19\.0% of layer 2's routed tokens in step 2"
        ):
            checks.check_ep_shares(checks.step_loads(events))
    else:
        assert checks.check_ep_shares(checks.step_loads(events)) == pytest.approx(low)


def test_the_later_record_of_a_step_run_again_after_a_resume_counts() -> None:
    first = run(steps=2)
    again = [dict(e, t=e["t"] + 100) for e in run(steps=2, tokens={2: {"1": [40.0, 0.0, 0.0, 0.0], "2": BALANCED}})]
    loads = checks.step_loads(first + again)
    assert [load.step for load in loads] == [1, 2]
    assert loads[1].tokens[1] == [40.0, 0.0, 0.0, 0.0]


def test_a_bias_that_stops_moving_fails() -> None:
    events = run()
    for event in events:
        if event["event"] == "expert_load" and event["step"] == 3:
            event["bias"] = bias_after(2)
    with pytest.raises(checks.ExpertLoadError, match="did not move in step 3"):
        checks.check_bias_moves(events)


def test_an_engine_with_a_stale_bias_fails_naming_the_step_and_the_drift() -> None:
    stale = {step: bias_after(0) for step in (2, 3)}
    with pytest.raises(
        checks.ExpertLoadError,
        match=r"differs from the actor's by up to 0\.001 after the weight sync that followed the update of step 1",
    ):
        checks.check_engine_follows(run(engine=stale))


def test_the_first_sync_of_a_run_is_not_compared() -> None:
    """Before the first update in a worker there is no actor bias recorded to compare with."""
    first_only = run(engine={1: bias_after(5)})
    assert [d["after_update_of_step"] for d in checks.check_engine_follows(first_only)] == [1, 2]


def test_a_drift_within_the_tolerance_passes() -> None:
    nudged = {3: {k: [v + checks.BIAS_TOLERANCE / 2 for v in values] for k, values in bias_after(2).items()}}
    assert checks.check_engine_follows(run(engine=nudged))[-1]["engine_vs_actor"] <= checks.BIAS_TOLERANCE


def test_the_same_dead_expert_on_both_sides_is_no_drift() -> None:
    dead = {str(layer): [-math.inf, 0.1, 0.2, 0.3] for layer in LAYERS}
    events = run()
    for event in events:
        event["bias"] = {k: list(v) for k, v in dead.items()}
    assert checks.check_engine_follows(events)[-1]["engine_vs_actor"] == 0.0


def test_no_sync_after_an_update_fails() -> None:
    with pytest.raises(checks.ExpertLoadError, match="never checked"):
        checks.check_engine_follows(run(steps=1))


def test_engine_and_actor_with_different_layers_fail() -> None:
    engine = {2: {"1": bias_after(1)["1"]}, 3: {"1": bias_after(2)["1"]}}
    with pytest.raises(checks.ExpertLoadError, match="MoE layers"):
        checks.check_engine_follows(run(engine=engine))


@given(st.permutations(list(range(6))))
def test_syncs_are_matched_within_their_worker_whatever_the_interleaving(order: list[int]) -> None:
    """Records of two workers arrive in any order across workers; within a worker, time order decides."""
    events = run(steps=3)
    by_pid = {11: [e for e in events if e["pid"] == 11], 12: [e for e in events if e["pid"] == 12]}
    shuffled = []
    base = 0.0
    for index in order:
        pid = 11 if index % 2 else 12
        if by_pid[pid]:
            base += 1.0
            shuffled.append(dict(by_pid[pid].pop(0), t=base))
    for pid, rest in by_pid.items():
        for event in rest:
            base += 1.0
            shuffled.append(dict(event, t=base, pid=pid))
    assert all(d["engine_vs_actor"] == 0.0 for d in checks.check_engine_follows(shuffled))


def _rounded(bias: dict[str, list[float]]) -> dict[str, list[float]]:
    import torch

    return {layer: torch.tensor(values).bfloat16().float().tolist() for layer, values in bias.items()}


def test_an_engine_holding_the_bias_in_bf16_follows_when_it_holds_the_actors_bias_rounded() -> None:
    events = run(engine={step: _rounded(bias_after(step - 1)) for step in (1, 2, 3)})
    for event in events:
        if event["event"] == "engine_bias":
            event["held_in"] = "torch.bfloat16"
    summary = checks.judge(events)
    assert all(d["engine_vs_actor"] == 0.0 for d in summary["engine_bias"])


def test_a_rounded_bias_from_a_float32_engine_is_a_difference() -> None:
    with pytest.raises(checks.ExpertLoadError, match="differs from the actor's"):
        checks.judge(run(engine={step: _rounded(bias_after(step - 1)) for step in (1, 2, 3)}))


@pytest.mark.parametrize("held_in", [None, "torch.float32"])
def test_the_bias_of_a_float32_engine_is_compared_unrounded(held_in: str | None) -> None:
    bias = {1: [0.1234567, -0.7654321]}
    assert checks.held_as(bias, held_in) == {1: [0.1234567, -0.7654321]}
    assert checks.held_as(bias, "torch.bfloat16") != bias


def staged(events: list[dict[str, Any]], stages: dict[int, tuple[int, ...]]) -> list[dict[str, Any]]:
    """``events`` as pipeline stages record them: each worker's actor bias holds only its stage's layers (``stages``:
    pid -> layers), its engine every layer."""
    out = []
    for event in events:
        if event["event"] == "expert_load":
            layers = {str(layer) for layer in stages[event["pid"]]}
            event = {**event, "bias": {k: v for k, v in event["bias"].items() if k in layers}}
        out.append(event)
    return out


def test_pipeline_stages_are_each_checked_on_their_own_layers() -> None:
    events = staged(run(steps=3), {11: (1,), 12: (2,)})
    assert all(d["engine_vs_actor"] == 0.0 for d in checks.check_engine_follows(events))
    stale = staged(run(steps=3, engine={3: {**bias_after(2), "2": bias_after(0)["2"]}}), {11: (1,), 12: (2,)})
    with pytest.raises(checks.ExpertLoadError, match="differs from the actor's"):
        checks.check_engine_follows(stale)


def test_an_engine_layer_no_stage_holds_fails() -> None:
    events = staged(run(steps=3), {11: (1,), 12: (1,)})
    with pytest.raises(checks.ExpertLoadError, match=r"engine's MoE layers \[1, 2\] and the actor's \[1\]"):
        checks.check_engine_follows(events)
