"""Why the run stopped, from everything recorded about it, whichever of Ray's errors arrived first.

One lost node reaches the trainer (verl's TaskRunner) and the driver as several reports, in an order nobody
chooses:

- **the actor's loss**: ``ray.get`` on a worker of that node raises ``ActorDiedError`` or ``ActorUnavailableError``
  (a connection error at first; "its node has died" once Ray's head knows);
- **the node-death notice**: Ray's node table (the GCS) marks the node dead, with a reason, a few seconds after its
  raylet ended (Ray's health check);
- **the trainer's loss**: when the driver is attached to that node's raylet, Ray ends the actors the driver owns,
  the TaskRunner among them ("Owner's node has crashed"), wherever they run.

The watchdog's heartbeats (``Beat``) say which rank ran on which node, in which step and stage. :func:`diagnose` is a
pure function of all of it (:class:`Evidence`): the beats, Ray's error texts in any order, the node records (Ray's
node table, and whether each raylet still accepts a connection), the watchdog's stall and probe. A node is lost when
Ray lists it dead, when its raylet refuses connections, or when one of Ray's errors says an actor's node died; then
the message names that node, the ranks it took with them, the step, the stage and the checkpoint to resume from,
and points to the node rather than to the OOM killer. Every other loss gives the watchdog's own message
(:func:`r1_ascend.recipe.watchdog.describe_loss`), as before.

The second half gathers the evidence from Ray (:func:`gather`, :class:`BeatRecorder`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from r1_ascend.patches.rules.watchdog import MONITOR_NAME, Beat, Stall
from r1_ascend.recipe.watchdog import Lost, describe_loss, ray_losses, ray_reason, resume_advice

logger = logging.getLogger(__name__)

#: The TaskRunner, as the messages name it.
TRAINER = "the trainer's process (verl's TaskRunner)"
#: Seconds a connection to a raylet's port may take before the raylet counts as unreachable.
CONNECT_S = 2.0
#: Seconds to wait for Ray's node table to confirm a node whose raylet refuses connections (Ray's health check marks
#: it dead within about 15 s: 3 s period x 5 failures), so the message can quote Ray's reason.
CONFIRM_S = 20.0

#: Ray's words for an actor or task lost with its node (ActorDiedError, NodeDiedError).
_NODE_DIED = re.compile(r"(its node has died|node \(where this task was running\) dying|NodeDiedError)", re.I)
#: Ray's words for an actor ended because its owner's node died; the owner's IP is that node's.
_OWNER_NODE = re.compile(r"Owner Ip address: (\S+).*Owner's node has crashed", re.S)


@dataclass(frozen=True)
class NodeRecord:
    """What is known of one Ray node: Ray's node table entry and whether its raylet accepts a TCP connection."""

    ip: str
    node_id: str = ""
    alive: bool = True
    reason: str = ""  # Ray's death reason, when its table lists the node dead
    raylet: str = ""  # "ip:port" of the node's raylet
    reachable: bool | None = None  # None: not tried

    @property
    def lost(self) -> bool:
        return not self.alive or self.reachable is False

    def account(self) -> str:
        if not self.alive:
            return f"Ray marked it dead: {self.reason}" if self.reason else "Ray marked it dead"
        return f"its raylet ({self.raylet or self.ip}) refuses connections"


@dataclass(frozen=True)
class Evidence:
    """Everything recorded when the run stopped; the order of ``errors`` and ``nodes`` carries no meaning."""

    beats: tuple[Beat, ...] = ()
    errors: tuple[str, ...] = ()  # Ray's loss errors (``str(error)``: class name and Ray's text)
    nodes: tuple[NodeRecord, ...] = ()
    stall: Stall | None = None  # the watchdog's reason to stop the run
    found: tuple[Lost, ...] = ()  # the workers found dead or not answering (the watchdog's probe, or Ray's errors)
    trainer_lost: bool = False  # the driver lost the TaskRunner itself


@dataclass(frozen=True)
class _Said:
    """One of Ray's loss errors, read: whose process (class, pid, ip), Ray's one-line account, and the node it says
    died (the actor's own, or its owner's), if any."""

    cls: str
    pid: int | None
    ip: str | None
    reason: str
    dead_node: str | None


def _read(text: str) -> _Said:
    fields = dict(re.findall(r"^\s*(class_name|pid|ip): (\S+)", text, re.M))
    pid, ip = fields.get("pid"), fields.get("ip")
    owner = _OWNER_NODE.search(text)
    dead = owner.group(1) if owner else ip if _NODE_DIED.search(text) else None
    return _Said(fields.get("class_name", ""), int(pid) if pid and pid.isdigit() else None, ip, ray_reason(text), dead)


def lost_nodes(evidence: Evidence) -> dict[str, str]:
    """The nodes the evidence says were lost (IP -> how that is known), in IP order, whatever the order of the
    records: Ray's node table first (its reason), then a raylet that refused connections, then an actor's error
    saying its node died (its own, or its owner's)."""
    accounts: dict[str, list[tuple[int, str]]] = {}
    for record in evidence.nodes:
        if record.lost:
            accounts.setdefault(record.ip, []).append((0 if not record.alive else 1, record.account()))
    for said in map(_read, evidence.errors):
        if said.dead_node:
            how = "an actor's owner ran on it, Owner's node has crashed" if said.dead_node != said.ip else said.reason
            accounts.setdefault(said.dead_node, []).append((2, f"Ray: {how}"))
    return {ip: min(found)[1] for ip, found in sorted(accounts.items())}


def diagnose(evidence: Evidence, checkpoint_root: Path) -> str | None:
    """The WorkerLostError message for ``evidence`` (None when nothing in it says a worker, the trainer or a node was
    lost). The same evidence in any order gives the same message."""
    nodes = lost_nodes(evidence)
    if nodes:
        return _node_loss(evidence, nodes, checkpoint_root)
    found = list(evidence.found)
    if evidence.stall is not None or found:
        return describe_loss(evidence.stall, found, checkpoint_root, list(evidence.beats))
    if not evidence.errors:
        return None
    first = Lost(None, ray_reason(evidence.errors[0]))
    who = TRAINER if evidence.trainer_lost else "a training worker"
    return describe_loss(None, [first], checkpoint_root, list(evidence.beats), who=who)


def _node_loss(evidence: Evidence, nodes: dict[str, str], checkpoint_root: Path) -> str:
    said = [_read(text) for text in evidence.errors]
    on_lost = [b for b in evidence.beats if b.node in nodes]
    elsewhere = [f for f in evidence.found if f.dead and (f.beat is None or f.beat.node not in nodes)]
    steps = [b.step for b in evidence.beats if b.step is not None]
    stages = [b.stage for b in on_lost if b.stage] or ([evidence.stall.stage] if evidence.stall else [])
    stages = [s for s in stages if s] or [b.stage for b in evidence.beats if b.stage]
    stage = max(sorted(set(stages)), key=stages.count) if stages else None
    where = ", ".join(
        part for part in (f"training step {max(steps)}" if steps else "", f"stage {stage}" if stage else "") if part
    )
    parts = []
    for ip, account in nodes.items():
        ranks = sorted((b for b in on_lost if b.node == ip), key=lambda b: b.rank)
        took = "; ".join(f"{b.where()}, last in {b.stage or 'no stage'}" for b in ranks)
        parts.append(f"node {ip} was lost ({account})" + (f", and with it {took}" if took else ""))
    what = "; ".join(parts)
    if evidence.trainer_lost:
        trainer = sorted(s.reason for s in said if "TaskRunner" in s.cls)
        what += f"; {TRAINER} was lost with it" + (f" (Ray: {trainer[0]})" if trainer else "")
    if elsewhere:
        what += "; also lost: " + "; ".join(sorted(f.describe() for f in elsewhere))
    named = ", ".join(nodes)
    check = (
        f"the node ({named}): whether the host is up and reachable, its Ray log (raylet.out under <ray temp "
        "dir>/session_latest/logs/ on it) and its kernel log (dmesg -T) for why Ray's node ended, npu-smi info; "
        "bring it back with scripts/ray_start_npu.sh on it (which also stops what the lost node's Ray left "
        "running) before the relaunch"
    )
    return (
        f"the run stopped{' in ' + where if where else ''}: {what}. The job's other workers were stopped with it. "
        f"Check {check}. Then {resume_advice(checkpoint_root)}."
    )


# --- gathering the evidence from Ray ------------------------------------------------------------------------------


def gather(
    beats: Sequence[Beat],
    exc: BaseException | None,
    stall: Stall | None = None,
    found: Sequence[Lost] = (),
    *,
    trainer_lost: bool = False,
    confirm_s: float = CONFIRM_S,
) -> Evidence:
    """The evidence after the trainer (or the driver's wait for it) failed with ``exc``: Ray's loss errors in its
    chain, and the nodes of the workers that are dead, silent or named by those errors, as Ray's node table lists
    them and as a connection to their raylets finds them."""
    errors = tuple(str(error) for error in ray_losses(exc)) if exc is not None else ()
    suspects = [f.beat for f in found if f.beat is not None]
    suspects += list(stall.culprits) if stall is not None else []
    ips = {b.node for b in suspects} | {ip for s in map(_read, errors) for ip in (s.ip, s.dead_node) if ip}
    if trainer_lost or not suspects:
        ips |= {b.node for b in beats}
    node_ids = {b.node_id for b in beats if b.node_id and b.node in ips}
    nodes = node_records(ips, node_ids, confirm_s)
    logger.warning(
        "r1-ascend: loss evidence: Ray's errors %s; nodes %s",
        [ray_reason(error) for error in errors],
        [f"{r.ip} alive={r.alive} reachable={r.reachable} {r.reason}".strip() for r in nodes],
    )
    return Evidence(tuple(beats), errors, nodes, stall, tuple(found), trainer_lost)


def node_records(
    ips: Iterable[str], node_ids: Iterable[str] = (), confirm_s: float = CONFIRM_S
) -> tuple[NodeRecord, ...]:
    """Ray's node-table entries of ``ips`` (only the entries ``node_ids`` names, when given: a node that rejoined
    keeps its old, dead entry), each listed-alive one with a connection tried to its raylet. When a raylet refuses
    and Ray still lists its node alive, Ray's table is asked again for up to ``confirm_s`` seconds."""
    wanted, ids = set(ips), set(node_ids)
    if not wanted:
        return ()
    records = _table(wanted, ids)
    deadline = time.monotonic() + confirm_s
    while any(r.reachable is False and r.alive for r in records) and time.monotonic() < deadline:
        time.sleep(0.5)
        again = {r.node_id: r for r in _table(wanted, ids, probe=False)}
        records = tuple(again[r.node_id] if r.node_id in again and not again[r.node_id].alive else r for r in records)
    return records


def _table(ips: set[str], node_ids: set[str], *, probe: bool = True) -> tuple[NodeRecord, ...]:
    import ray

    try:
        table = ray.nodes()
    except Exception as exc:  # the diagnosis must not fail on a question to Ray
        logger.warning("r1-ascend: Ray's node table could not be read (%s)", exc)
        return ()
    records = []
    for entry in table:
        ip, node_id = str(entry.get("NodeManagerAddress", "")), str(entry.get("NodeID", ""))
        if ip not in ips or (node_ids and node_id not in node_ids):
            continue
        alive = bool(entry.get("Alive", True))
        reason = str(entry.get("DeathReasonMessage") or entry.get("DeathReason") or "") if not alive else ""
        port = entry.get("NodeManagerPort")
        raylet = f"{ip}:{port}" if port else ""
        reachable = _accepts(ip, int(port)) if probe and alive and port else None
        records.append(NodeRecord(ip, node_id, alive, reason, raylet, reachable))
    return tuple(records)


def _accepts(ip: str, port: int, timeout: float = CONNECT_S) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass
class BeatRecorder:
    """The driver's copy of the workers' last heartbeats, taken every ``poll_s`` from the job's monitor actor.

    The monitor belongs to the TaskRunner and ends with it; when the driver loses the TaskRunner, this copy still
    says which rank ran where, in which step and stage."""

    poll_s: float = 5.0
    beats: list[Beat] = field(default_factory=list)
    stopped: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> BeatRecorder:
        self.thread = threading.Thread(target=self._run, name="r1-ascend-beat-recorder", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop taking copies (without waiting for one under way: the driver's exit must not wait on Ray)."""
        self.stopped.set()

    def _run(self) -> None:
        import ray

        while not self.stopped.wait(self.poll_s):
            if not ray.is_initialized():  # run_ppo connects first; asking earlier would start a local Ray
                continue
            with contextlib.suppress(Exception):  # no monitor yet, or no longer: keep the last copy
                beats = ray.get(ray.get_actor(MONITOR_NAME).snapshot.remote(), timeout=10)
                if beats:
                    self.beats = list(beats)


def driver_message(exc: BaseException, beats: Sequence[Beat], checkpoint_root: Path) -> str | None:
    """The driver's message when it lost the TaskRunner itself (None when ``exc`` holds no loss of Ray's)."""
    if not ray_losses(exc):
        return None
    return diagnose(gather(beats, exc, trainer_lost=True), checkpoint_root)


def trainer_message(
    exc: BaseException, beats: Sequence[Beat], stall: Stall | None, found: Sequence[Lost], checkpoint_root: Path
) -> str:
    """The TaskRunner's message once :func:`r1_ascend.recipe.watchdog.lost_workers` found a worker lost."""
    message = diagnose(gather(beats, exc, stall, found), checkpoint_root)
    return message or describe_loss(stall, list(found), checkpoint_root, list(beats))
