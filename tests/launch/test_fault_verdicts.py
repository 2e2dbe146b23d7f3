"""The fault runs' verdicts (r1_ascend.rehearse.faults and process_faults) on recorded evidence, without a cluster:
a refused relaunch must name the broken file and the last complete checkpoint and load nothing; the tracker and the
kept checkpoints at the end; the first stage record of a step; a run that does not stop within its bound.

The driver is a stand-in with ``Popen``'s ``wait``/``returncode``/``pid``; processes are this test's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from r1_ascend.rehearse import faults, process_faults
from r1_ascend.rehearse.config import FAULT_BATCH, Plan
from r1_ascend.rehearse.faults import FaultError, check_kept, check_refusal, corrupt_latest, plan_for, time_to_stop

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "patches"))
import checkpoint_fakes as fakes


def finished(returncode: int) -> Any:
    """A driver that has already exited with ``returncode``."""
    return SimpleNamespace(pid=4242, returncode=returncode, wait=lambda timeout=None: returncode)


def still_running() -> Any:
    def wait(timeout: float | None = None) -> int:
        raise subprocess.TimeoutExpired("driver", timeout or 0)

    return SimpleNamespace(pid=4242, returncode=None, wait=wait)


def write_events(out: Path, pid: int, events: list[dict[str, object]]) -> None:
    (out / "lifecycle").mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({"pid": pid, **event}) + "\n" for event in events)
    (out / "lifecycle" / f"lifecycle-{pid}.log").write_text(lines)


# --- the plans ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fault", "steps"), [("kill-during-save", 2), ("disk-full", 2), ("corrupt-latest", 3)])
def test_each_fault_plan_saves_every_step_and_keeps_one_fewer_than_it_runs(fault: str, steps: int) -> None:
    plan = plan_for(fault, Plan(min_reward_rise=0.5, lr=0.25))
    assert (plan.total_steps, plan.save_freq, plan.test_freq, plan.max_ckpt_to_keep) == (steps, 1, steps, steps - 1)
    assert (plan.min_reward_rise, plan.lr) == (None, 0.25)
    # the smaller batch: what a fault run checks needs no learning
    assert {key: getattr(plan, key) for key in FAULT_BATCH} == FAULT_BATCH
    assert (plan.prompts_per_step, plan.samples_per_prompt) != (Plan.prompts_per_step, Plan.samples_per_prompt)


# --- the end of a fault run --------------------------------------------------------------------------------------


def test_the_tracker_must_name_the_last_step(tmp_path: Path) -> None:
    plan = plan_for("corrupt-latest", Plan())
    root = tmp_path / "checkpoints"
    fakes.write_step(root, 2)
    fakes.write_step(root, 3, track=False)
    with pytest.raises(FaultError, match=r"latest_checkpointed_iteration\.txt names 2, expected 3"):
        check_kept(tmp_path, plan)
    (root / fakes.TRACKER).write_text("3")
    assert check_kept(tmp_path, plan) == "global_step_2, global_step_3 kept, complete; tracker 3"


def test_with_no_limit_every_save_is_kept(tmp_path: Path) -> None:
    plan = Plan(total_steps=4, save_freq=2, max_ckpt_to_keep=None)
    root = tmp_path / "checkpoints"
    fakes.write_step(root, 2)
    fakes.write_step(root, 4)
    assert check_kept(tmp_path, plan).startswith("global_step_2, global_step_4 kept")
    (root / "global_step_2").rename(root / "global_step_1")
    with pytest.raises(FaultError, match=r"steps \[1, 4\], expected the newest kept ones \[2, 4\]"):
        check_kept(tmp_path, plan)


def test_a_damaged_kept_checkpoint_is_named(tmp_path: Path) -> None:
    plan = plan_for("kill-during-save", Plan())
    step = fakes.write_step(tmp_path / "checkpoints", 2)
    (step / "data.pt").unlink()
    with pytest.raises(FaultError, match=rf"damaged at the end of the resumed run: {step}: missing data\.pt"):
        check_kept(tmp_path, plan)


# --- corrupt-latest ----------------------------------------------------------------------------------------------


def test_corrupt_latest_halves_the_newest_checkpoints_first_shard(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    fakes.write_step(root, 1)
    newest = fakes.write_step(root, 2)
    shard = sorted((newest / "actor" / "dist_ckpt").glob("*.distcp"))[0]
    size = shard.stat().st_size
    cut = corrupt_latest(tmp_path, plan_for("corrupt-latest", Plan()))
    assert cut == {"truncated": str(shard), "bytes": f"{size} -> {size // 2}", "newest": 2}
    assert shard.stat().st_size == size // 2
    assert fakes.shard(root / "global_step_1").stat().st_size == size  # the older one is intact


@pytest.mark.parametrize("tracked", [None, 1])
def test_corrupt_latest_needs_two_checkpoints(tmp_path: Path, tracked: int | None) -> None:
    if tracked:
        fakes.write_step(tmp_path / "checkpoints", tracked)
    with pytest.raises(FaultError, match=rf"needs two checkpoints, the tracker names {tracked!r}"):
        corrupt_latest(tmp_path, plan_for("corrupt-latest", Plan()))


# --- the relaunch onto the broken checkpoint -----------------------------------------------------------------------


CUT = {"truncated": "/out/checkpoints/global_step_2/actor/dist_ckpt/__0_0.distcp", "bytes": "10 -> 5", "newest": 2}
REFUSAL = (
    "r1-ascend: CheckpointResumeError: latest_checkpointed_iteration.txt names step 2, but global_step_2: "
    "actor/dist_ckpt: shard __0_0.distcp is 5 bytes, .metadata records items up to byte 10: truncated. Fix: "
    "resume from the newest complete checkpoint, global_step_1: ..."
)


def relaunch_log(tmp_path: Path, text: str) -> Path:
    log = tmp_path / "run2.log"
    log.write_text(f"starting\n{text}\n")
    return log


def test_a_refusal_naming_the_broken_shard_and_the_way_back_passes(tmp_path: Path) -> None:
    log = relaunch_log(tmp_path, REFUSAL)
    write_events(tmp_path, 11, [{"t": 1.0, "event": "release"}])  # the killed run's worker: recorded before
    outcome = check_refusal(finished(1), tmp_path, log, CUT, since=0.0, before={11})
    assert (outcome.fault, outcome.step, outcome.resume_from, outcome.killed_pids) == ("corrupt-latest", 2, 1, {11})
    assert outcome.seen["error"] == REFUSAL.removeprefix("r1-ascend: ")
    assert outcome.seen["exit_code"] == 1
    assert isinstance(outcome.stop_s, float)  # measured from the relaunch to its end


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (REFUSAL, 0),  # the relaunch went on
        (REFUSAL.replace("names step 2", "names step 3"), 1),
        (REFUSAL.replace("__0_0.distcp", "__1_0.distcp"), 1),
        (REFUSAL.replace("global_step_1", "global_step_0"), 1),
        ("r1-ascend: RuntimeError: something else", 1),
    ],
    ids=["exit-0", "wrong-step", "wrong-shard", "wrong-way-back", "other-error"],
)
def test_a_refusal_that_does_not_say_what_it_must_fails(tmp_path: Path, text: str, code: int) -> None:
    log = relaunch_log(tmp_path, text)
    with pytest.raises(FaultError, match="did not stop with a CheckpointResumeError naming names step 2, __0_0"):
        check_refusal(finished(code), tmp_path, log, CUT, since=0.0, before=set())


def test_a_worker_that_loaded_before_the_refusal_fails(tmp_path: Path, reaped_pid: Callable[[], int]) -> None:
    log = relaunch_log(tmp_path, REFUSAL)
    write_events(tmp_path, reaped_pid(), [{"t": 5.0, "event": "load_checkpoint", "step": 2}])
    with pytest.raises(FaultError, match="workers loaded a checkpoint before the refusal"):
        check_refusal(finished(1), tmp_path, log, CUT, since=0.0, before=set())


def test_the_last_error_line_counts(tmp_path: Path) -> None:
    log = relaunch_log(tmp_path, "r1-ascend: CheckpointResumeError: an older one\n" + REFUSAL)
    outcome = check_refusal(finished(1), tmp_path, log, CUT, since=0.0, before=set())
    assert str(outcome.seen["error"]).startswith("CheckpointResumeError: latest_checkpointed")


# --- how long the faulted run takes to stop ------------------------------------------------------------------------


def test_a_driver_still_running_after_the_bound_fails(tmp_path: Path) -> None:
    with pytest.raises(FaultError, match=r"the driver \(pid 4242\) still runs 3 s after the fault"):
        time_to_stop(still_running(), set, 0.0, tmp_path / "log", 3.0)


def test_a_worker_still_alive_after_the_bound_fails(tmp_path: Path) -> None:
    import time

    me = os.getpid()
    with pytest.raises(FaultError, match=rf"processes of the run still run 0\.5 s after the fault: pid {me} "):
        time_to_stop(finished(1), lambda: {me}, time.monotonic(), tmp_path / "log", 0.5)


def test_a_run_that_stopped_is_measured_from_the_fault(tmp_path: Path) -> None:
    import time

    since = time.monotonic() - 2.0
    took = time_to_stop(finished(1), set, since, tmp_path / "log", faults.STOP_BOUND_S)
    assert 2.0 <= took < 2.0 + 30


def test_zombies_and_vanished_processes_are_not_waited_for(tmp_path: Path) -> None:
    """A worker that exited but was not reaped yet (a zombie), or is gone, has stopped."""
    import time

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
    assert time_to_stop(finished(1), lambda: {child.pid}, time.monotonic(), tmp_path / "log", 5.0) < 5.0
    child.wait()
    assert time_to_stop(finished(1), lambda: {child.pid}, time.monotonic(), tmp_path / "log", 5.0) < 5.0


def test_the_drivers_wait_is_what_is_left_of_the_bound_since_the_fault(tmp_path: Path) -> None:
    """The bound counts from the fault, not from the call: the wait gets what is left of it, and at least a second."""
    import time

    asked: list[float] = []

    def wait(timeout: float | None = None) -> int:
        asked.append(float("inf") if timeout is None else timeout)
        return 1

    driver = SimpleNamespace(pid=4242, returncode=1, wait=wait)
    time_to_stop(driver, set, time.monotonic() - 5.0, tmp_path / "log", 8.0)
    time_to_stop(driver, set, time.monotonic() - 60.0, tmp_path / "log", 8.0)
    assert 2.0 < asked[0] <= 3.0
    assert asked[1] == 1.0


def test_workers_get_what_is_left_of_the_bound_and_every_one_left_is_named(tmp_path: Path) -> None:
    import time

    exits_soon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    took = time_to_stop(finished(1), lambda: {exits_soon.pid}, time.monotonic(), tmp_path / "log", 20.0)
    exits_soon.wait()
    assert 1.5 <= took < 20.0
    assert took == round(took, 1)
    assert isinstance(took, float)
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
    try:
        with pytest.raises(FaultError) as raised:
            time_to_stop(finished(1), lambda: {p.pid for p in sleepers}, time.monotonic(), tmp_path / "log", 0.3)
        first, second = sorted(p.pid for p in sleepers)
        assert f"still run 0.3 s after the fault: pid {first} " in str(raised.value)
        assert f"; pid {second} " in str(raised.value)
    finally:
        for process in sleepers:
            process.kill()
            process.wait()


def test_a_vanished_pid_does_not_hide_a_running_one(reaped_pid: Callable[[], int]) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for vanished in (reaped_pid(), 1 << 22):
            assert faults.running({vanished, sleeper.pid}) == {sleeper.pid}
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_error_line_is_read_from_a_log_with_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    """A run log holds what the model generated ('12 inte\ufffdtion'): undecodable bytes must not hide the error."""
    log = tmp_path / "run1.log"
    log.write_bytes(b"greedy: '12 inte\xef\xbftion'\nr1-ascend: WorkerLostError: the run stopped \xff here\n")
    assert faults.last_error_line(log, "WorkerLostError: ").startswith("WorkerLostError: the run stopped")


def test_the_error_line_starts_at_the_first_marker_and_is_empty_without_one(tmp_path: Path) -> None:
    log = tmp_path / "run1.log"
    log.write_text("x WorkerLostError: outer; caused by WorkerLostError: inner\n")
    assert (
        faults.last_error_line(log, "WorkerLostError: ") == "WorkerLostError: outer; caused by WorkerLostError: inner"
    )
    log.write_text("nothing failed\n")
    assert faults.last_error_line(log, "WorkerLostError: ") == ""


# --- process faults: the stage a fault waits for ------------------------------------------------------------------


def stage(t: float, name: str, step: int, phase: str = "enter") -> dict[str, object]:
    return {"t": t, "event": "stage", "stage": name, "phase": phase, "step": step}


def test_the_first_entry_into_the_stage_of_the_step_after_the_checkpoint(tmp_path: Path) -> None:
    write_events(
        tmp_path,
        31,
        [
            stage(1.0, "update_actor", 2),  # before the checkpoint was tracked
            stage(5.0, "update_actor", 1),  # another step
            stage(6.0, "generate_sequences", 2),  # another stage
            stage(7.0, "update_actor", 2, phase="exit"),
            stage(8.0, "update_actor", 2),
            stage(9.0, "update_actor", 2),
        ],
    )
    found = process_faults.stage_entered(tmp_path, "update_actor", 2, after=4.0)
    assert found is not None
    assert found["t"] == 8.0
    assert process_faults.stage_entered(tmp_path, "update_actor", 3, after=0.0) is None
    assert process_faults.stage_entered(tmp_path, "update_actor", 2, after=9.0) is None


def test_a_workers_children_are_counted_with_it() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        me = os.getpid()
        assert {me, child.pid} <= process_faults.with_descendants({me})
        assert process_faults.with_descendants({child.pid}) == {child.pid}
    finally:
        child.kill()
        child.wait()
    assert process_faults.with_descendants({child.pid}) == {child.pid}  # gone: itself, nothing under it


#: A child that starts a sleeping child of its own, prints its pid and sleeps.
SPAWN_AND_SLEEP = (
    "import subprocess, sys, time; "
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
    "print(p.pid, flush=True); time.sleep(30)"
)


def test_what_a_workers_children_forked_is_counted_too() -> None:
    """A worker's checkpoint writer forks again (megatron-core's Manager): grandchildren count, not only children."""
    middle = subprocess.Popen([sys.executable, "-c", SPAWN_AND_SLEEP], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(middle.stdout.readline())
        assert {middle.pid, grandchild} <= process_faults.with_descendants({os.getpid()})
        assert process_faults.with_descendants({middle.pid}) == {middle.pid, grandchild}
    finally:
        for process in psutil.Process(middle.pid).children(recursive=True):
            process.kill()
        middle.kill()
        middle.wait()


def test_the_raylet_is_found_by_its_process_name_among_the_nodes_processes(tmp_path: Path) -> None:
    """The node's Ray processes hold one process named ``raylet`` (its executable's name); vanished pids are
    skipped."""
    raylet_binary = tmp_path / "raylet"
    raylet_binary.write_bytes(Path("/bin/sleep").read_bytes())  # a process named raylet, as Ray names it
    raylet_binary.chmod(0o755)
    raylet = subprocess.Popen([str(raylet_binary), "30"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        assert process_faults.raylet_of({os.getpid(), gone.pid, raylet.pid}) == raylet.pid
        assert process_faults.raylet_of({raylet.pid}) == raylet.pid
    finally:
        raylet.kill()
        raylet.wait()


def test_a_node_without_a_raylet_is_an_error(tmp_path: Path) -> None:
    me = os.getpid()
    with pytest.raises(FaultError, match=rf"no raylet among the node's Ray processes \[{me}\]"):
        process_faults.raylet_of({me})


def test_a_nodes_ray_processes_are_its_pid_file_and_what_runs_under_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "ray.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    assert os.getpid() in process_faults.ray_processes(pid_file)
