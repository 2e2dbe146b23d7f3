"""The rehearsal's scenarios, and the one runner that runs each.

A scenario is data: the plan it runs (:attr:`Scenario.plan`), what it does while the cluster is up (``drive``:
plant, kill, wait, relaunch), the verdicts over what the run left (``judge``) and how its summary reads (``show``).
:func:`run_scenario` does the rest the same way for every one of them: set up the output directory and the
simulated nodes, start the cluster (the head execs the recipe's entry point), drive, stop every process it started
by recorded pid whatever happened, judge.

Adding a fault class means a planting function (``faults``, ``process_faults``, ``rollout_faults`` or the MoE
faults) and its entry in :func:`scenario_for`; the runner, the cluster and the summary file stay as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r1_ascend.rehearse import (
    control_run,
    fault_run,
    moe_fault_run,
    plain_run,
    process_faults,
    resume,
    rollout_fault_run,
)
from r1_ascend.rehearse.budget import RssSampler
from r1_ascend.rehearse.cluster import start_cluster, stop_cluster
from r1_ascend.rehearse.config import Plan
from r1_ascend.rehearse.faults import MOE_FAULTS, plan_for
from r1_ascend.rehearse.progress import log_progress
from r1_ascend.rehearse.session import Session, fresh_session
from r1_ascend.rehearse.summary import print_control, print_outcome, print_resume_summary, print_summary

Setup = Callable[[Path, Plan, "Path | None", RssSampler], Session]


#: The progress line once the head has started run 1; a fault scenario adds what it plants.
RUN_1 = "run 1: the head runs the recipe entry point (log {log})"


def _same_plan(plan: Plan) -> Plan:
    return plan


@dataclass(frozen=True)
class Scenario:
    """One way to rehearse. ``variant`` names its summary file (``summary-<variant>.json``; the plain run has
    none); ``announce`` is the progress line once the head started, formatted with the session's ``log``, ``plan``
    and ``context``."""

    variant: str | None
    drive: Callable[[Session], Any]
    judge: Callable[[Session, Any], dict[str, object]]
    show: Callable[[dict[str, object]], None]
    announce: str = RUN_1
    plan: Callable[[Plan], Plan] = _same_plan
    setup: Setup = fresh_session


def run_scenario(
    scenario: Scenario, out: Path, base: Plan, sampler: RssSampler, weights: Path | None
) -> dict[str, object]:
    """Set up, start the cluster, drive, stop everything started (recorded pids), judge: the scenario's summary."""
    session = scenario.setup(out, scenario.plan(base), weights, sampler)
    try:
        session.head = start_cluster(session.cluster, session.logs[0])
        log_progress(scenario.announce.format(log=session.logs[0], plan=session.plan, **session.context))
        evidence = scenario.drive(session)
    finally:
        log_progress("stopping the drivers and the Ray nodes (recorded pids)")
        stop_cluster(session.cluster)
    return scenario.judge(session, evidence)


PLAIN = Scenario(None, plain_run.drive, plain_run.judge_plain, print_summary)


def fault_scenario(name: str) -> Scenario:
    """``--fault NAME``: a checkpoint or process fault (stop clearly, resume), or a MoE fault (the expert verdicts
    must name it)."""
    if name in MOE_FAULTS:
        return Scenario(
            name,
            functools.partial(moe_fault_run.drive, name=name),
            functools.partial(moe_fault_run.judge, name=name),
            functools.partial(print_outcome, "fault", "caught", keys=("wall_s",)),
            announce=f"{RUN_1}; MoE fault {name}",
            plan=functools.partial(moe_fault_run.plan_for, name),
        )
    keys = ("resumed_from_step", "steps_run", "lifecycle", "checkpoint_loads", "checkpoints_kept", "wall_s")
    return Scenario(
        name,
        functools.partial(fault_run.drive, fault=name),
        functools.partial(fault_run.judge_fault, fault=name),
        functools.partial(print_outcome, "fault", "ok", keys=keys),
        announce=f"{RUN_1}; fault {name}",
        plan=functools.partial(process_faults.plan_for if name in process_faults.PROCESS_FAULTS else plan_for, name),
    )


def rollout_fault_scenario(name: str) -> Scenario:
    """``--rollout-fault NAME``: the weight-sync check (a fault of the weights) or the rollout guard must stop the run
    at the planted sync (a fault of the engine's configuration: the model-configuration check, when the engine is
    built)."""
    engine = rollout_fault_run.is_engine_config_fault(name)
    return Scenario(
        name,
        functools.partial(rollout_fault_run.drive, name=name),
        functools.partial(rollout_fault_run.judge, name=name),
        functools.partial(
            print_outcome, "rollout_fault", "stopped in the planted step", keys=("vllm_groups", "wall_s")
        ),
        announce=RUN_1
        + ("; {plan.engine_fault} in the engine's hf_overrides" if engine else "; rollout fault {plan.rollout_fault}"),
        plan=functools.partial(rollout_fault_run.plan_for, name),
    )


def control_scenario(name: str) -> Scenario:
    """``--lr 0`` or ``--shuffle-rewards``: one launch of the plain plan, nothing killed; the reward must stay flat."""
    return Scenario(
        f"control-{name}",
        control_run.drive,
        functools.partial(control_run.judge, control=name),
        print_control,
        announce=f"{RUN_1}; control run ({name}): the reward must not rise",
    )


def resume_scenario(extra: list[str]) -> Scenario:
    """``--resume [key=value ...]``: the next run of the interrupted rehearsal in the output directory."""

    def setup(out: Path, _plan: Plan, _weights: Path | None, sampler: RssSampler) -> Session:
        return resume.setup(out, extra, sampler)

    return Scenario(
        "resume",
        resume.drive,
        resume.judge,
        print_resume_summary,
        announce="run {index}: the head runs the rehearsal's launch script again (log {log}); expected resume: "
        "{expected}",
        setup=setup,
    )


def scenario_for(
    *, fault: str | None, rollout_fault: str | None, resume_with: list[str] | None, control: str | None = None
) -> Scenario:
    """The scenario the command's arguments name (they were checked to name at most one)."""
    if resume_with is not None:
        return resume_scenario(resume_with)
    if control:
        return control_scenario(control)
    if rollout_fault:
        return rollout_fault_scenario(rollout_fault)
    if fault:
        return fault_scenario(fault)
    return PLAIN
