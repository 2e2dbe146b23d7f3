"""The driver's watchdog (r1_ascend.recipe.watchdog): what it says, and what it does on a real Ray cluster.

The message tests use the real checkpoint formats (``checkpoint_fakes``); the slow tests start a local Ray, run
named actors that beat through patch ``verl_worker_watchdog``'s own stage records, then SIGSTOP or SIGKILL one and
check the watchdog names it and leaves no process of it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from r1_ascend.patches.rules.watchdog import Beat, Stall, WatchdogConfig
from r1_ascend.recipe import watchdog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "patches"))
import checkpoint_fakes as fakes

pytestmark = pytest.mark.machine

BEAT = Beat(rank=1, pid=4242, node="10.0.0.2", actor="wg_WorkerDict_0:1", stage="update_actor", stage_s=40.0,
            silent_s=35.0, step=12)  # fmt: skip
PEER = Beat(rank=0, pid=4241, node="10.0.0.1", actor="wg_WorkerDict_0:0", stage="update_actor", stage_s=40.0,
            silent_s=1.0, step=12)  # fmt: skip
#: What Ray 2.46 says of an actor whose process was SIGKILLed (ActorDiedError's text).
RAY_DIED = (
    "The actor died unexpectedly before finishing this task.\n\tclass_name: WorkerDict\n\tactor_id: 1a2b\n"
    "\tpid: 4242\n\tname: wg_WorkerDict_0:1\n\tnamespace: ns\n\tip: 10.0.0.2\nThe actor is dead because its "
    "worker process has died. Worker exit type: UNEXPECTED_SYSTEM_EXIT Worker exit detail: Worker unexpectedly "
    "exits with a connection error code 2. End of file. There are some potential root causes."
)


class ActorDiedError(RuntimeError):
    """Named as Ray's: the watchdog recognises Ray's loss errors by class name along the cause chain."""


# --- the message --------------------------------------------------------------------------------------------------


def test_a_dead_worker_is_named_with_rays_reason_and_the_checkpoint_to_resume(tmp_path: Path) -> None:
    fakes.write_step(tmp_path, 10)
    lost = watchdog.Lost(BEAT, watchdog.ray_reason(ActorDiedError(RAY_DIED)))
    text = watchdog.describe_loss(None, [lost], tmp_path, [BEAT, PEER])
    assert text.startswith("the run stopped in training step 12, stage update_actor: a training worker was lost")
    assert "rank 1 (pid 4242 on node 10.0.0.2)" in text
    assert "Worker exit detail: Worker unexpectedly exits with a connection error code 2." in text
    assert "OOM killer" in text
    assert f"resumes from global_step_10 under {tmp_path}" in text


def test_a_hang_names_the_silent_rank_and_what_its_peers_did(tmp_path: Path) -> None:
    stall = Stall("silent", (BEAT,), (PEER,), 30.0)
    alive = watchdog.Lost(BEAT, "its process is alive but did not answer within 5 s", dead=False)
    text = watchdog.describe_loss(stall, [alive], tmp_path, [BEAT, PEER])
    assert "the watchdog stopped the run: rank 1 (pid 4242 on node 10.0.0.2) sent no heartbeat for 35 s" in text
    assert "1 other worker(s) were waiting in update_actor" in text
    assert "alive but did not answer" in text
    assert "no checkpoint was saved yet" in text  # nothing under tmp_path: the relaunch starts at step 0


def test_a_broken_newest_checkpoint_is_said_before_the_relaunch(tmp_path: Path) -> None:
    fakes.write_step(tmp_path, 1)
    fakes.truncate(fakes.shard(fakes.write_step(tmp_path, 2)))
    text = watchdog.describe_loss(None, [watchdog.Lost(BEAT, "gone")], tmp_path, [BEAT])
    assert "the relaunch will refuse to resume" in text
    assert "global_step_1" in text


def test_a_trainer_error_without_a_lost_worker_stands() -> None:
    assert watchdog.lost_workers(ValueError("rollout guard stopped the run"), None) is None


def test_rays_loss_is_found_along_the_cause_chain() -> None:
    try:
        try:
            raise ActorDiedError(RAY_DIED)
        except ActorDiedError as inner:
            raise RuntimeError("ray.get failed") from inner
    except RuntimeError as outer:
        stall, lost = watchdog.lost_workers(outer, None) or (None, [])
    assert stall is None
    assert "pid 4242, ip 10.0.0.2" in lost[0].reason


# --- on a real Ray ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_local() -> Iterator[Any]:
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _start_workers(ray: Any, count: int) -> list[int]:
    """Named actors that stay in stage ``update_actor`` through the patch's own stage records (heartbeats); their
    pids."""

    class Worker:
        def pid(self) -> int:
            return os.getpid()

        def update(self, seconds: float) -> None:
            from r1_ascend.patches.verl_worker_watchdog import in_stage

            with in_stage("update_actor", 5):
                time.sleep(seconds)

    remote = ray.remote(num_cpus=0)(Worker)
    workers = [
        remote.options(name=f"wd-test-{rank}", runtime_env={"env_vars": {"RANK": str(rank)}}).remote()
        for rank in range(count)
    ]
    pids = ray.get([worker.pid.remote() for worker in workers])
    for worker in workers:
        worker.update.remote(120)
    return pids


@pytest.mark.slow
@pytest.mark.parametrize("sent", [signal.SIGSTOP, signal.SIGKILL], ids=["stopped", "killed"])
def test_the_watchdog_names_the_lost_worker_and_stops_the_others(ray_local: Any, sent: signal.Signals) -> None:
    pids = _start_workers(ray_local, 2)
    config = WatchdogConfig(silence_s=15, stage_s=600, poll_s=1)
    dog = watchdog.Watchdog(config)
    dog.start()
    try:
        deadline = time.monotonic() + 30
        while len(dog.beats) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert {b.stage for b in dog.beats} == {"update_actor"}, dog.beats
        os.kill(pids[1], sent)
        since = time.monotonic()
        while dog.stall is None and not dog.lost and time.monotonic() < since + 40:
            time.sleep(0.5)
        took = time.monotonic() - since
    finally:
        dog.close()
    if sent == signal.SIGSTOP:
        assert dog.stall is not None, f"no stall {took:.0f} s after SIGSTOP"
        assert [b.pid for b in dog.stall.culprits] == [pids[1]]
        assert "alive but did not answer" in dog.reason()
    else:  # found dead by the early probe, before the silence limit
        assert dog.stall is None
        assert [f.beat.pid for f in dog.lost if f.beat] == [pids[1]]
        assert took < config.silence_s
    # the live worker is killed through Ray; a stopped one cannot run Ray's exit, it ends with the job (the raylet
    # SIGKILLs a finished job's workers: the hang rehearsal measures that), so here the test ends it
    deadline = time.monotonic() + 30
    while _running(pids[0]):
        assert time.monotonic() < deadline, f"worker pid {pids[0]} still runs after the watchdog stopped the run"
        time.sleep(0.5)
    for rank in (0, 1):
        with pytest.raises(ValueError, match="Failed to look up actor"):
            ray_local.get_actor(f"wd-test-{rank}")
    if _running(pids[1]):
        os.kill(pids[1], signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
