"""``r1-ascend rehearse --rollout-fault NAME``: a planted rollout fault must stop the real run at the step it hits.

The rehearsal on a 2-step plan (a checkpoint every step) whose CPU rollout engine plants ``NAME``
(r1_ascend.rehearse.rollout_faults) into its second weight sync, the one before step 2's generation. A weight or
layout fault must be stopped by the weight-sync check (``verl_weight_sync_check``) at that sync, before anything is
generated from it, with ``WeightSyncError`` naming the sync, the ranks and the tensor; a fault the check cannot see
(the engine's configuration, its sampler), or any fault with the check switched off, by the rollout guard in step 2
with ``RolloutActorMismatchError`` naming the step and the statistics above their stop levels (or, for a layout
vLLM's loader cannot take, the loader must refuse that sync with ``WeightSyncError`` naming the tensor); always
before step 2 is checkpointed, every process of the run gone within ``STOP_BOUND_S`` of the planted sync, step 1's
checkpoint the last one. With both switched off the same run trains on to the end: nothing else notices.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

from r1_ascend.rehearse import faults, rollout_faults
from r1_ascend.rehearse.cluster import wait_for
from r1_ascend.rehearse.config import Plan
from r1_ascend.rehearse.lifecycle import check_records, check_vllm_groups
from r1_ascend.rehearse.progress import RehearsalError, log_progress, read_log
from r1_ascend.rehearse.session import Session

#: The weight sync (= training step, before the first validation) the fault is planted in.
FAULT_STEP = 2
#: Every process of the run must be gone within this many seconds of the planted sync.
STOP_BOUND_S = 180.0
PLANTED = re.compile(r"rollout fault: planted (\S+) .* in weight sync (\d+)")
STOPPED = re.compile(
    r"rollout guard: at training step (\d+) .*?beyond the stop level: (.*?); over (\d+) response tokens"
)
#: ``VLLMLoader``'s error when vLLM's load_weights refuses a tensor of the sync (r1_ascend.cpu.engine)
REFUSED = re.compile(r"WeightSyncError: vLLM's DeepSeek-V3 load_weights \(\w+\) refused '([^']+)'")
#: The weight-sync check's stop (patch verl_weight_sync_check): the sync, the ranks, the first rank's tensor
CHECKED = re.compile(
    r"WeightSyncError: weight sync (\d+) is wrong on (\d+) of (\d+) ranks .*?First: rank (\d+), sync \d+: (\S+) -> "
)
STEP_LINE = re.compile(r"\bstep:(\d+) - ")


def plan_for(name: str, base: Plan) -> Plan:
    rollout_faults.get(name)  # unknown names fail before anything starts
    return dataclasses.replace(
        base,
        total_steps=FAULT_STEP,
        save_freq=1,
        test_freq=FAULT_STEP + 1,
        min_reward_rise=None,
        rollout_fault=f"{name}@{FAULT_STEP}",
    )


def drive(session: Session, name: str) -> tuple[int, float]:
    """Wait for the engine to plant ``name``, then for every process of the run to be gone: (exit code, seconds)."""
    head, log = session.driver, session.logs[0]
    wait_for(lambda: PLANTED.search(read_log(log)), f"the engine to plant {name}", 900, head, log)
    planted_at = time.monotonic()
    log_progress(f"planted {name} in weight sync {FAULT_STEP}; waiting for the guard")
    stop_s = faults.time_to_stop(head, lambda: faults.worker_pids(session.out), planted_at, log, STOP_BOUND_S)
    return head.returncode, stop_s


def judge(session: Session, stopped: tuple[int, float], name: str) -> dict[str, object]:
    code, stop_s = stopped
    log = session.logs[0]
    verdict = judge_stop(read_log(log), log, session.out, name, code, stop_s)
    return {"rollout_fault": verdict, "vllm_groups": check_records(session.out / "lifecycle", check_vllm_groups)}


def judge_stop(text: str, log: Path, out: Path, name: str, code: int, stop_s: float) -> dict[str, object]:
    """The run stopped in the planted step, before its checkpoint, and said why: the guard, with the statistics above
    their stop levels, or vLLM's weight loader refusing the planted sync (a layout it cannot take), naming the
    tensor."""
    stopped, refused, checked = STOPPED.search(text), REFUSED.search(text), CHECKED.search(text)
    if code == 0 or (stopped is None and refused is None and checked is None):
        raise RehearsalError(
            f"the planted rollout fault {name} did not stop the run (exit code {code}, no 'rollout guard: at training "
            f"step ...' error, no weight load refused, no weight sync found wrong): the guard and the weight-sync "
            f"check missed it or are switched off; log: {log}"
        )
    found: dict[str, object]
    if checked is not None:
        sync = int(checked.group(1))
        if sync != FAULT_STEP:
            raise RehearsalError(f"the weight-sync check stopped sync {sync}, the fault was planted in {FAULT_STEP}")
        found = {
            "stopped_by": "the weight-sync check",
            "stopped_in_sync": sync,
            "ranks": f"{checked.group(2)} of {checked.group(3)}",
            "named": checked.group(5),
        }
    elif stopped is not None:
        step = int(stopped.group(1))
        if step != FAULT_STEP:
            raise RehearsalError(
                f"the guard stopped the run in step {step}, the fault was planted in step {FAULT_STEP}"
            )
        statistics = [part.split(" = ")[0] for part in stopped.group(2).split(", ")]
        found = {
            "stopped_by": "the rollout guard",
            "stopped_in_step": step,
            "statistics_above_stop": [s.removeprefix("rollout_guard/") for s in statistics],
        }
    else:
        assert refused is not None
        found = {"stopped_by": "vLLM's weight loader", "stopped_in_sync": FAULT_STEP, "refused": refused.group(1)}
    logged = sorted({int(s) for s in STEP_LINE.findall(text)})
    if FAULT_STEP in logged:
        raise RehearsalError(
            f"step {FAULT_STEP} was logged as a finished step although the run was stopped in it; log: {log}"
        )
    checkpoints = sorted(p.name for p in (out / "checkpoints").glob("global_step_*"))
    if f"global_step_{FAULT_STEP}" in checkpoints:
        raise RehearsalError(f"global_step_{FAULT_STEP} was saved although that step was stopped: {checkpoints}")
    return {"name": name, **found, "time_to_stop_s": stop_s, "checkpoints_left": checkpoints, "exit_code": code}
