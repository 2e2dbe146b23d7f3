"""The diagnosis of a lost run (r1_ascend.recipe.diagnosis), fed every order in which Ray's reports can arrive.

A node lost in step 2 (the rehearsal's ``node-loss``: the raylet of 127.0.0.3 SIGKILLed while rank 1 runs
``update_actor``) reaches the trainer and the driver as several reports that race: the actor's loss (first a
connection error, later "its node has died"), Ray's node-death notice (its node table), and, when the driver was
attached to that node, the TaskRunner's own loss ("Owner's node has crashed"). Whichever arrive, in whichever
order, the message must name the lost node, the step, the stage and the checkpoint to resume from, and must not
send the user to the OOM killer. The texts are Ray 2.46's, captured from a two-node Ray cluster whose worker node's
raylet was SIGKILLed (and from the rehearsal's log).

The other faults keep the watchdog's own messages, word for word.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from r1_ascend.patches.rules.watchdog import Beat, Stall
from r1_ascend.recipe import watchdog
from r1_ascend.recipe.diagnosis import Evidence, NodeRecord, diagnose, lost_nodes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "patches"))
import checkpoint_fakes as fakes

LOST_ID = "1d7d594545d8c373fb41b9b7f841da3befab31e401b611ead8ecc014"
HEAD_ID = "ba96283b3c76163a397f5f72f44d2029001e0babd6849659c5e6737d"
RANK0 = Beat(0, 4241, "127.0.0.2", "wg_WorkerDict_0:0", "update_actor", 9.0, 1.0, 2, HEAD_ID)
RANK1 = Beat(1, 4242, "127.0.0.3", "wg_WorkerDict_1:0", "update_actor", 9.0, 8.0, 2, LOST_ID)
BEATS = (RANK0, RANK1)

#: The actor on the lost node, before Ray knows the node is gone (the rehearsal's log).
ACTOR_UNAVAILABLE = (
    "ActorUnavailableError: The actor 2f9dacb1bb83b4cc24c5777403000000 is unavailable: The actor is temporarily "
    "unavailable: RpcError: RPC Error message: failed to connect to all addresses; last error: UNKNOWN: "
    "ipv4:127.0.0.3:10007: Failed to connect to remote host: Connection refused; RPC Error details:  rpc_code: 14. "
    "The task may or may not have been executed on the actor."
)
#: The same actor once Ray's health check marked its node dead.
ACTOR_NODE_DIED = (
    "The actor died unexpectedly before finishing this task.\n\tclass_name: WorkerDict\n\tactor_id: "
    "770ce8ef101ce4b3f3912d0f01000000\n\tpid: 4242\n\tnamespace: 44d220bf\n\tip: 127.0.0.3\nThe actor died because "
    f"its node has died. Node Id: {LOST_ID}\n\tthe actor's node was terminated unexpectedly: health check failed due "
    "to missing too many heartbeats"
)
#: The TaskRunner (on the head) ended by Ray because its owner, the driver, was attached to the lost node.
RUNNER_OWNER_CRASHED = (
    "The actor died unexpectedly before finishing this task.\n\tclass_name: R1AscendTaskRunner\n\tactor_id: "
    "609d6538643f1bfdd3ae4bc501000000\n\tpid: 11321\n\tnamespace: a1ae79ca\n\tip: 127.0.0.2\nThe actor is dead "
    "because its owner has died. Owner Id: 01000000ffffffffffffffffffffffffffffffffffffffffffffffff Owner Ip "
    "address: 127.0.0.3 Owner worker exit type: SYSTEM_ERROR Worker exit detail: Owner's node has crashed."
)
#: Ray's node table once it marked the node dead (ray.nodes(): Alive false, DeathReasonMessage).
NODE_NOTICE = NodeRecord(
    "127.0.0.3", LOST_ID, alive=False, reason="health check failed due to missing too many heartbeats"
)
#: What the gatherer finds at once, before Ray's verdict: the node still listed alive, its raylet refusing.
RAYLET_REFUSES = NodeRecord("127.0.0.3", LOST_ID, alive=True, raylet="127.0.0.3:37437", reachable=False)
HEAD_ALIVE = NodeRecord("127.0.0.2", HEAD_ID, alive=True, raylet="127.0.0.2:40111", reachable=True)

EVENTS: dict[str, str | NodeRecord] = {
    "the TaskRunner's loss": RUNNER_OWNER_CRASHED,
    "the actor's loss (unavailable)": ACTOR_UNAVAILABLE,
    "the actor's loss (node died)": ACTOR_NODE_DIED,
    "the node-death notice": NODE_NOTICE,
}


def evidence_of(events: Sequence[str | NodeRecord], base: Sequence[NodeRecord] = (RAYLET_REFUSES,)) -> Evidence:
    """The evidence once ``events`` arrived in this order (the driver's, when the TaskRunner's loss is among them)."""
    errors = tuple(event for event in events if isinstance(event, str))
    nodes = (*base, *(event for event in events if isinstance(event, NodeRecord)), HEAD_ALIVE)
    return Evidence(BEATS, errors, nodes, trainer_lost=RUNNER_OWNER_CRASHED in errors)


def assert_names_the_lost_node(message: str | None, resume_step: int = 1) -> None:
    assert message is not None
    assert message.startswith("the run stopped in training step 2, stage update_actor: node 127.0.0.3 was lost")
    assert "rank 1 (pid 4242 on node 127.0.0.3), last in update_actor" in message
    assert f"resumes from global_step_{resume_step}" in message
    assert "OOM" not in message
    assert "127.0.0.2 was lost" not in message  # the TaskRunner's node is not the lost one


def orders(with_probe: bool) -> list[tuple[str, ...]]:
    """Every order of every non-empty set of events; without the raylet probe, only those that reveal the node."""
    names = list(EVENTS)
    revealing = {"the TaskRunner's loss", "the actor's loss (node died)", "the node-death notice"}
    found = []
    for size in range(1, len(names) + 1):
        for order in itertools.permutations(names, size):
            if with_probe or revealing & set(order):
                found.append(order)
    return found


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("checkpoints")
    fakes.write_step(root, 1)
    return root


@pytest.mark.parametrize("order", orders(with_probe=True), ids=" then ".join)
def test_a_lost_node_is_named_whichever_report_arrives_first(order: tuple[str, ...], checkpoints: Path) -> None:
    """With what the gatherer finds at once (the raylet refuses connections), plus any reports in any order."""
    assert_names_the_lost_node(diagnose(evidence_of([EVENTS[name] for name in order]), checkpoints))


@pytest.mark.parametrize("order", orders(with_probe=False), ids=" then ".join)
def test_rays_own_reports_alone_name_the_lost_node(order: tuple[str, ...], checkpoints: Path) -> None:
    """Without the raylet probe: any report of Ray's that says a node died is enough, in any order."""
    message = diagnose(evidence_of([EVENTS[name] for name in order], base=()), checkpoints)
    assert_names_the_lost_node(message)


@pytest.mark.parametrize("order", orders(with_probe=True), ids=" then ".join)
def test_the_stage_comes_from_the_survivor_when_the_lost_ranks_last_beat_is_between_stages(
    order: tuple[str, ...], checkpoints: Path
) -> None:
    """The raylet died before rank 1's beat entering update_actor was sent: its last beat is between the stages of
    step 2. Rank 0 failed out of the collective it shared with rank 1 and is still reported in update_actor (the
    watchdog patch keeps a failed stage), so the stage is still named."""
    between = Beat(1, 4242, "127.0.0.3", "wg_WorkerDict_1:0", None, 0.4, 8.0, 2, LOST_ID)
    events = [EVENTS[name] for name in order]
    errors = tuple(event for event in events if isinstance(event, str))
    nodes = (RAYLET_REFUSES, *(event for event in events if isinstance(event, NodeRecord)), HEAD_ALIVE)
    evidence = Evidence((RANK0, between), errors, nodes, trainer_lost=RUNNER_OWNER_CRASHED in errors)
    message = diagnose(evidence, checkpoints)
    assert message is not None
    assert message.startswith("the run stopped in training step 2, stage update_actor: node 127.0.0.3 was lost")
    assert "rank 1 (pid 4242 on node 127.0.0.3), last in no stage" in message
    assert "resumes from global_step_1" in message
    assert "OOM" not in message


def test_every_order_of_the_same_reports_gives_the_same_message(checkpoints: Path) -> None:
    messages = {diagnose(evidence_of(order), checkpoints) for order in itertools.permutations(EVENTS.values())}
    assert len(messages) == 1
    (message,) = messages
    assert_names_the_lost_node(message)
    assert "Ray marked it dead: health check failed due to missing too many heartbeats" in str(message)
    assert "the trainer's process (verl's TaskRunner) was lost with it" in str(message)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(list(EVENTS)), min_size=1, max_size=8))
def test_repeated_and_interleaved_reports_still_name_the_lost_node(names: list[str]) -> None:
    """Ray may repeat a report (several ray.get calls, several polls): duplicates in any interleaving."""
    root = Path(__file__).resolve().parent / "no-checkpoints-here"
    message = str(diagnose(evidence_of([EVENTS[name] for name in names]), root))
    assert message.startswith("the run stopped in training step 2, stage update_actor: node 127.0.0.3 was lost")
    assert "OOM" not in message
    assert "no checkpoint was saved yet" in message


def test_lost_nodes_prefers_rays_verdict_over_the_probe_and_the_error_texts() -> None:
    evidence = Evidence(BEATS, (ACTOR_NODE_DIED,), (RAYLET_REFUSES, NODE_NOTICE))
    assert lost_nodes(evidence) == {
        "127.0.0.3": "Ray marked it dead: health check failed due to missing too many heartbeats"
    }
    probe_only = Evidence(BEATS, (ACTOR_UNAVAILABLE,), (RAYLET_REFUSES,))
    assert lost_nodes(probe_only) == {"127.0.0.3": "its raylet (127.0.0.3:37437) refuses connections"}


# --- the other faults keep their messages ---------------------------------------------------------------------------

#: What Ray says of a worker SIGKILLed on a live node (kill-actor-worker, kill-rollout).
WORKER_KILLED = (
    "The actor died unexpectedly before finishing this task.\n\tclass_name: WorkerDict\n\tactor_id: 1a2b\n"
    "\tpid: 4242\n\tname: wg_WorkerDict_1:0\n\tnamespace: ns\n\tip: 127.0.0.3\nThe actor is dead because its worker "
    "process has died. Worker exit type: UNEXPECTED_SYSTEM_EXIT Worker exit detail: Worker unexpectedly exits with a "
    "connection error code 2. End of file. There are some potential root causes."
)
RAYLET_ANSWERS = NodeRecord("127.0.0.3", LOST_ID, alive=True, raylet="127.0.0.3:37437", reachable=True)


def test_a_worker_killed_on_a_live_node_keeps_the_watchdogs_message(checkpoints: Path) -> None:
    lost = [watchdog.Lost(RANK1, watchdog.ray_reason(WORKER_KILLED))]
    evidence = Evidence(BEATS, (WORKER_KILLED,), (RAYLET_ANSWERS, HEAD_ALIVE), found=tuple(lost))
    message = diagnose(evidence, checkpoints)
    assert message == watchdog.describe_loss(None, lost, checkpoints, list(BEATS))
    assert "a training worker was lost: rank 1 (pid 4242 on node 127.0.0.3)" in str(message)
    assert "OOM killer" in str(message)  # a worker that died on a live node: its kernel log is the first place


def test_a_stopped_worker_keeps_the_watchdogs_message(checkpoints: Path) -> None:
    silent = Beat(1, 4242, "127.0.0.3", "wg_WorkerDict_1:0", "update_actor", 40.0, 32.0, 2, LOST_ID)
    stall = Stall("silent", (silent,), (RANK0,), 30.0)
    alive = watchdog.Lost(silent, "its process is alive but did not answer within 5 s", dead=False)
    evidence = Evidence((RANK0, silent), (), (RAYLET_ANSWERS, HEAD_ALIVE), stall=stall, found=(alive,))
    message = diagnose(evidence, checkpoints)
    assert message == watchdog.describe_loss(stall, [alive], checkpoints, [RANK0, silent])
    assert "the watchdog stopped the run" in str(message)


def test_a_lost_trainer_on_live_nodes_is_said_with_the_step_from_the_drivers_copy(checkpoints: Path) -> None:
    """The TaskRunner lost on its own (its process killed): no node lost, the driver's heartbeat copy gives the
    step."""
    killed = RUNNER_OWNER_CRASHED.split("The actor is dead")[0] + (
        "The actor is dead because its worker process has died. Worker exit type: UNEXPECTED_SYSTEM_EXIT Worker "
        "exit detail: Worker unexpectedly exits with a connection error code 2."
    )
    evidence = Evidence(BEATS, (killed,), (RAYLET_ANSWERS, HEAD_ALIVE), trainer_lost=True)
    message = str(diagnose(evidence, checkpoints))
    assert message.startswith("the run stopped in training step 2: the trainer's process (verl's TaskRunner) was lost")
    assert "pid 11321, ip 127.0.0.2" in message


def test_nothing_lost_is_no_diagnosis(checkpoints: Path) -> None:
    assert diagnose(Evidence(BEATS, (), (RAYLET_ANSWERS, HEAD_ALIVE)), checkpoints) is None
