"""The driver's side of the run watchdog: collect the workers' heartbeats, stop a lost or stuck run, say why.

The recipe's TaskRunner runs verl's trainer inside :func:`watching`. It creates the job's monitor actor (which the
workers' heartbeats of patch ``verl_worker_watchdog`` reach) and a thread that asks it every ``poll_s`` seconds.
When rules.watchdog.find_stall names a silent or overdue worker, the thread kills every worker that beat (by its
Ray actor name), so verl's blocked ``ray.get`` returns with Ray's actor-died error. Whatever ended the trainer, if
a worker was lost (the watchdog fired, Ray reported an actor, worker or node gone, or a probe of the workers finds
one dead) the TaskRunner raises WorkerLostError: the step, the stage, the rank, its pid and node, Ray's reason,
the checkpoint a relaunch resumes from and what to check first. The job's other processes end with it: when the
driver exits, Ray kills every actor the job owns on every node.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from r1_ascend.patches.rules.checkpoints import resume_decision
from r1_ascend.patches.rules.watchdog import BEAT_S, MONITOR_NAME, Beat, Stall, WatchdogConfig, find_stall

logger = logging.getLogger(__name__)

#: Seconds a probe of a worker may take (a live, idle worker answers at once; a busy one answers between calls:
#: Ray runs ``__ray_ready__`` on the actor's own thread, so only a dead worker gives a definite answer mid-call).
PROBE_S = 5.0
#: A worker silent for this many beats is probed: when Ray says it is dead, the run stops without waiting for
#: ``silence_s``.
SUSPECT_BEATS = 2


class HeartbeatMonitor:
    """The job's named actor the workers beat to; it keeps each rank's last record and when it arrived."""

    def __init__(self) -> None:
        self.records: dict[int, tuple[dict[str, Any], str | None, float, int | None, float]] = {}

    def beat(self, who: dict[str, Any], stage: str | None, stage_s: float, step: int | None) -> None:
        self.records[int(who["rank"])] = (who, stage, stage_s, step, time.monotonic())

    def snapshot(self) -> list[Beat]:
        now = time.monotonic()
        beats = []
        for rank, (who, stage, stage_s, step, at) in sorted(self.records.items()):
            silent = now - at
            pid, node, actor = int(who["pid"]), str(who["node"]), str(who["actor"])
            node_id = str(who.get("node_id", ""))
            beats.append(Beat(rank, pid, node, actor, stage, stage_s + silent, silent, step, node_id))
        return beats


@dataclass
class Watchdog:
    """The monitor actor, the polling thread, and what they saw."""

    config: WatchdogConfig
    monitor: Any = None
    stall: Stall | None = None
    lost: list[Lost] = field(default_factory=list)
    beats: list[Beat] = field(default_factory=list)
    stopped: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        actor = ray.remote(num_cpus=0, max_concurrency=16)(HeartbeatMonitor)
        self.monitor = actor.options(name=MONITOR_NAME, scheduling_strategy=here).remote()
        ray.get(self.monitor.snapshot.remote())  # up before the workers look for it
        self.thread = threading.Thread(target=self._watch, name="r1-ascend-watchdog", daemon=True)
        self.thread.start()
        logger.info(
            "r1-ascend watchdog: a worker silent for %g s or a stage longer than %g s stops the run",
            self.config.silence_s,
            self.config.stage_s,
        )

    def close(self) -> None:
        import ray

        self.stopped.set()
        if self.thread is not None:
            self.thread.join(self.config.poll_s + 30)
        if self.monitor is not None:
            with contextlib.suppress(Exception):
                ray.kill(self.monitor)

    def _watch(self) -> None:
        while not self.stopped.wait(self.config.poll_s):
            try:
                if self._look():
                    return
            except Exception:  # the watchdog must outlive any surprise of one look
                logger.exception("r1-ascend watchdog: one look failed; it goes on watching")

    def _look(self) -> bool:
        """One look at the heartbeats; True once it stopped the run."""
        import ray

        try:
            self.beats = ray.get(self.monitor.snapshot.remote(), timeout=60)
        except Exception as exc:
            logger.warning("r1-ascend watchdog: the monitor did not answer (%s)", exc)
            return False
        stall, lost = stop_decision(self.beats, self.config)
        if stall is None and not lost:
            return False
        self.stall, self.lost = stall, lost
        logger.error("r1-ascend watchdog: stopping the run: %s", self.reason())
        kill_workers(self.beats)
        return True

    def reason(self) -> str:
        """What made the watchdog stop the run (empty while it has not)."""
        lost = "; ".join(found.describe() for found in self.lost)
        if self.stall is None:
            return f"a worker died: {lost}" if lost else ""
        return f"{self.stall.describe()}{'; ' + lost if lost else ''}"

    def latest_beats(self) -> list[Beat]:
        import ray

        with contextlib.suppress(Exception):
            self.beats = ray.get(self.monitor.snapshot.remote(), timeout=10)
        return self.beats


def stop_decision(
    beats: list[Beat], config: WatchdogConfig, ask: Callable[[list[Beat]], list[Lost]] | None = None
) -> tuple[Stall | None, list[Lost]]:
    """One look's decision on the workers' heartbeats: the stall to stop the run for and the workers found lost;
    ``(None, [])`` to go on watching. ``ask`` probes workers (default: :func:`probe` through Ray).

    A stall (rules.watchdog.find_stall) stops the run; its silent workers are probed to tell dead from stuck. A
    worker silent for more than ``SUSPECT_BEATS`` beats but not yet ``silence_s`` stops it only when the probe
    finds it dead: alive but silent (a slow host, a long call) is left to the silence limit."""
    ask = ask or (lambda suspects: probe(suspects, PROBE_S))
    stall = find_stall(beats, config)
    if stall is not None:
        return stall, (ask(list(stall.culprits)) if stall.kind == "silent" else [])
    suspects = [b for b in beats if b.silent_s > SUSPECT_BEATS * BEAT_S]
    return None, ([found for found in ask(suspects) if found.dead] if suspects else [])


def kill_workers(beats: list[Beat]) -> None:
    """Kill every worker that beat, by its Ray actor name (a stopped process is killed as well: SIGKILL)."""
    import ray

    for beat in beats:
        if not beat.actor:
            continue
        with contextlib.suppress(Exception):
            ray.kill(ray.get_actor(beat.actor), no_restart=True)


@contextlib.contextmanager
def watching(config: Any) -> Iterator[Watchdog | None]:
    """Run the block under the watchdog (None when ``r1_ascend.watchdog.enabled`` is false, or outside Ray: Ray's
    API would start a local Ray on first use, and there are no workers to watch)."""
    import ray

    settings = WatchdogConfig.from_config(config)
    if not settings.enabled or not ray.is_initialized():
        yield None
        return
    dog = Watchdog(settings)
    dog.start()
    try:
        yield dog
    finally:
        dog.close()


# --- after the trainer failed: was a worker lost, and what is said ----------------------------------------------

#: Ray errors that mean a process or node of the job is gone.
_LOSS_ERRORS = ("RayActorError", "ActorDiedError", "ActorUnavailableError", "NodeDiedError", "WorkerCrashedError")


@dataclass(frozen=True)
class Lost:
    """A worker found dead (Ray's account as ``reason``) or not answering: its last heartbeat, when it sent one."""

    beat: Beat | None
    reason: str
    dead: bool = True

    def describe(self) -> str:
        return f"{self.beat.where() if self.beat else 'a worker'}: {self.reason}"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for nested in (getattr(current, "cause", None), current.__cause__, current.__context__):
            if isinstance(nested, BaseException):
                stack.append(nested)


def ray_losses(exc: BaseException) -> list[BaseException]:
    """The Ray process- or node-loss errors in ``exc``'s chain (Ray wraps a worker's error in RayTaskError)."""
    return [e for e in _chain(exc) if any(t.__name__ in _LOSS_ERRORS for t in type(e).__mro__)]


def ray_reason(error: BaseException | str) -> str:
    """Ray's account of a dead actor in one line (from the error or its text): its pid, node and exit detail."""
    text = str(error)
    fields = dict(re.findall(r"^\s*(pid|ip|name): (\S+)", text, re.M))
    detail = re.search(r"(Worker exit detail: [^\n]*?\.|The actor died because its node has died[^\n]*)", text)
    name = type(error).__name__ if isinstance(error, BaseException) else "an error without text"
    why = detail.group(1) if detail else text.strip().splitlines()[-1][:300] if text.strip() else name
    where = ", ".join(f"{k} {fields[k]}" for k in ("pid", "ip") if k in fields)
    return f"{why} ({where})" if where else why


def probe(beats: list[Beat] | tuple[Beat, ...], timeout: float = PROBE_S) -> list[Lost]:
    """Ask every worker that beat whether it is alive; return the dead and the unresponsive."""
    import ray

    refs = {}
    lost: list[Lost] = []
    for beat in beats:
        if not beat.actor:
            continue
        try:
            handle = ray.get_actor(beat.actor)  # kept: a method of a dropped handle cannot be called
        except ValueError:
            lost.append(Lost(beat, "its Ray actor no longer exists"))
            continue
        refs[beat.rank] = (beat, handle, handle.__ray_ready__.remote())
    deadline = time.monotonic() + timeout
    for beat, _handle, ref in refs.values():
        try:
            ray.get(ref, timeout=max(deadline - time.monotonic(), 0.1))
        except Exception as exc:
            if type(exc).__name__ == "GetTimeoutError":
                reason = f"its process is alive but did not answer within {timeout:g} s (stopped, or stuck in a call)"
                lost.append(Lost(beat, reason, dead=False))
            else:
                lost.append(Lost(beat, ray_reason(exc)))
    return lost


def lost_workers(exc: BaseException, dog: Watchdog | None) -> tuple[Stall | None, list[Lost]] | None:
    """Why the trainer ended, when a worker was lost: the watchdog's stall and the workers found dead or not
    answering, with Ray's account of each death where the trainer's error carries one. None when no worker was
    lost (the trainer's own error stands)."""
    losses = ray_losses(exc)
    if dog is not None and (dog.stall is not None or dog.lost):
        return dog.stall, [_with_ray_reason(found, losses) for found in dog.lost]
    beats = dog.latest_beats() if dog is not None else []
    found = probe(beats) if beats else []
    if not found and not losses:
        return None
    if not found:
        found = [Lost(_beat_of(error, beats), ray_reason(error)) for error in losses[:1]]
    return None, [_with_ray_reason(lost, losses) for lost in found]


def _with_ray_reason(lost: Lost, losses: list[BaseException]) -> Lost:
    """``lost`` with Ray's account of its death (exit detail, pid, node) when one of ``losses`` is about it."""
    if lost.beat is None or not lost.dead:
        return lost
    about = [error for error in losses if f"pid: {lost.beat.pid}" in str(error)]
    return Lost(lost.beat, ray_reason(about[0]), dead=True) if about else lost


def _beat_of(error: BaseException, beats: list[Beat]) -> Beat | None:
    text = str(error)
    return next((b for b in beats if (b.actor and b.actor in text) or f"pid: {b.pid}" in text), None)


def describe_loss(
    stall: Stall | None, lost: list[Lost], checkpoint_root: Path, beats: list[Beat], who: str = "a training worker"
) -> str:
    """The WorkerLostError message: what failed (``who`` was lost), where, what is intact and what to do."""
    known = [b for b in (*(f.beat for f in lost), *(stall.culprits if stall else ())) if b is not None]
    steps = [b.step for b in (*known, *beats) if b.step is not None]
    stage = stall.stage if stall else next((b.stage for b in known if b.stage), None)
    where = ", ".join(
        part for part in (f"training step {max(steps)}" if steps else "", f"stage {stage}" if stage else "") if part
    )
    found = "; ".join(each.describe() for each in lost)
    if stall is not None:
        what = f"the watchdog stopped the run: {stall.describe()}{'; probed: ' + found if found else ''}"
    else:
        what = f"{who} was lost: {found}"
    if any(f.dead for f in lost):
        check = (
            "why it died: the node's kernel log for the OOM killer (dmesg -T | grep -i -e oom -e killed), the "
            "worker's log (<ray temp dir>/session_latest/logs/ on that node, named after its pid), npu-smi info "
            "for device errors; a lost node must rejoin (scripts/ray_start_npu.sh on it) before the relaunch"
        )
    else:
        check = (
            "the named node: a worker that stops answering is stopped, stuck in the device driver (npu-smi info, "
            "the device log under /var/log/npu) or cut off with its node (its Ray log)"
        )
    return (
        f"the run stopped{' in ' + where if where else ''}: {what}. The job's other workers were stopped with it. "
        f"Check {check}. Then {resume_advice(checkpoint_root)}."
    )


#: How a run is relaunched after a failure (docs/launch.md "When a run stops").
RELAUNCH = "bash scripts/ray_start_npu.sh restart on the head, the workers stay joined; one node: the run script again"


def resume_advice(checkpoint_root: Path) -> str:
    """What the relaunch will do with the checkpoints under ``checkpoint_root`` (the end of every loss message)."""
    decision = resume_decision(checkpoint_root)
    relaunch = f"relaunch ({RELAUNCH})"
    if decision.ok and decision.step:
        return f"{relaunch}: it resumes from global_step_{decision.step} under {checkpoint_root}"
    if decision.ok:
        return f"{relaunch}: no checkpoint was saved yet under {checkpoint_root}, it starts at step 0"
    return f"the relaunch will refuse to resume: {decision.message}"
