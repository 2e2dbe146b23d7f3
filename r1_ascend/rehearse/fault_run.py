"""``r1-ascend rehearse --fault NAME``: the rehearsal on a shorter plan with one checkpoint fault planted
(r1_ascend.rehearse.faults), then the next launch and the run's verdicts.

``kill-during-save`` and ``disk-full`` relaunch on the same cluster, as the plain rehearsal does after its kill, and
the resumed run must pass the plain rehearsal's verdicts from the last complete checkpoint (steps, lifecycle, the
checkpoint every worker loaded, preludes, finite metrics) and end with only the kept checkpoints, complete.
``corrupt-latest`` ends with the refused relaunch: following its printed fix is ``r1-ascend rehearse --resume``.
"""

from __future__ import annotations

import time
from pathlib import Path

from r1_ascend.rehearse import faults, process_faults, training
from r1_ascend.rehearse.budget import RssSampler
from r1_ascend.rehearse.cluster import (
    kill_mid_step,
    new_cluster,
    node_dir,
    node_pid_files,
    prepare,
    rejoin_node,
    relaunch,
    start_cluster,
    start_driver,
    stop_cluster,
)
from r1_ascend.rehearse.config import Plan, node_ip
from r1_ascend.rehearse.progress import log_progress, read_log
from r1_ascend.rehearse.verdicts import check_joined, judge


def rehearse_fault(out: Path, fault: str, plan: Plan, sampler: RssSampler, weights: Path | None) -> dict[str, object]:
    launch = prepare(out, plan, weights)
    cluster = new_cluster(out, plan, launch, sampler)
    logs = [out / "run1.log", out / "run2.log"]
    try:
        head = start_cluster(cluster, logs[0])
        log_progress(f"run 1: the head runs the recipe entry point (log {logs[0]}); fault {fault}")
        if fault == "corrupt-latest":
            killed_step, killed = kill_mid_step(head, out, plan, logs[0], after_step=2 * plan.save_freq)
            cut = faults.corrupt_latest(out, plan)
            log_progress(f"killed in step {killed_step}; truncated {cut['truncated']} ({cut['bytes']} bytes)")
            log_progress(f"run 2: relaunching onto the truncated checkpoint (log {logs[1]}); it must refuse")
            since = time.monotonic()
            outcome = faults.check_refusal(start_driver(cluster, launch, logs[1]), out, logs[1], cut, since, killed)
        elif fault in process_faults.PROCESS_FAULTS:
            last = node_ip(plan.nodes - 1)
            pid_file = node_dir(out, last) / f"ray-worker-{last}.pid"
            scope = process_faults.RunScope(cluster.temp_dir, cluster.began, node_pid_files(cluster))
            outcome = process_faults.plant(fault, head, out, plan, logs[0], pid_file, last, scope)
            log_progress(f"{fault}: stopped {outcome.stop_s} s after the fault: {outcome.seen['error'][:300]}")
            if process_faults.PROCESS_FAULTS[fault].node:
                log_progress(f"node {last} rejoins the cluster")
                rejoin_node(cluster, cluster.envs[-1])
            log_progress(f"run 2: relaunching (log {logs[1]})")
            relaunch(cluster, launch, logs[1], timeout=900)
        else:
            plant = faults.kill_during_save if fault == "kill-during-save" else faults.disk_full
            outcome = plant(head, out, plan, logs[0])
            log_progress(f"{fault}: stopped {outcome.stop_s} s after the fault; run 2: relaunching (log {logs[1]})")
            relaunch(cluster, launch, logs[1], timeout=900)
    finally:
        log_progress("stopping the drivers and the Ray nodes (recorded pids)")
        stop_cluster(cluster)
    summary: dict[str, object] = {"ray_temp_dir": cluster.temp_dir, "netns": cluster.netns}
    if fault == "corrupt-latest":
        summary["nodes_joined"], summary["npus_seen"] = check_joined(read_log(logs[0]), plan, logs[0])
    else:
        summary.update(judge(out, logs, plan, outcome.step, outcome.killed_pids, expected_from=outcome.resume_from))
        metrics = training.step_metrics(logs)
        training.check_finite(metrics, logs)
        summary["checkpoints_kept"] = faults.check_kept(out, plan)
    summary["fault"] = {
        "name": fault,
        "step": outcome.step,
        "last_complete_checkpoint": outcome.resume_from,
        "time_to_stop_s": outcome.stop_s,
        **outcome.seen,
    }
    return summary


def print_fault_summary(summary: dict[str, object]) -> None:
    keys = ("resumed_from_step", "steps_run", "lifecycle", "checkpoint_loads", "checkpoints_kept", "wall_s")
    print_outcome("fault", "ok", summary, keys)


def print_outcome(kind: str, verdict: str, summary: dict[str, object], keys: tuple[str, ...]) -> None:
    """``summary[kind]`` (a fault's outcome, with its ``name``) line by line, then the run's ``keys`` it has."""
    fault = summary[kind]
    assert isinstance(fault, dict)
    print(f"rehearse --{kind.replace('_', '-')} {fault['name']}: {verdict}")
    rows = [(key, value) for key, value in fault.items() if key != "name"]
    rows += [(key, summary[key]) for key in keys if key in summary]
    for key, value in rows:
        print(f"  {key + ':':28} {value}")
