"""``r1-ascend rehearse --rollout-fault NAME``: a planted rollout fault must stop the real run at the step it hits.

A fault of the engine's weights or sampling runs on a plan of ``FAULT_STEP`` steps (a checkpoint before the fault's
step) whose CPU rollout engine plants ``NAME`` (r1_ascend.rehearse.rollout_faults) into weight sync ``FAULT_STEP``:
the first step the rollout guard gates at the levels it calibrated over the steps before (the shipped settings).
The guard must stop the run in that step with ``RolloutActorMismatchError`` naming the step and the statistics above
their stop levels, before the step is checkpointed (or, for a layout vLLM's loader cannot take, the loader must
refuse that sync with ``WeightSyncError`` naming the tensor); every process of the run must be gone within
``STOP_BOUND_S`` of the planted sync, and the checkpoint of the step before must be the last one. With the guard
switched off (``R1_ASCEND_DISABLE=verl_rollout_guard``) the same run trains on to the end: nothing else notices.

A fault of the engine's configuration (``routing-ungrouped``, ``yarn-off``: ``RolloutFault.engine_overrides``) is
planted where its class lives: the run's ``actor_rollout_ref.rollout.engine_kwargs.vllm.hf_overrides``, so the
engine is built with it. The model-configuration check (patch ``verl_rollout_model_config``) must refuse the
engine when it is built, before the first step, naming the field and both values.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

from r1_ascend.rehearse import faults, rollout_faults
from r1_ascend.rehearse.cluster import wait_for
from r1_ascend.rehearse.config import Plan, guard_config
from r1_ascend.rehearse.lifecycle import check_records, check_vllm_groups
from r1_ascend.rehearse.progress import RehearsalError, log_progress, read_log
from r1_ascend.rehearse.session import Session

#: The weight sync (= training step, before the first validation) a weight or sampling fault is planted in: the
#: first step the shipped settings gate at calibrated levels.
FAULT_STEP = guard_config().calibration.steps + 1
#: Every process of the run must be gone within this many seconds of the planted sync.
STOP_BOUND_S = 180.0
#: An engine-configuration fault stops the run while the workers build their models: from the head's start, the
#: cluster's and the workers' start-up included.
BUILD_BOUND_S = 600.0
PLANTED = re.compile(r"rollout fault: planted (\S+) .* in weight sync (\d+)")
STOPPED = re.compile(
    r"rollout guard: at training step (\d+) .*?beyond the stop level: (.*?); over (\d+) response tokens"
)
#: ``VLLMLoader``'s error when vLLM's load_weights refuses a tensor of the sync (r1_ascend.cpu.engine)
REFUSED = re.compile(r"WeightSyncError: vLLM's DeepSeek-V3 load_weights \(\w+\) refused '([^']+)'")
#: patch verl_rollout_model_config's error (r1_ascend.patches.rules.model_config.mismatch_message)
CONFIG_REFUSED = re.compile(
    r"RolloutModelConfigError: .*?in \d+ field\(s\) that change what the model computes: (.*?)\. The"
)
CONFIG_FIELD = re.compile(r"(\w+): actor (.*?), rollout engine (.*?)(?:; |$)")
STEP_LINE = re.compile(r"\bstep:(\d+) - ")


def is_engine_config_fault(name: str) -> bool:
    return rollout_faults.get(name).engine_overrides is not None


def plan_for(name: str, base: Plan) -> Plan:
    rollout_faults.get(name)  # unknown names fail before anything starts
    if is_engine_config_fault(name):
        return dataclasses.replace(
            base, total_steps=1, save_freq=1, test_freq=2, min_reward_rise=None, engine_fault=name
        )
    return dataclasses.replace(
        base,
        total_steps=FAULT_STEP,
        save_freq=FAULT_STEP - 1,
        test_freq=FAULT_STEP + 1,
        min_reward_rise=None,
        rollout_fault=f"{name}@{FAULT_STEP}",
    )


def drive(session: Session, name: str) -> tuple[int, float]:
    """Wait for the engine to plant ``name``, then for every process of the run to be gone: (exit code, seconds).
    An engine-configuration fault is in the run's config from the start: the seconds count from the head's start."""
    head, log = session.driver, session.logs[0]
    if is_engine_config_fault(name):
        log_progress(f"{name} is in the engine's hf_overrides; waiting for the model-configuration check")
        started = time.monotonic()
        stop_s = faults.time_to_stop(head, lambda: faults.worker_pids(session.out), started, log, BUILD_BOUND_S)
        return head.returncode, stop_s
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
    tensor; for an engine-configuration fault, the model-configuration check at the engine's build, naming the
    field, before any step."""
    if is_engine_config_fault(name):
        return _judge_config_refusal(text, log, out, name, code, stop_s)
    stopped, refused = STOPPED.search(text), REFUSED.search(text)
    if code == 0 or (stopped is None and refused is None):
        raise RehearsalError(
            f"the planted rollout fault {name} did not stop the run (exit code {code}, no 'rollout guard: at training "
            f"step ...' error and no weight load refused): the guard missed it or is switched off; log: {log}"
        )
    found: dict[str, object]
    if stopped is not None:
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
    _not_finished(text, log, FAULT_STEP)
    checkpoints = sorted(p.name for p in (out / "checkpoints").glob("global_step_*"))
    if f"global_step_{FAULT_STEP}" in checkpoints:
        raise RehearsalError(f"global_step_{FAULT_STEP} was saved although that step was stopped: {checkpoints}")
    return {"name": name, **found, "time_to_stop_s": stop_s, "checkpoints_left": checkpoints, "exit_code": code}


def _not_finished(text: str, log: Path, step: int) -> None:
    logged = sorted({int(s) for s in STEP_LINE.findall(text)})
    if step in logged:
        raise RehearsalError(
            f"step {step} was logged as a finished step although the run was stopped in it; log: {log}"
        )


def _judge_config_refusal(text: str, log: Path, out: Path, name: str, code: int, stop_s: float) -> dict[str, object]:
    refused = CONFIG_REFUSED.search(text)
    if code == 0 or refused is None:
        raise RehearsalError(
            f"the rollout engine built with {name} in its hf_overrides was not refused (exit code {code}, no "
            f"RolloutModelConfigError): the model-configuration check missed it or is switched off; log: {log}"
        )
    fields = [match.group(1) for match in CONFIG_FIELD.finditer(refused.group(1))]
    _not_finished(text, log, 1)
    checkpoints = sorted(p.name for p in (out / "checkpoints").glob("global_step_*"))
    if checkpoints:
        raise RehearsalError(f"checkpoints were saved although the engine was refused at its build: {checkpoints}")
    return {
        "name": name,
        "stopped_by": "the model-configuration check (patch verl_rollout_model_config)",
        "stopped_in_step": 0,
        "fields": fields,
        "time_to_stop_s": stop_s,
        "checkpoints_left": checkpoints,
        "exit_code": code,
    }
