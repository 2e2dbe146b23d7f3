"""``r1-ascend rehearse --fault dead-expert | stale-bias``: MoE faults the rehearsal's expert verdicts must catch.

Neither fault breaks the run: it trains on, the rollout and the actor agree about which experts they skip, and the
reward can still rise. What catches them is what the run recorded about its MoE (:mod:`r1_ascend.rehearse.
expert_checks`), so the rehearsal runs a short plan (:func:`plan_for`: 3 steps, no kill), then judges the records
and requires the verdict to fail with the fault named:

- ``dead-expert``: the actor's and reference's router bias of one expert (:data:`DEAD_EXPERT`) is -inf once their
  weights are loaded (the bias reaches the rollout through the weight sync), so no token is ever routed to it. It
  must fail "every expert routed", naming that layer and expert;
- ``stale-bias``: from the second weight sync on, the rollout engine is sent the expert bias of the first sync
  (r1_ascend.rehearse.rollout_faults): the actor's bias moves every step, the engine's does not. With the weight-sync
  check on (the default), it must stop that sync, naming a router bias (the stream differs from what the actor's own
  shards predict). With the check switched off (``R1_ASCEND_DISABLE=verl_weight_sync_check``), either the rollout
  guard stops the run (the drift moved enough tokens to other experts to show in the log-probs) or the run finishes
  and "the engine follows" must fail, naming the update the stale sync followed. The drift per step (how far the
  actor's bias moved while the engine kept the old one) is reported for the steps that ran.
"""

from __future__ import annotations

import dataclasses
import math
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from r1_ascend.rehearse import expert_checks
from r1_ascend.rehearse.config import FAULT_BATCH, Plan
from r1_ascend.rehearse.faults import MOE_FAULTS, FaultError
from r1_ascend.rehearse.lifecycle import read_lifecycle
from r1_ascend.rehearse.progress import log_progress, read_log
from r1_ascend.rehearse.rollout_fault_run import CHECKED, weight_check_on
from r1_ascend.rehearse.session import Session

#: Layer (checkpoint index) and expert the dead-expert fault kills: the smoke model's second MoE layer.
DEAD_EXPERT = (2, 0)
#: The weight sync from which the stale-bias fault keeps the old bias (the first sync after an actor update).
STALE_FROM_SYNC = 2
STEPS = 3
#: The driver of a 3-step run must have finished within this many seconds.
RUN_BOUND_S = 900.0
GUARD_STOP = re.compile(r"rollout guard: at training step (\d+) .*?beyond the stop level: (.*?); over")


def plan_for(name: str, base: Plan) -> Plan:
    if name not in MOE_FAULTS:
        msg = f"unknown MoE fault {name!r}; known: {', '.join(MOE_FAULTS)}"
        raise ValueError(msg)
    layer, expert = DEAD_EXPERT
    return dataclasses.replace(
        base,
        total_steps=STEPS,
        save_freq=STEPS,
        test_freq=STEPS + 1,
        min_reward_rise=None,
        **FAULT_BATCH,
        actor_fault=f"dead-expert@{layer}:{expert}" if name == "dead-expert" else None,
        rollout_fault=f"stale-bias@{STALE_FROM_SYNC}" if name == "stale-bias" else None,
    )


def bias_drift(events: Sequence[Mapping[str, Any]]) -> list[dict[str, object]]:
    """Per actor update: the largest |engine - actor| expert bias at the syncs after it (the verdict's comparison,
    without its limit); none when no sync followed an update (a run stopped at its second sync)."""
    try:
        return expert_checks.check_engine_follows(events, tolerance=math.inf)
    except expert_checks.ExpertLoadError:
        return []


def judge_moe_fault(
    name: str, code: int, text: str, events: Sequence[Mapping[str, Any]], log: Path, *, weight_check: bool = True
) -> dict:
    """The fault was caught and named. ``stale-bias``: by the weight-sync check at its sync when ``weight_check`` is
    on, else by the rollout guard or the expert verdicts; ``dead-expert`` (the actor's own weights, synced exactly):
    by the expert verdicts."""
    stopped = GUARD_STOP.search(text)
    seen: dict[str, object] = {"name": name, "exit_code": code}
    if name == "stale-bias":
        seen["bias_drift_per_step"] = [
            {
                "after_update_of_step": d["after_update_of_step"],
                "engine_vs_actor": round(float(d["engine_vs_actor"]), 5),
            }
            for d in bias_drift(events)
        ]
    if name == "stale-bias" and weight_check:
        return {**seen, **_judge_weight_check_stop(code, text, log)}
    if code != 0:
        if name == "stale-bias" and stopped:
            return {**seen, "caught_by": "rollout guard", "step": int(stopped.group(1)), "message": stopped.group(0)}
        raise FaultError(f"the run with {name} failed with exit code {code}, not by a check naming it; log: {log}")
    try:
        expert_checks.judge(events)
    except expert_checks.ExpertLoadError as exc:
        message = str(exc)
        layer, expert = DEAD_EXPERT
        wanted = f"layer {layer}: expert {expert}" if name == "dead-expert" else "differs from the actor's"
        if wanted not in message:
            msg = f"the expert verdicts failed the {name} run without naming it ({wanted!r}): {message}"
            raise FaultError(msg) from exc
        return {**seen, "caught_by": "expert verdicts", "message": message}
    raise FaultError(f"the planted {name} passed every expert verdict: the rehearsal cannot see it; log: {log}")


def _judge_weight_check_stop(code: int, text: str, log: Path) -> dict[str, object]:
    checked = CHECKED.search(text)
    if code == 0 or checked is None:
        raise FaultError(
            f"the weight-sync check did not stop the stale-bias run (exit code {code}, no 'weight sync N is wrong' "
            f"error); it must stop weight sync {STALE_FROM_SYNC}; log: {log}"
        )
    sync, tensor = int(checked.group(1)), checked.group(5)
    if sync != STALE_FROM_SYNC or not tensor.endswith("e_score_correction_bias"):
        raise FaultError(
            f"the weight-sync check stopped weight sync {sync} naming {tensor}; the stale bias was planted from sync "
            f"{STALE_FROM_SYNC} into the routers' e_score_correction_bias; log: {log}"
        )
    line = text[checked.start() :].split("\n", 1)[0]
    return {"caught_by": "weight-sync check", "sync": sync, "named": tensor, "message": line[:600]}


def drive(session: Session, name: str) -> int:
    """Let the short run finish (the fault breaks nothing): its exit code."""
    try:
        return session.driver.wait(RUN_BOUND_S)
    except subprocess.TimeoutExpired:
        raise FaultError(
            f"the {STEPS}-step run with {name} did not end within {RUN_BOUND_S:g} s; log: {session.logs[0]}"
        ) from None


def judge(session: Session, code: int, name: str) -> dict[str, object]:
    log = session.logs[0]
    events = read_lifecycle(session.out / "lifecycle")
    outcome = judge_moe_fault(name, code, read_log(log), events, log, weight_check=weight_check_on())
    log_progress(f"{name}: caught by the {outcome['caught_by']}: {str(outcome['message'])[:300]}")
    return {"fault": outcome}
