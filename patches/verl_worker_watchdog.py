"""Make every training worker report the stage it is in, so a lost or stuck worker stops the run within a bound.

Target:
verl.workers.megatron_workers: ActorRolloutRefWorker.init_model, ActorRolloutRefWorker.load_checkpoint,
ActorRolloutRefWorker.generate_sequences, ActorRolloutRefWorker.compute_log_prob,
ActorRolloutRefWorker.compute_ref_log_prob, ActorRolloutRefWorker.update_actor and
ActorRolloutRefWorker.save_checkpoint — every method verl's trainer calls on the colocated actor/rollout/reference
worker group.

Upstream:
verl 0.6.1 (verl/workers/megatron_workers.py ActorRolloutRefWorker; verl/trainer/ppo/ray_trainer.py
RayPPOTrainer.fit calls them through RayWorkerGroup, whose ray.get waits for every rank without a timeout).

Process:
worker (the Megatron actor, reference and rollout, colocated in one Ray worker per NPU).

Why:
verl waits for a worker group with a bare ray.get. When one worker dies mid-step (OOM killer, a device error, its
node lost) or stops (SIGSTOP, a call stuck in the device driver), its peers wait inside the same collective: HCCL
gives up after HCCL_EXEC_TIMEOUT (1836 s by default), and a stopped process never gives up at all. Ray users report
jobs that hang for hours after one worker died, with no message naming it. A 128-card run must stop within minutes
and say which worker, on which node, in which stage.

How:
each wrapped method runs inside a stage record (its name, when it began, the training step verl passed in the
batch's meta_info), and the first call starts a daemon thread that sends the record, the rank, the pid, the node
and the Ray actor name to the job's named monitor actor (rules.watchdog.MONITOR_NAME, created by the recipe's
TaskRunner, r1_ascend.recipe.watchdog) every rules.watchdog.BEAT_S seconds and at every stage change. The thread
beats while the method blocks in a collective (torch releases the GIL there), so silence means the process is gone
or stopped. The driver side decides (rules.watchdog.find_stall), kills the worker group and raises WorkerLostError;
without a monitor (verl's own entry point) the heartbeats are simply not sent. The first stage also makes every
process the worker forks end with it (impl.children: megatron-core's checkpoint writer outlived a worker whose
raylet died, under PID 1). Listeners added to STAGE_LISTENERS are called at every stage entry and exit in the
worker (the rehearsal records them to plant faults at a stage). A method that raises leaves its worker
reported in its stage: when a peer's node is lost, the survivors fail out of the collective they shared, and
the stage they failed in is the one the diagnosis must name.

Upstream fix:
none — verl 0.6.1 and main as of b178a3cd (2026-01-29) have no worker health check; RayWorkerGroup waits without
a timeout.

Remove when:
verl's RayWorkerGroup (or RayPPOTrainer) detects a dead or unresponsive worker during a step and stops the run
naming it; then delete this module, its registry entry, r1_ascend.recipe.watchdog's heartbeat part and
tests/patches/test_verl_worker_watchdog.py.

Disable:
R1_ASCEND_DISABLE=verl_worker_watchdog — stock verl: no heartbeats; the driver's watchdog sees no worker and never
fires, so a stopped worker hangs the run until HCCL's timeout (or forever). A worker that dies is still reported
by the recipe from Ray's error.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ._install import install_on_import
from ._registry import PatchSpec, spec_by_module
from .impl.children import end_children_with_this_process
from .rules.watchdog import BEAT_S, MONITOR_NAME

logger = logging.getLogger(__name__)

#: This patch's registry name (the R1_ASCEND_DISABLE token).
NAME = spec_by_module(__name__).name
#: The worker methods wrapped (the registry's targets), in the order a step calls them.
STAGES = tuple(target.attribute.rsplit(".", 1)[1] for target in spec_by_module(__name__).targets)
#: Called in the worker as ``listener(stage, phase, step)``, phase ``"enter"`` or ``"leave"``; exceptions are logged.
STAGE_LISTENERS: list[Callable[[str, str, int | None], None]] = []


def apply(spec: PatchSpec) -> None:
    for stage in STAGES:
        install_on_import(
            spec.name, spec.target(f"ActorRolloutRefWorker.{stage}"), functools.partial(_build_stage, stage)
        )


class _Heart:
    """This process's stage and the heartbeat thread that reports it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stage: str | None = None
        self.since = time.monotonic()
        self.step: int | None = None
        self.thread: threading.Thread | None = None
        self.monitor: Any = None
        self.identity: dict[str, object] | None = None

    def enter(self, stage: str, step: int | None) -> None:
        with self.lock:
            self.stage, self.since = stage, time.monotonic()
            if step is not None:
                self.step = step
            if self.thread is None:
                end_children_with_this_process()  # before the first save forks megatron-core's writer Manager
                self.thread = threading.Thread(target=self._run, name="r1-ascend-heartbeat", daemon=True)
                self.thread.start()
        self.beat()

    def leave(self) -> None:
        with self.lock:
            self.stage, self.since = None, time.monotonic()
        self.beat()

    def beat(self) -> None:
        """Send the current record (fire and forget); look the monitor up again while there is none."""
        import ray

        if not ray.is_initialized():  # not a Ray worker (a test, a script): never start a local Ray by asking for one
            return
        try:
            if self.identity is None:
                self.identity = _identity()
            if self.monitor is None:
                self.monitor = ray.get_actor(MONITOR_NAME)
            with self.lock:
                stage, stage_s, step = self.stage, time.monotonic() - self.since, self.step
            self.monitor.beat.remote(self.identity, stage, stage_s, step)
        except ValueError:  # no monitor in this job (yet): verl's own entry point, or the driver not up to it
            self.monitor = None
        except Exception as exc:  # a heartbeat must never break the worker
            logger.debug("heartbeat not sent: %s", exc)
            self.monitor = None

    def _run(self) -> None:
        while True:
            time.sleep(BEAT_S)
            self.beat()


_HEART = _Heart()


def _identity() -> dict[str, object]:
    import ray

    context = ray.get_runtime_context()
    return {
        "rank": int(os.environ.get("RANK", "-1")),
        "pid": os.getpid(),
        "node": ray.util.get_node_ip_address(),
        "node_id": context.get_node_id(),
        "actor": context.get_actor_name() or "",
    }


def _step_of(args: tuple[Any, ...]) -> int | None:
    meta = getattr(args[0], "meta_info", None) if args else None
    step = meta.get("global_steps") if isinstance(meta, dict) else None
    return int(step) if isinstance(step, int) else None


def _notify(stage: str, phase: str, step: int | None) -> None:
    for listener in list(STAGE_LISTENERS):
        try:
            listener(stage, phase, step)
        except Exception:
            logger.exception("stage listener %r failed", listener)


@contextlib.contextmanager
def in_stage(stage: str, step: int | None = None) -> Iterator[None]:
    """Report ``stage`` as this worker's stage while the block runs."""
    _HEART.enter(stage, step)
    _notify(stage, "enter", _HEART.step)
    try:
        yield
    except BaseException:
        # Failing out of a stage (a peer's collective broke, the node of a peer was lost) keeps the worker reported
        # in it: that stage is where the run stopped, and "between stages" would hide it from the diagnosis.
        _notify(stage, "leave", _HEART.step)
        raise
    _HEART.leave()
    _notify(stage, "leave", _HEART.step)


def _build_stage(stage: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        with in_stage(stage, _step_of(args)):
            return original(self, *args, **kwargs)

    return method
