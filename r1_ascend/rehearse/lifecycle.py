"""Checks on what the rehearsal's workers recorded: rollout lifecycle order and the overlay prelude's summary."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

#: What verl's ActorRolloutRefWorker must do around every generation (rollout_mode, generate, trainer_mode).
CYCLE = ("resume(weights)", "update_weights", "resume(kv_cache)", "generate", "release")
LIFECYCLE_EVENTS = {"release", "resume(weights)", "update_weights", "resume(kv_cache)", "generate"}
#: Patches every worker's prelude must have applied for the rehearsal to exercise the overlay.
REQUIRED_PATCHES = ("vllm_rollout_offload", "vllm_engine_kv_cache_configs", "verl_onpolicy_logprob")
PRELUDE_LINE = re.compile(r"r1-ascend overlay \(pid (\d+)\): applied=(\S+) already=(\S+)")


class LifecycleError(AssertionError):
    """A worker's record breaks the expected order, or a worker's prelude did not apply the overlay."""


def read_lifecycle(directory: Path) -> list[dict[str, Any]]:
    events = []
    for path in sorted(directory.glob("lifecycle-*.log")):
        for line in path.read_text().splitlines():
            if line.strip():
                events.append(json.loads(line))
    return sorted(events, key=lambda e: e["t"])


def _by_pid(events: list[dict[str, Any]]) -> dict[int, list[str]]:
    sequences: dict[int, list[str]] = {}
    for event in events:
        if event["event"] in LIFECYCLE_EVENTS:
            sequences.setdefault(int(event["pid"]), []).append(event["event"])
    return sequences


def check_sequence(sequence: list[str], *, complete: bool) -> int:
    """Number of generations in a worker's sequence: release first (the build), then whole cycles.

    A worker of a killed run may stop anywhere inside a cycle (``complete=False``)."""
    if not sequence or sequence[0] != "release":
        raise LifecycleError(f"the rollout must be released right after it is built; got {sequence[:3]}")
    body = sequence[1:]
    for index, event in enumerate(body):
        if event != CYCLE[index % len(CYCLE)]:
            raise LifecycleError(
                f"event {index + 1} after the first release is {event!r}, expected {CYCLE[index % len(CYCLE)]!r}; "
                f"sequence: {', '.join(sequence)}"
            )
    if complete and len(body) % len(CYCLE):
        raise LifecycleError(f"the sequence stops inside a cycle: {', '.join(sequence)}")
    return body.count("generate")


def check_lifecycle(events: list[dict[str, Any]], killed_pids: set[int]) -> str:
    """Check every worker (those of the killed run may end mid-cycle); return a one-line description."""
    sequences = _by_pid(events)
    if not sequences:
        raise LifecycleError("no worker recorded a rollout lifecycle event")
    generations = sum(check_sequence(seq, complete=pid not in killed_pids) for pid, seq in sequences.items())
    return (
        f"{len(sequences)} workers, {generations} generations, each as "
        f"release -> resume(weights) -> update_weights -> resume(kv_cache) -> generate"
    )


def check_preludes(log_texts: list[str], events: list[dict[str, Any]]) -> str:
    """Every worker that ran the rollout logged the prelude's summary with the required patches applied."""
    applied: dict[int, set[str]] = {}
    for text in log_texts:
        for pid, done, already in PRELUDE_LINE.findall(text):
            applied.setdefault(int(pid), set()).update(n for n in f"{done},{already}".split(",") if n != "none")
    workers = sorted(_by_pid(events))
    for pid in workers:
        if pid not in applied:
            raise LifecycleError(f"worker pid {pid} logged no 'r1-ascend overlay' prelude line")
        missing = [name for name in REQUIRED_PATCHES if name not in applied[pid]]
        if missing:
            raise LifecycleError(f"worker pid {pid}'s prelude did not apply {', '.join(missing)}")
    return f"{len(workers)} workers logged the prelude with {', '.join(REQUIRED_PATCHES)} applied"
