"""The rehearsal's verdicts on its MoE: every expert and every expert-parallel rank carried tokens, the expert bias
moved, and the rollout engine received the bias the actor had.

They read what the stand-in workers recorded (:mod:`r1_ascend.rehearse.worker_hooks`): an ``expert_load`` record after
each actor update (patch ``verl_moe_expert_load``: the step's tokens per expert of every MoE layer, summed over the
actor's data-parallel ranks, and this rank's expert biases after the update) and an ``engine_bias`` record after
each weight sync into the rollout engine. Pure functions of those records, so a fast test feeds them healthy and
broken runs.

- **Every expert routed**: over the whole run, each expert of each MoE layer received at least one token. An expert
  that never does is dead: its router column or bias is broken, or the checkpoint lost it; its weights never train
  and a fault in them can never show.
- **Every expert-parallel rank loaded**: in every step and layer, each EP rank (of the actor's layout) received at
  least :data:`MIN_EP_SHARE` of the routed tokens. Below that the all-to-all barely runs in one direction.
- **The bias moves**: megatron-core's aux-loss-free update moves every expert's bias by the update rate at every
  optimizer step whose load is not exactly balanced; between two updates of one worker the bias must differ.
- **The engine follows**: after each weight sync that follows an actor update in the same worker, the engine's bias
  equals the actor's after that update, within :data:`BIAS_TOLERANCE`, once rounded to the dtype the rollout's
  loader holds it in (the record's ``held_in``). The bias is exported from the actor's state_dict (it is a buffer,
  not a parameter) in float32; vllm-ascend 0.9.1's eager DeepSeek model holds it in bf16
  (``vllm_ascend/models/deepseek_v2.py:295-298``), as the cluster's rollout does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from r1_ascend.patches.rules.expert_load import PATCH, rank_shares

#: Smallest share of a layer's routed tokens any expert-parallel rank may receive in a step.
MIN_EP_SHARE = 0.2
#: Largest |engine bias - actor bias| accepted after a sync (the actor's rounded to the engine's holding dtype).
BIAS_TOLERANCE = 1e-6


def held_as(bias: Mapping[int, Sequence[float]], dtype: str | None) -> dict[int, list[float]]:
    """The actor's float32 bias as a loader that holds it in ``dtype`` (``"torch.bfloat16"``...) keeps it."""
    if dtype in (None, "torch.float32"):
        return {layer: list(values) for layer, values in bias.items()}
    import torch

    kind = getattr(torch, str(dtype).removeprefix("torch."))
    return {layer: torch.tensor(values).to(kind).float().tolist() for layer, values in bias.items()}


class ExpertLoadError(AssertionError):
    """The run's MoE was not exercised as the cluster's is, or the rollout did not receive the actor's bias."""


@dataclass(frozen=True)
class StepLoad:
    """One step's expert load as recorded (the first record of the step: every rank holds the same table)."""

    step: int
    ep: int
    tokens: dict[int, list[float]]


def _layers(table: Mapping[str, Sequence[float]]) -> dict[int, list[float]]:
    return {int(layer): list(values) for layer, values in table.items()}


def step_loads(events: Sequence[Mapping[str, Any]]) -> list[StepLoad]:
    """The recorded expert load of each training step, in step order (a step run again after a resume: the later)."""
    loads: dict[int, StepLoad] = {}
    for event in sorted((e for e in events if e.get("event") == "expert_load"), key=lambda e: e["t"]):
        step = event.get("step")
        if step is None:
            continue
        loads[int(step)] = StepLoad(int(step), int(event["ep"]), _layers(event["tokens"]))
    return [loads[step] for step in sorted(loads)]


def require_loads(events: Sequence[Mapping[str, Any]]) -> list[StepLoad]:
    loads = step_loads(events)
    if not loads:
        raise ExpertLoadError(
            f"no actor update recorded its expert load: patch {PATCH} is switched off or failed "
            "(R1_ASCEND_DISABLE must not name it in a rehearsal), or the stand-ins did not install its listener"
        )
    return loads


def check_every_expert_routed(loads: Sequence[StepLoad]) -> dict[str, object]:
    """Each expert of each MoE layer received a token in some step; returns the fewest tokens any expert got."""
    totals: dict[int, list[float]] = {}
    for load in loads:
        for layer, tokens in load.tokens.items():
            into = totals.setdefault(layer, [0.0] * len(tokens))
            for expert, count in enumerate(tokens):
                into[expert] += count
    dead = {layer: [e for e, count in enumerate(tokens) if count <= 0] for layer, tokens in sorted(totals.items())}
    dead = {layer: experts for layer, experts in dead.items() if experts}
    steps = f"steps {loads[0].step}-{loads[-1].step}"
    if dead:
        named = "; ".join(
            f"layer {layer}: expert{'s' if len(experts) > 1 else ''} {', '.join(map(str, experts))}"
            for layer, experts in dead.items()
        )
        raise ExpertLoadError(
            f"experts that received no token in the whole run ({steps}): {named}. A dead expert never trains and "
            "hides any fault in its weights: check that layer's router weight and expert bias (e.g. a -inf or NaN "
            "entry) in the checkpoint and after the weight sync"
        )
    fewest = min((min(tokens), layer) for layer, tokens in totals.items())
    return {"layers": len(totals), "experts_per_layer": len(next(iter(totals.values()))), "fewest_tokens": fewest[0]}


def check_ep_shares(loads: Sequence[StepLoad], min_share: float = MIN_EP_SHARE) -> float:
    """Every expert-parallel rank got at least ``min_share`` of each layer's tokens in every step; returns the
    smallest share seen."""
    smallest = (math.inf, 0, 0, 0)
    for load in loads:
        for layer, tokens in sorted(load.tokens.items()):
            shares = rank_shares(tokens, load.ep)
            rank = min(range(len(shares)), key=shares.__getitem__)
            smallest = min(smallest, (shares[rank], load.step, layer, rank))
    share, step, layer, rank = smallest
    if share < min_share:
        raise ExpertLoadError(
            f"expert-parallel rank {rank} received {share:.1%} of layer {layer}'s routed tokens in step {step} "
            f"(at least {min_share:.0%} expected): the all-to-all barely sends to it. Check that layer's routing "
            "(expert bias, router weight) and the moe/ metrics of r1-ascend report"
        )
    return share


def actor_biases(
    events: Sequence[Mapping[str, Any]],
) -> dict[int, list[tuple[float, int | None, dict[int, list[float]]]]]:
    """Each worker's (time, step, bias by layer) after every actor update, in time order."""
    out: dict[int, list[tuple[float, int | None, dict[int, list[float]]]]] = {}
    for event in sorted((e for e in events if e.get("event") == "expert_load"), key=lambda e: e["t"]):
        out.setdefault(int(event["pid"]), []).append((float(event["t"]), event.get("step"), _layers(event["bias"])))
    return out


def check_bias_moves(events: Sequence[Mapping[str, Any]]) -> list[dict[str, object]]:
    """Between two consecutive updates of one worker the expert bias changed; returns the largest change per step."""
    moves: dict[int, float] = {}
    for pid, updates in actor_biases(events).items():
        for (_, _, before), (_, step, after) in pairwise(updates):
            change = _largest_difference(before, after)
            if change == 0.0:
                raise ExpertLoadError(
                    f"the actor's expert bias did not move in step {step} (worker pid {pid}): megatron-core's bias "
                    "update (moe_router_enable_expert_bias, moe_router_bias_update_rate) is off or had no effect"
                )
            if step is not None:
                moves[int(step)] = max(moves.get(int(step), 0.0), change)
    return [{"step": step, "largest_bias_change": moves[step]} for step in sorted(moves)]


def check_engine_follows(events: Sequence[Mapping[str, Any]], tolerance: float = BIAS_TOLERANCE) -> list[dict]:
    """After every sync that follows an actor update in the same worker, the engine's bias equals the actor's after
    that update; returns, per update (its training step) the syncs after it were checked against, the largest
    |engine - actor| and how far the actor's bias had moved since the worker's first update (what a stale engine
    would be off by).

    With pipeline stages each worker's actor holds its stage's MoE layers while its engine holds them all: each
    worker is checked on its own layers, and every layer of the engine must be some worker's."""
    biases = actor_biases(events)
    drift: dict[int, dict[str, float]] = {}
    covered: set[int] = set()
    engine_layers: set[int] = set()
    for event in sorted((e for e in events if e.get("event") == "engine_bias"), key=lambda e: e["t"]):
        updates = [u for u in biases.get(int(event["pid"]), []) if u[0] < float(event["t"])]
        if not updates:
            continue  # the run's first sync: the actor has not updated yet in this worker
        _, step, exact = updates[-1]
        actor = held_as(exact, event.get("held_in"))
        whole = _layers(event["bias"])
        engine_layers.update(whole)
        covered.update(actor)
        gap = _largest_difference(actor, {layer: whole[layer] for layer in actor if layer in whole})
        moved = _largest_difference(biases[int(event["pid"])][0][2], actor)
        after = int(step) if step is not None else -1
        if gap > tolerance:
            raise ExpertLoadError(
                f"the rollout engine's expert bias differs from the actor's by up to {gap:.3g} after the weight sync "
                f"that followed the update of step {after} (the actor's bias has moved {moved:.3g} since the "
                "worker's first update): the sync did not carry router.expert_bias (a state_dict buffer, not a "
                "parameter) into the engine's e_score_correction_bias, so the rollout routes with a stale bias"
            )
        entry = drift.setdefault(after, {"engine_vs_actor": 0.0, "actor_moved_since_first_update": 0.0})
        entry["engine_vs_actor"] = max(entry["engine_vs_actor"], gap)
        entry["actor_moved_since_first_update"] = max(entry["actor_moved_since_first_update"], moved)
    if not drift:
        raise ExpertLoadError("no weight sync after an actor update was recorded: the engine's bias was never checked")
    if covered != engine_layers:
        raise ExpertLoadError(
            f"the engine's MoE layers {sorted(engine_layers)} and the actor's {sorted(covered)} (every pipeline "
            "stage's) differ: a layer's bias was checked on one side only"
        )
    return [{"after_update_of_step": step, **values} for step, values in sorted(drift.items())]


def _largest_difference(a: Mapping[int, Sequence[float]], b: Mapping[int, Sequence[float]]) -> float:
    if set(a) != set(b):
        raise ExpertLoadError(f"the actor's MoE layers {sorted(a)} and the engine's {sorted(b)} differ")
    largest = 0.0
    for layer in a:
        for x, y in zip(a[layer], b[layer], strict=True):
            if math.isinf(x) and x == y:
                continue  # the same -inf (a dead expert on both sides) is no difference
            largest = max(largest, abs(x - y) if math.isfinite(x - y) else math.inf)
    return largest


def judge(events: Sequence[Mapping[str, Any]]) -> dict[str, object]:
    """Every MoE verdict; raises ExpertLoadError on the first that fails."""
    loads = require_loads(events)
    return {
        "experts": check_every_expert_routed(loads),
        "smallest_ep_share": round(check_ep_shares(loads), 3),
        "bias_moves": check_bias_moves(events),
        "engine_bias": check_engine_follows(events),
    }
