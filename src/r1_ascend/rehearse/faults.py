"""Checkpoint faults planted in the rehearsal's real run: ``r1-ascend rehearse --fault NAME``.

A fault run is the rehearsal on a shorter plan (:func:`plan_for`: a checkpoint every step, 2 or 3 steps) with one
fault planted at a moment it observes in the run, never at a guessed time:

- ``kill-during-save``: SIGKILL the driver once ``global_step_2`` exists on disk while the tracker still names step 1
  (the save of step 2 is under way; one checkpoint kept, as the 671B config keeps one); the relaunch must resume from
  ``global_step_1``;
- ``disk-full``: after the step-1 checkpoint, every training worker (and the writer processes megatron-core forks
  from it) may write files of at most 4 MiB (``RLIMIT_FSIZE``: a write past it fails with EFBIG, as a write to a full
  disk fails with ENOSPC); the step-2 save fails, the run must stop with an error naming the intact
  ``global_step_1``, and the relaunch resumes from it;
- ``corrupt-latest`` (two checkpoints kept): kill the driver in step 3, truncate a shard of the newest checkpoint
  (``global_step_2``) to half its size, relaunch: the run must refuse before any worker loads a checkpoint, naming
  the broken file and ``global_step_1``; following the printed fix (``r1-ascend rehearse --resume`` with its
  overrides) resumes from ``global_step_1``.

Each measures the time from the fault to the moment no process of the faulted run is left (the driver and every
worker that wrote a lifecycle record), and fails when a process outlives its bound.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from r1_ascend.patches.rules.checkpoints import inspect_step, read_tracker
from r1_ascend.rehearse.config import FAULT_BATCH, Plan
from r1_ascend.rehearse.lifecycle import read_lifecycle

FAULTS = ("kill-during-save", "disk-full", "corrupt-latest")
#: The process faults (r1_ascend.rehearse.process_faults), planted in the same short plan as kill-during-save.
PROCESS_FAULTS = ("kill-actor-worker", "kill-rollout", "hang", "node-loss")
#: The MoE faults (r1_ascend.rehearse.moe_fault_run): no process fails; the rehearsal's expert verdicts must.
MOE_FAULTS = ("dead-expert", "stale-bias")
#: Largest file a worker may write under ``disk-full`` (a rank's shard of the rehearsal's model is ~21 MB; its logs
#: stay well below this).
FSIZE_LIMIT = 4 * 1024 * 1024
#: A faulted run must have stopped every process within this many seconds of the fault.
STOP_BOUND_S = 120.0
#: A relaunch onto a broken checkpoint must have stopped within this many seconds of its start (Ray, the driver
#: and the TaskRunner start first; the recipe checks the checkpoint before the workers are built).
RELAUNCH_BOUND_S = 120.0
#: How often the checkpoint directory is polled for a save under way.
POLL_S = 0.02


class FaultError(RuntimeError):
    """The fault could not be planted, or the run did not react to it as it must."""


@dataclass
class FaultOutcome:
    """What a planted fault did: the step it hit, the workers of the faulted run, the time to stop and what was seen."""

    fault: str
    step: int
    resume_from: int
    killed_pids: set[int]
    stop_s: float
    seen: dict[str, object] = field(default_factory=dict)


def plan_for(fault: str, base: Plan) -> Plan:
    """The shorter plan a fault runs, a checkpoint every step: kill-during-save and disk-full run 2 steps and keep one
    checkpoint, as the 671B config keeps one (the fault hits the save of step 2); corrupt-latest runs 3 and keeps two,
    so that a complete checkpoint (step 1) remains beside the one it truncates (step 2)."""
    steps = 3 if fault == "corrupt-latest" else 2
    return dataclasses.replace(
        base,
        total_steps=steps,
        save_freq=1,
        test_freq=steps,
        max_ckpt_to_keep=steps - 1,
        min_reward_rise=None,
        **FAULT_BATCH,
    )


def wait_until(predicate, what: str, timeout: float, poll: float = 0.5) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(poll)
    raise FaultError(f"{what}: not reached within {timeout:g} s")


def running(pids: set[int]) -> set[int]:
    """The ``pids`` still running (a zombie has ended)."""
    alive = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def _describe(pid: int) -> str:
    try:
        process = psutil.Process(pid)
        return f"pid {pid} (parent {process.ppid()}): {' '.join(process.cmdline())[:120] or process.name()}"
    except psutil.Error:
        return f"pid {pid}"


def worker_pids(out: Path) -> set[int]:
    return {int(e["pid"]) for e in read_lifecycle(out / "lifecycle")}


def time_to_stop(
    driver: subprocess.Popen, workers: Callable[[], set[int]], since: float, log: Path, bound: float
) -> float:
    """Seconds from ``since`` (monotonic) until the driver exited and no worker of its run (``workers()``, asked
    once the driver is gone) is left; at most ``bound`` (else FaultError naming what still runs)."""
    try:
        driver.wait(max(since + bound - time.monotonic(), 1.0))
    except subprocess.TimeoutExpired:
        msg = f"the driver (pid {driver.pid}) still runs {bound:g} s after the fault; log: {log}"
        raise FaultError(msg) from None
    pids = workers()
    try:
        wait_until(lambda: not running(pids), "workers to exit", max(since + bound - time.monotonic(), 1.0), poll=0.1)
    except FaultError:
        left = "; ".join(_describe(pid) for pid in sorted(running(pids)))
        msg = f"processes of the run still run {bound:g} s after the fault: {left}; log: {log}"
        raise FaultError(msg) from None
    return round(time.monotonic() - since, 1)


def _checkpoints(out: Path) -> Path:
    return out / "checkpoints"


def _saving(out: Path, step: int, tracked: int) -> bool:
    return (_checkpoints(out) / f"global_step_{step}").exists() and read_tracker(_checkpoints(out)) == tracked


def wait_for_tracked_step(out: Path, step: int, driver: subprocess.Popen, log: Path) -> None:
    def tracked() -> bool:
        if driver.poll() is not None:
            raise FaultError(f"run 1 exited with {driver.returncode} before the checkpoint of step {step}; log: {log}")
        found = read_tracker(_checkpoints(out))
        return isinstance(found, int) and found >= step

    wait_until(tracked, f"the checkpoint of step {step}", 900)


def kill_during_save(driver: subprocess.Popen, out: Path, plan: Plan, log: Path) -> FaultOutcome:
    """SIGKILL the driver while ``global_step_<2 x save_freq>`` is being written."""
    first, second = plan.save_freq, 2 * plan.save_freq
    wait_for_tracked_step(out, first, driver, log)
    wait_until(
        lambda: _saving(out, second, first) or driver.poll() is not None, f"the save of step {second}", 600, POLL_S
    )
    if driver.poll() is not None or not _saving(out, second, first):
        raise FaultError(f"missed the save of step {second} (the tracker moved on or the run ended); log: {log}")
    workers = worker_pids(out)
    driver.send_signal(signal.SIGKILL)
    since = time.monotonic()
    partial = inspect_step(_checkpoints(out) / f"global_step_{second}")
    previous = inspect_step(_checkpoints(out) / f"global_step_{first}")
    seen = {
        "killed_while": f"global_step_{second}: " + ("; ".join(partial.problems) or "all files written, tracker not"),
        "previous_checkpoint_at_kill": "complete" if previous.complete else "; ".join(previous.problems),
    }
    stop_s = time_to_stop(driver, lambda: workers, since, log, STOP_BOUND_S)
    outcome = FaultOutcome("kill-during-save", second, first, workers, stop_s, seen)
    require_complete(out, first, "after the kill during the save")
    return outcome


def disk_full(driver: subprocess.Popen, out: Path, plan: Plan, log: Path) -> FaultOutcome:
    """Cap the workers' file size after the first checkpoint; the next save must fail with a clear error."""
    first, second = plan.save_freq, 2 * plan.save_freq
    wait_for_tracked_step(out, first, driver, log)
    workers = worker_pids(out)
    for pid in workers:
        process = psutil.Process(pid)
        _, hard = process.rlimit(psutil.RLIMIT_FSIZE)
        process.rlimit(psutil.RLIMIT_FSIZE, (FSIZE_LIMIT, hard))
    wait_until(
        lambda: _saving(out, second, first) or driver.poll() is not None, f"the save of step {second}", 600, POLL_S
    )
    since = time.monotonic()
    stop_s = time_to_stop(driver, lambda: workers, since, log, STOP_BOUND_S)
    error = last_error_line(log, "CheckpointSaveError: ")
    if driver.returncode == 0 or not error:
        raise FaultError(
            f"the save of step {second} under a {FSIZE_LIMIT} byte file-size limit did not stop the run with a "
            f"CheckpointSaveError (exit code {driver.returncode}); log: {log}"
        )
    if f"the last complete checkpoint is global_step_{first}" not in error:
        raise FaultError(f"the error does not name the intact global_step_{first}: {error[:600]}; log: {log}")
    require_complete(out, first, "after the failed save")
    seen = {"error": error, "exit_code": driver.returncode}
    return FaultOutcome("disk-full", second, first, workers, stop_s, seen)


def corrupt_latest(out: Path, plan: Plan) -> dict[str, object]:
    """Truncate the first shard of the newest checkpoint to half its size; return what was cut."""
    newest = read_tracker(_checkpoints(out))
    if not isinstance(newest, int) or newest < 2:
        raise FaultError(f"corrupt-latest needs two checkpoints, the tracker names {newest!r}")
    shard = sorted((_checkpoints(out) / f"global_step_{newest}" / "actor" / "dist_ckpt").glob("*.distcp"))[0]
    size = shard.stat().st_size
    with shard.open("r+b") as f:
        f.truncate(size // 2)
    return {"truncated": str(shard), "bytes": f"{size} -> {size // 2}", "newest": newest}


def check_refusal(
    driver: subprocess.Popen, out: Path, log: Path, cut: dict[str, object], since: float, before: set[int]
) -> FaultOutcome:
    """The relaunch onto the truncated checkpoint stopped with CheckpointResumeError naming the broken shard and the
    last complete checkpoint, before any of its workers loaded a checkpoint."""
    stop_s = time_to_stop(driver, lambda: worker_pids(out) - before, since, log, RELAUNCH_BOUND_S)
    newest = int(str(cut["newest"]))
    error = last_error_line(log, "CheckpointResumeError: ")
    expected = (f"names step {newest}", Path(str(cut["truncated"])).name, f"global_step_{newest - 1}")
    if driver.returncode == 0 or not all(part in error for part in expected):
        raise FaultError(
            f"the relaunch onto a truncated global_step_{newest} did not stop with a CheckpointResumeError naming "
            f"{', '.join(expected)} (exit code {driver.returncode}; error line: {error[:300]!r}); log: {log}"
        )
    loads = [e for e in read_lifecycle(out / "lifecycle") if e["event"] == "load_checkpoint"]
    if loads:
        raise FaultError(f"workers loaded a checkpoint before the refusal: {loads}; records: {out / 'lifecycle'}")
    seen = {**cut, "error": error, "exit_code": driver.returncode}
    return FaultOutcome("corrupt-latest", newest, newest - 1, before, stop_s, seen)


def last_error_line(log: Path, marker: str) -> str:
    """The last line of ``log`` holding ``marker`` (an exception's ``Name: message``), from the marker on."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if marker in line]
    return lines[-1][lines[-1].index(marker) :].strip() if lines else ""


def require_complete(out: Path, step: int, when: str) -> None:
    state = inspect_step(_checkpoints(out) / f"global_step_{step}")
    if not state.complete:
        raise FaultError(f"the last complete checkpoint was damaged {when}: {state.describe()}")


def check_kept(out: Path, plan: Plan) -> str:
    """After the resumed run: the tracker names the last step, and exactly the newest ``max_ckpt_to_keep`` saves are
    left, each complete (older ones were deleted only once a newer one was complete)."""
    root = _checkpoints(out)
    tracked = read_tracker(root)
    if tracked != plan.total_steps:
        raise FaultError(f"{root / 'latest_checkpointed_iteration.txt'} names {tracked!r}, expected {plan.total_steps}")
    saves = list(range(plan.save_freq, plan.total_steps + 1, plan.save_freq))
    expected = saves[-(plan.max_ckpt_to_keep or len(saves)) :]
    found = sorted(int(p.name.removeprefix("global_step_")) for p in root.glob("global_step_*") if p.is_dir())
    if found != expected:
        raise FaultError(f"checkpoints left under {root}: steps {found}, expected the newest kept ones {expected}")
    for step in found:
        require_complete(out, step, "at the end of the resumed run")
    return f"global_step_{', global_step_'.join(map(str, found))} kept, complete; tracker {tracked}"
