"""``r1-ascend rehearse --rollout-fault NAME``: a planted rollout fault must stop the real run at the step it hits.

A fault of the weights (planted in the actor's export stream, vLLM's loader or vLLM's parameters) runs on a plan of
``WEIGHT_FAULT_SYNC`` steps whose CPU rollout engine plants ``NAME`` (r1_ascend.rehearse.rollout_faults) into weight
sync ``WEIGHT_FAULT_SYNC``, the first after a release / resume: the weight-sync check (``verl_weight_sync_check``)
must stop that sync, before anything is generated from it, with ``WeightSyncError`` naming the sync, the ranks and
the tensor. A fault the check cannot see (the sampler), or a weight fault with the check switched off, is planted into
sync ``FAULT_STEP``: the first step the rollout guard gates at the levels it calibrated over the steps before (the
shipped settings); the guard must stop that step with ``RolloutActorMismatchError`` naming it and the statistics
above their stop levels (or, for a layout vLLM's loader cannot take, the loader must refuse that sync with
``WeightSyncError`` naming the tensor). Always before the planted step is checkpointed, every process of the run gone
within ``STOP_BOUND_S`` of the planted sync, the checkpoint of the step before the last one. With the mechanisms
switched off the same run trains on to the end: nothing else notices.

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

from r1_ascend import envs
from r1_ascend.rehearse import faults, rollout_faults
from r1_ascend.rehearse.cluster import wait_for
from r1_ascend.rehearse.config import Plan, guard_config
from r1_ascend.rehearse.lifecycle import check_records, check_vllm_groups
from r1_ascend.rehearse.progress import RehearsalError, log_progress, read_log
from r1_ascend.rehearse.session import Session

#: The weight sync (= training step, before the first validation) a fault the guard must stop is planted in: the
#: first step the shipped settings gate at calibrated levels.
FAULT_STEP = guard_config().calibration.steps + 1
#: The weight sync a fault the weight-sync check must stop is planted in: the first after a release / resume (the
#: check needs no calibration).
WEIGHT_FAULT_SYNC = 2
#: The patch whose check stops a weight fault at its sync.
WEIGHT_CHECK = "verl_weight_sync_check"
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
#: The weight-sync check's stop (patch verl_weight_sync_check): the sync, the ranks, the first rank's tensor
CHECKED = re.compile(
    r"WeightSyncError: weight sync (\d+) is wrong on (\d+) of (\d+) ranks .*?First: rank (\d+), sync \d+: (\S+) -> "
)
#: patch verl_rollout_model_config's error (r1_ascend.patches.rules.model_config.mismatch_message)
CONFIG_REFUSED = re.compile(
    r"RolloutModelConfigError: .*?in \d+ field\(s\) that change what the model computes: (.*?)\. The"
)
CONFIG_FIELD = re.compile(r"(\w+): actor (.*?), rollout engine (.*?)(?:; |$)")
STEP_LINE = re.compile(r"\bstep:(\d+) - ")


def is_engine_config_fault(name: str) -> bool:
    return rollout_faults.get(name).engine_overrides is not None


def weight_check_on() -> bool:
    """Whether the weight-sync check runs in the rehearsal's run (it hands its ``R1_ASCEND_DISABLE`` to the run)."""
    return WEIGHT_CHECK not in envs.disabled_patch_names() and not envs.disable_all()


def weight_checked(name: str) -> bool:
    """Whether the weight-sync check is the mechanism that must stop ``name``: a fault of the weights (not of the
    engine's configuration or sampler), with the check switched on."""
    return rollout_faults.get(name).where != "config" and weight_check_on()


def fault_step(name: str) -> int:
    """The weight sync ``name`` is planted in (the training step it must be stopped in)."""
    return WEIGHT_FAULT_SYNC if weight_checked(name) else FAULT_STEP


def plan_for(name: str, base: Plan) -> Plan:
    rollout_faults.get(name)  # unknown names fail before anything starts
    if is_engine_config_fault(name):
        return dataclasses.replace(
            base, total_steps=1, save_freq=1, test_freq=2, min_reward_rise=None, engine_fault=name
        )
    step = fault_step(name)
    return dataclasses.replace(
        base,
        total_steps=step,
        save_freq=step - 1,
        test_freq=step + 1,
        min_reward_rise=None,
        rollout_fault=f"{name}@{step}",
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
    mechanism = "the weight-sync check" if weight_checked(name) else "the guard"
    log_progress(f"planted {name} in weight sync {fault_step(name)}; waiting for {mechanism}")
    stop_s = faults.time_to_stop(head, lambda: faults.worker_pids(session.out), planted_at, log, STOP_BOUND_S)
    return head.returncode, stop_s


def judge(session: Session, stopped: tuple[int, float], name: str) -> dict[str, object]:
    code, stop_s = stopped
    log = session.logs[0]
    verdict = judge_stop(read_log(log), log, session.out, name, code, stop_s)
    return {"rollout_fault": verdict, "vllm_groups": check_records(session.out / "lifecycle", check_vllm_groups)}


def judge_stop(text: str, log: Path, out: Path, name: str, code: int, stop_s: float) -> dict[str, object]:
    """The run stopped in the planted step, before its checkpoint, and said why: the weight-sync check, naming the
    sync, the ranks and the tensor; the guard, with the statistics above their stop levels; or vLLM's weight loader
    refusing the planted sync (a layout it cannot take), naming the tensor. For an engine-configuration fault, the
    model-configuration check at the engine's build, naming the field, before any step."""
    if is_engine_config_fault(name):
        return _judge_config_refusal(text, log, out, name, code, stop_s)
    step = fault_step(name)
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
        if sync != step:
            raise RehearsalError(f"the weight-sync check stopped sync {sync}, the fault was planted in {step}")
        found = {
            "stopped_by": "the weight-sync check",
            "stopped_in_sync": sync,
            "ranks": f"{checked.group(2)} of {checked.group(3)}",
            "named": checked.group(5),
        }
    elif stopped is not None:
        stopped_step = int(stopped.group(1))
        if stopped_step != step:
            raise RehearsalError(
                f"the guard stopped the run in step {stopped_step}, the fault was planted in step {step}"
            )
        statistics = [part.split(" = ")[0] for part in stopped.group(2).split(", ")]
        found = {
            "stopped_by": "the rollout guard",
            "stopped_in_step": stopped_step,
            "statistics_above_stop": [s.removeprefix("rollout_guard/") for s in statistics],
        }
    else:
        assert refused is not None
        found = {"stopped_by": "vLLM's weight loader", "stopped_in_sync": step, "refused": refused.group(1)}
    _not_finished(text, log, step)
    checkpoints = sorted(p.name for p in (out / "checkpoints").glob("global_step_*"))
    if f"global_step_{step}" in checkpoints:
        raise RehearsalError(f"global_step_{step} was saved although that step was stopped: {checkpoints}")
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
