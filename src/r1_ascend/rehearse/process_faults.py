"""Process faults planted in the rehearsal's real run: ``r1-ascend rehearse --fault NAME``.

Each runs the fault plan (2 steps, a checkpoint every step, one kept, as the 671B config keeps one) and hits step 2
once its workers enter a named stage (the stage records patch ``verl_worker_watchdog`` reports), never at a guessed
time:

- ``kill-actor-worker``: SIGKILL one worker in ``update_actor`` (its peers wait in the update's collectives);
- ``kill-rollout``: SIGKILL one worker in ``generate_sequences`` (the rollout engine runs in the worker process);
- ``hang``: SIGSTOP one worker in ``update_actor``: it never dies, so only the watchdog's silence limit stops the run;
- ``node-loss``: SIGKILL the raylet of the last simulated node while a worker is in ``update_actor``: Ray's node
  on it ends, with every process it ran.

The run must stop within its fault's bound (:data:`r1_ascend.rehearse.faults.STOP_BOUND_S`; the hang's is
:data:`HANG_STOP_BOUND_S`, from the watchdog's silence limit) with ``WorkerLostError`` naming the step,
the stage, the worker (or the lost node, without pointing to the OOM killer) and ``global_step_1``; then no process
of the run (driver, workers, what they forked, the lost node's Ray) may be left anywhere on the machine
(r1_ascend.rehearse.leftovers). The relaunch (after the lost node rejoined) must resume from ``global_step_1`` and
pass the plain rehearsal's verdicts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from r1_ascend.patches.rules.checkpoints import tracker_written_at
from r1_ascend.rehearse.config import WATCHDOG, Plan
from r1_ascend.rehearse.fault_hold import release_held_workers
from r1_ascend.rehearse.faults import (
    STOP_BOUND_S,
    FaultError,
    FaultOutcome,
    last_error_line,
    require_complete,
    running,
    time_to_stop,
    wait_for_tracked_step,
    wait_until,
    worker_pids,
)
from r1_ascend.rehearse.faults import plan_for as fault_plan_for
from r1_ascend.rehearse.leftovers import Leftover, node_daemons, run_processes
from r1_ascend.rehearse.lifecycle import read_lifecycle


@dataclass(frozen=True)
class RunScope:
    """How to find every process of the faulted run on this machine: its Ray temp dir, when it began (seconds since
    the epoch) and the nodes' ``ray start`` pid files (their Ray daemons stay up for the relaunch)."""

    temp_dir: str
    began: float
    pid_files: tuple[Path, ...]

    def left(self) -> list[Leftover]:
        """What of the run still runs anywhere on the machine, the live nodes' daemons aside."""
        return run_processes(self.temp_dir, self.began, ignore=node_daemons(self.pid_files))


#: Seconds within which a hang must be stopped: nothing dies, so only the watchdog can stop it, once a worker has been
#: silent for ``silence_s`` (the next poll, a probe of at most 5 s, then the job's processes end: 43 s measured on the
#: 2-core machine, loaded or not).
HANG_STOP_BOUND_S = float(WATCHDOG["silence_s"]) + 45.0


@dataclass(frozen=True)
class ProcessFault:
    """Which stage of step 2 it hits, the signal it sends, whether it takes a whole node, and the seconds within
    which the run must have stopped."""

    stage: str
    signal: signal.Signals
    node: bool = False
    bound_s: float = STOP_BOUND_S


PROCESS_FAULTS: dict[str, ProcessFault] = {
    "kill-actor-worker": ProcessFault("update_actor", signal.SIGKILL),
    "kill-rollout": ProcessFault("generate_sequences", signal.SIGKILL),
    "hang": ProcessFault("update_actor", signal.SIGSTOP, bound_s=HANG_STOP_BOUND_S),
    "node-loss": ProcessFault("update_actor", signal.SIGKILL, node=True),
}
#: The step the faults hit; global_step_<STEP - 1> is the checkpoint the relaunch resumes from.
STEP = 2
#: How long the held survivors wait for the lost node's workers to end (then they go on; what is left is judged).
LOST_WORKERS_S = 30.0


def plan_for(name: str, base: Plan) -> Plan:
    """A fault run's plan (:func:`r1_ascend.rehearse.faults.plan_for`) whose workers wait on entering the fault's
    stage of step ``STEP`` until the fault is planted: this model's stages are shorter than the time between a
    worker's record of entering one and the signal (``update_actor`` 0.6 s), and a fault meant for ``update_actor``
    then hit the next stage."""
    return dataclasses.replace(fault_plan_for(name, base), hold_at=f"{PROCESS_FAULTS[name].stage}@{STEP}")


def stage_entered(out: Path, stage: str, step: int, after: float) -> dict[str, object] | None:
    """The first record of a worker entering ``stage`` in ``step`` (recorded after ``after``), or None."""
    for event in read_lifecycle(out / "lifecycle"):
        if (
            event["event"] == "stage"
            and event.get("stage") == stage
            and event.get("phase") == "enter"
            and event.get("step") == step
            and event["t"] > after
        ):
            return event
    return None


def ray_processes(pid_file: Path) -> set[int]:
    """The ``ray start --block`` process a node's pid file names and every process under it."""
    root = psutil.Process(int(pid_file.read_text().strip()))
    return {root.pid, *(child.pid for child in root.children(recursive=True))}


def with_descendants(pids: set[int]) -> set[int]:
    """``pids`` and every live process under them (processes a worker forked outlive it unless stopped too)."""
    found = set(pids)
    for pid in pids:
        try:
            found.update(child.pid for child in psutil.Process(pid).children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    return found


def _names(pids: set[int]) -> str:
    names: dict[str, int] = {}
    for pid in pids:
        try:
            name = psutil.Process(pid).name()
        except psutil.NoSuchProcess:
            continue
        names[name] = names.get(name, 0) + 1
    return ", ".join(f"{count} x {name}" for name, count in sorted(names.items()))


def raylet_of(pids: set[int]) -> int:
    for pid in pids:
        try:
            if psutil.Process(pid).name() == "raylet":
                return pid
        except psutil.NoSuchProcess:
            continue
    raise FaultError(f"no raylet among the node's Ray processes {sorted(pids)}")


def plant(
    name: str,
    driver: subprocess.Popen,
    out: Path,
    plan: Plan,
    log: Path,
    node_pid_file: Path,
    node_ip: str,
    scope: RunScope,
) -> FaultOutcome:
    """Wait for step ``STEP``'s stage, plant the fault, and measure until nothing of the run is left: the pids it
    recorded, what they forked, the lost node's Ray, and whatever else on the machine belongs to the run
    (``scope``)."""
    fault = PROCESS_FAULTS[name]
    try:
        wait_for_tracked_step(out, STEP - 1, driver, log)
        # from when the tracker was written, not when the poll saw it: step 2's generate_sequences begins 0.1 s after
        # step 1's save, and a later origin missed it (the fault then hit the validation's generation a minute on)
        tracked_at = tracker_written_at(out / "checkpoints")
        entered = wait_until(
            lambda: stage_entered(out, fault.stage, STEP, tracked_at) or driver.poll() is not None,
            f"a worker entering {fault.stage} in step {STEP}",
            600,
            0.05,
        )
        if not isinstance(entered, dict):
            raise FaultError(f"run 1 exited with {driver.returncode} before step {STEP}'s {fault.stage}; log: {log}")
        node_processes = ray_processes(node_pid_file) if fault.node else set()
        victim = raylet_of(node_processes) if fault.node else int(str(entered["pid"]))
        workers = with_descendants(worker_pids(out))
        tree = _names(workers)
        psutil.Process(victim).send_signal(fault.signal)
        since = time.monotonic()
        if fault.node:
            # The lost node's workers outlive their raylet until Ray's check of it ends them (about a second): held,
            # they end in the stage, as on a host that went down, instead of finishing it over gloo meanwhile.
            lost = workers & node_processes
            with contextlib.suppress(FaultError):
                wait_until(lambda: not running(lost), f"the workers of node {node_ip} to end", LOST_WORKERS_S, 0.05)
    finally:  # the held workers go on (the survivors into the collective with the victim), also when planting failed
        release_held_workers(out)
    what = f"the raylet of node {node_ip} (pid {victim})" if fault.node else f"worker pid {victim}"
    try:
        stop_s = time_to_stop(
            driver, lambda: workers | node_processes | {p.pid for p in scope.left()}, since, log, fault.bound_s
        )
    finally:
        if fault.signal == signal.SIGSTOP and psutil.pid_exists(victim):
            # a run that did not stop leaves the stopped process (and what it forked) behind: only SIGKILL reaches it
            stopped = psutil.Process(victim)
            for process in [*stopped.children(recursive=True), stopped]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
    left = scope.left()
    if left:
        listed = "; ".join(p.describe() for p in left)
        raise FaultError(f"{name}: processes of the run still run after it stopped: {listed}; log: {log}")
    error = last_error_line(log, "WorkerLostError: ")
    expected = [f"global_step_{STEP - 1}", f"training step {STEP}", fault.stage]
    expected += [f"node {node_ip} was lost"] if fault.node else [f"pid {victim}"]
    expected += ["watchdog"] if fault.signal == signal.SIGSTOP else []
    misleading = ["OOM killer"] if fault.node else []
    if (
        driver.returncode == 0
        or not all(part in error for part in expected)
        or any(part in error for part in misleading)
    ):
        raise FaultError(
            f"{name}: after {fault.signal.name} to {what} in {fault.stage} the run did not stop with a "
            f"WorkerLostError naming {', '.join(expected)}"
            + (f" and not {', '.join(misleading)}" if misleading else "")
            + f" (exit code {driver.returncode}; error line: {error[:600]!r}); log: {log}"
        )
    require_complete(out, STEP - 1, f"after {name}")
    seen = {
        "signalled": f"{fault.signal.name} to {what} in {fault.stage}",
        "processes_at_fault": tree,
        "processes_left": len(left),
        "error": error,
    }
    return FaultOutcome(name, STEP, STEP - 1, workers, stop_s, seen)
