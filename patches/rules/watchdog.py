"""The run watchdog's rules: when a worker counts as lost or stuck, and how that is said.

Kept apart from the patch (verl_worker_watchdog) and the driver's watchdog thread (r1_ascend.recipe.watchdog) so
the decision is a pure function of the workers' last heartbeats, testable without Ray.

Every training worker sends a heartbeat every :data:`BEAT_S` seconds from a thread of its own, naming the stage it
is in (the worker method the trainer called: ``generate_sequences``, ``update_actor``, ...). Two shapes of failure:

- **silent**: a worker sent nothing for ``silence_s`` — its process was killed, stopped (SIGSTOP, a D-state device
  call) or its node lost. Its peers wait in the same collective (HCCL waits ``HCCL_EXEC_TIMEOUT``, 1836 s by
  default) or fail with a connection error;
- **overdue**: a stage has lasted ``stage_s`` while every worker still beats — a collective that never completes,
  a stalled device.

Either one stops the run (the driver's watchdog kills the worker group, so the trainer's ``ray.get`` returns) with
a message naming the stage, the ranks, their processes and nodes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import WatchdogConfigError

#: Hydra key of the watchdog's settings (top level of the recipe config).
CONFIG_KEY = "r1_ascend.watchdog"
#: Seconds between two heartbeats of a worker (a Ray call each; 256 workers make ~50 calls a second).
BEAT_S = 5.0
#: The named Ray actor the workers send their heartbeats to (one per job: named actors live in the job's namespace).
MONITOR_NAME = "r1_ascend_watchdog"
#: ``silence_s`` must allow this many missed beats (a loaded host delays a thread by seconds, never by three beats).
MIN_MISSED_BEATS = 3


@dataclass(frozen=True)
class WatchdogConfig:
    """``enabled``; ``silence_s``: a worker without a heartbeat this long is lost; ``stage_s``: a stage running this
    long on every worker is stuck; ``poll_s``: how often the driver looks."""

    enabled: bool = True
    silence_s: float = 180.0
    stage_s: float = 10800.0
    poll_s: float = 5.0

    @classmethod
    def from_config(cls, config: Any) -> WatchdogConfig:
        """Read ``r1_ascend.watchdog`` (absent = defaults). Unknown keys and values that cannot work are errors."""
        from omegaconf import OmegaConf

        node = OmegaConf.select(config, CONFIG_KEY, default=None)
        values: Mapping[str, Any] = {} if node is None else OmegaConf.to_container(node, resolve=True)  # type: ignore[assignment]
        if not isinstance(values, Mapping):
            msg = f"{CONFIG_KEY} must be a mapping with keys enabled, silence_s, stage_s, poll_s; got {values!r}"
            raise WatchdogConfigError(msg)
        return cls.from_mapping(values)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> WatchdogConfig:
        known = ("enabled", "silence_s", "stage_s", "poll_s")
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise WatchdogConfigError(f"unknown key(s) {unknown} under {CONFIG_KEY}; valid keys: {list(known)}")
        enabled = values.get("enabled", cls.enabled)
        if not isinstance(enabled, bool):
            raise WatchdogConfigError(f"{CONFIG_KEY}.enabled must be true or false, got {enabled!r}")
        seconds = {}
        for key in known[1:]:
            value = values.get(key, getattr(cls, key))
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise WatchdogConfigError(f"{CONFIG_KEY}.{key} must be a positive number of seconds, got {value!r}")
            seconds[key] = float(value)
        if seconds["silence_s"] < MIN_MISSED_BEATS * BEAT_S:
            msg = (
                f"{CONFIG_KEY}.silence_s = {seconds['silence_s']:g} s is shorter than {MIN_MISSED_BEATS} heartbeats "
                f"({MIN_MISSED_BEATS * BEAT_S:g} s): a busy host would be taken for a lost worker; set at least that"
            )
            raise WatchdogConfigError(msg)
        if seconds["poll_s"] > seconds["silence_s"]:
            poll, silence = seconds["poll_s"], seconds["silence_s"]
            msg = f"{CONFIG_KEY}.poll_s ({poll:g} s) must not exceed silence_s ({silence:g} s)"
            raise WatchdogConfigError(msg)
        return cls(enabled=enabled, **seconds)


@dataclass(frozen=True)
class Beat:
    """A worker's last heartbeat as the monitor saw it: who, where, its stage and how old each is."""

    rank: int
    pid: int
    node: str
    actor: str  # the worker's Ray actor name ("" when it has none)
    stage: str | None  # the worker method it is in, None between calls
    stage_s: float  # how long it has been in that stage
    silent_s: float  # how long since its last heartbeat
    step: int | None = None  # the training step the trainer passed with the stage's batch, when it did
    node_id: str = ""  # Ray's id of the worker's node ("" when unknown): a node that rejoins gets a new one

    def where(self) -> str:
        return f"rank {self.rank} (pid {self.pid} on node {self.node})"


@dataclass(frozen=True)
class Stall:
    """Why the watchdog stops the run: ``kind`` is ``silent`` or ``overdue``; ``culprits`` the ranks concerned."""

    kind: str
    culprits: tuple[Beat, ...]
    others: tuple[Beat, ...]
    limit_s: float

    @property
    def stage(self) -> str | None:
        stages = [b.stage for b in self.culprits if b.stage] or [b.stage for b in self.others if b.stage]
        return max(set(stages), key=stages.count) if stages else None

    @property
    def step(self) -> int | None:
        steps = [b.step for b in (*self.culprits, *self.others) if b.step is not None]
        return max(steps) if steps else None

    def describe(self) -> str:
        stage = self.stage or "between stages"
        if self.kind == "silent":
            who = "; ".join(
                f"{b.where()} sent no heartbeat for {b.silent_s:.0f} s, last in {b.stage or 'no stage'}"
                for b in self.culprits
            )
            waiting = [b for b in self.others if b.stage]
            rest = (
                f"; {len(waiting)} other worker(s) were waiting in {stage} for up to "
                f"{max(b.stage_s for b in waiting):.0f} s"
                if waiting
                else ""
            )
            return (
                f"{who} (limit {self.limit_s:g} s){rest}. A silent worker was killed (OOM killer, a device error), "
                "stopped (SIGSTOP, a process stuck in the device driver) or lost with its node"
            )
        ranks = rank_ranges(sorted(b.rank for b in self.culprits))
        longest = max(self.culprits, key=lambda b: b.stage_s)
        return (
            f"stage {stage} has run for {longest.stage_s:.0f} s on rank(s) {ranks} (limit {self.limit_s:g} s) while "
            f"every worker still sends heartbeats: a collective that never completes or a stalled device; "
            f"longest: {longest.where()}"
        )


def find_stall(beats: Sequence[Beat], config: WatchdogConfig) -> Stall | None:
    """The reason to stop the run now, or None. Silence is checked first: a lost worker also makes its peers'
    stage overdue, and the lost one is the cause to name."""
    silent = tuple(sorted((b for b in beats if b.silent_s > config.silence_s), key=lambda b: b.rank))
    if silent:
        others = tuple(b for b in beats if b not in silent)
        return Stall("silent", silent, others, config.silence_s)
    overdue = tuple(sorted((b for b in beats if b.stage and b.stage_s > config.stage_s), key=lambda b: b.rank))
    if overdue:
        others = tuple(b for b in beats if b not in overdue)
        return Stall("overdue", overdue, others, config.stage_s)
    return None


def rank_ranges(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    parts: list[str] = []
    for rank in ranks:
        if parts and rank == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{rank}"
        else:
            parts.append(str(rank))
    return ", ".join(parts)
