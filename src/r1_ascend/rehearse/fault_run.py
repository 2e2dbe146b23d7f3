"""``r1-ascend rehearse --fault NAME``: what the scenario of a checkpoint or process fault does while the cluster runs
(plant the fault from r1_ascend.rehearse.faults or process_faults, then the next launch) and its verdicts; the
runner is r1_ascend.rehearse.scenarios.

``kill-during-save`` and ``disk-full`` relaunch on the same cluster, as the plain rehearsal does after its kill, and
the resumed run must pass the plain rehearsal's verdicts from the last complete checkpoint (steps, lifecycle, the
checkpoint every worker loaded, preludes, finite metrics) and end with only the kept checkpoints, complete.
``corrupt-latest`` ends with the refused relaunch: following its printed fix is ``r1-ascend rehearse --resume``.
"""

from __future__ import annotations

import time

from r1_ascend.rehearse import faults, process_faults, training
from r1_ascend.rehearse.cluster import (
    kill_mid_step,
    node_dir,
    node_pid_files,
    rejoin_node,
    relaunch,
    start_driver,
)
from r1_ascend.rehearse.config import node_ip
from r1_ascend.rehearse.progress import log_progress, read_log
from r1_ascend.rehearse.session import Session
from r1_ascend.rehearse.verdicts import check_joined, judge


def drive(session: Session, fault: str) -> faults.FaultOutcome:
    """Plant ``fault`` in run 1, then relaunch (``corrupt-latest``: relaunch onto the truncated checkpoint, which
    must refuse)."""
    out, plan, cluster, logs, head = session.out, session.plan, session.cluster, session.logs, session.driver
    if fault == "corrupt-latest":
        killed_step, killed = kill_mid_step(head, out, plan, logs[0], after_step=2 * plan.save_freq)
        cut = faults.corrupt_latest(out, plan)
        log_progress(f"killed in step {killed_step}; truncated {cut['truncated']} ({cut['bytes']} bytes)")
        log_progress(f"run 2: relaunching onto the truncated checkpoint (log {logs[1]}); it must refuse")
        since = time.monotonic()
        return faults.check_refusal(start_driver(cluster, logs[1]), out, logs[1], cut, since, killed)
    if fault in process_faults.PROCESS_FAULTS:
        last = node_ip(plan.nodes - 1)
        pid_file = node_dir(out, last) / f"ray-worker-{last}.pid"
        scope = process_faults.RunScope(cluster.temp_dir, cluster.began, node_pid_files(cluster))
        outcome = process_faults.plant(fault, head, out, plan, logs[0], pid_file, last, scope)
        log_progress(f"{fault}: stopped {outcome.stop_s} s after the fault: {outcome.seen['error'][:300]}")
        if process_faults.PROCESS_FAULTS[fault].node:
            log_progress(f"node {last} rejoins the cluster")
            rejoin_node(cluster, cluster.envs[-1])
        log_progress(f"run 2: relaunching (log {logs[1]})")
    else:
        plant = faults.kill_during_save if fault == "kill-during-save" else faults.disk_full
        outcome = plant(head, out, plan, logs[0])
        log_progress(f"{fault}: stopped {outcome.stop_s} s after the fault; run 2: relaunching (log {logs[1]})")
    relaunch(cluster, logs[1], timeout=900)
    return outcome


def judge_fault(session: Session, outcome: faults.FaultOutcome, fault: str) -> dict[str, object]:
    """The resumed run's verdicts from the last complete checkpoint (``corrupt-latest``: the refusal was judged
    while it ran), then the fault's own figures."""
    out, plan, logs = session.out, session.plan, session.logs
    summary: dict[str, object] = {"ray_temp_dir": session.cluster.temp_dir, "netns": session.cluster.netns}
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
