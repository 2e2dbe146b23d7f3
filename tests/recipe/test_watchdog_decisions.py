"""The driver's watchdog decisions without Ray (r1_ascend.recipe.watchdog): when one look at the heartbeats stops the
run, what a probe's answers change, how Ray's loss errors are read, and what the WorkerLostError message says.

``stop_decision`` is handed the probe (the one call that needs Ray), so the rule is exercised on every shape of
answer: a worker that is merely slow to beat must never stop a healthy run, one the probe finds dead must.
``test_watchdog.py`` runs the same watchdog on a real local Ray with SIGSTOPped and SIGKILLed workers (slow).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from r1_ascend.patches.rules.watchdog import BEAT_S, Beat, Stall, WatchdogConfig
from r1_ascend.recipe import watchdog

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "patches"))
import checkpoint_fakes as fakes

pytestmark = pytest.mark.machine

CONFIG = WatchdogConfig(silence_s=60.0, stage_s=600.0, poll_s=5.0)
SUSPECT_S = watchdog.SUSPECT_BEATS * BEAT_S


def beat(rank: int, silent_s: float, stage: str | None = "update_actor", stage_s: float = 30.0) -> Beat:
    return Beat(rank, 4000 + rank, f"10.0.0.{rank + 1}", f"wg_WorkerDict_0:{rank}", stage, stage_s, silent_s, 7)


class Probe:
    """Stands in for ``probe``: answers from a table (rank -> dead or alive-but-silent) and records who was asked."""

    def __init__(self, dead: dict[int, bool]) -> None:
        self.dead = dead
        self.asked: list[list[int]] = []

    def __call__(self, beats: list[Beat]) -> list[watchdog.Lost]:
        self.asked.append([b.rank for b in beats])
        return [
            watchdog.Lost(b, "died" if self.dead[b.rank] else "alive, no answer", dead=self.dead[b.rank])
            for b in beats
            if b.rank in self.dead
        ]


# --- one look ------------------------------------------------------------------------------------------------


def test_every_worker_beating_goes_on_without_a_probe() -> None:
    ask = Probe({})
    assert watchdog.stop_decision([beat(0, 1.0), beat(1, SUSPECT_S)], CONFIG, ask) == (None, [])
    assert ask.asked == []  # silent for exactly SUSPECT_BEATS beats: not yet a suspect


def test_an_alive_but_silent_suspect_does_not_stop_the_run() -> None:
    """Silent for more than two beats but less than the silence limit: probed; alive (busy host, long call), so the
    run goes on and the silence limit decides later."""
    ask = Probe({1: False})
    assert watchdog.stop_decision([beat(0, 1.0), beat(1, SUSPECT_S + 0.1)], CONFIG, ask) == (None, [])
    assert ask.asked == [[1]]


def test_a_dead_suspect_stops_the_run_before_the_silence_limit() -> None:
    ask = Probe({1: True, 2: False})
    beats = [beat(0, 1.0), beat(1, SUSPECT_S + 0.1), beat(2, SUSPECT_S + 0.1)]
    stall, lost = watchdog.stop_decision(beats, CONFIG, ask)
    assert stall is None
    assert [(found.beat.rank, found.dead) for found in lost] == [(1, True)]
    assert ask.asked == [[1, 2]]


def test_a_silent_worker_stops_the_run_and_is_probed_alive_or_dead() -> None:
    """Past the silence limit the run stops whatever the probe says; the probe only tells dead from stuck."""
    for dead in (True, False):
        ask = Probe({1: dead})
        stall, lost = watchdog.stop_decision([beat(0, 1.0), beat(1, CONFIG.silence_s + 1)], CONFIG, ask)
        assert stall is not None
        assert (stall.kind, [b.rank for b in stall.culprits]) == ("silent", [1])
        assert [(found.beat.rank, found.dead) for found in lost] == [(1, dead)]
        assert ask.asked == [[1]]


def test_an_overdue_stage_stops_the_run_without_a_probe() -> None:
    ask = Probe({0: True, 1: True})
    beats = [beat(0, 1.0, stage_s=CONFIG.stage_s + 1), beat(1, 1.0, stage_s=CONFIG.stage_s + 1)]
    stall, lost = watchdog.stop_decision(beats, CONFIG, ask)
    assert stall is not None
    assert stall.kind == "overdue"
    assert lost == []
    assert ask.asked == []


def test_no_heartbeat_yet_goes_on() -> None:
    assert watchdog.stop_decision([], CONFIG, Probe({})) == (None, [])


# --- after the trainer failed --------------------------------------------------------------------------------


RAY_DIED = (
    "The actor died unexpectedly before finishing this task.\n\tclass_name: WorkerDict\n\tactor_id: 1a2b\n"
    "\tpid: 4001\n\tname: wg_WorkerDict_0:1\n\tnamespace: ns\n\tip: 10.0.0.2\nThe actor is dead because its "
    "worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: The leased worker has "
    "unrecoverable failure. Worker is requested to be destroyed when it is returned. More text."
)


class ActorDiedError(RuntimeError):
    """Named as Ray's: the watchdog recognises Ray's loss errors by class name along the cause chain."""


class NodeDiedError(RuntimeError):
    """Named as Ray's."""


def test_rays_reason_is_its_exit_detail_with_pid_and_node() -> None:
    reason = watchdog.ray_reason(ActorDiedError(RAY_DIED))
    assert reason == ("Worker exit detail: The leased worker has unrecoverable failure. (pid 4001, ip 10.0.0.2)")


def test_a_node_death_is_said_as_such() -> None:
    text = "The actor died because its node has died. Node Id: abc\n\tpid: 17\n"
    assert watchdog.ray_reason(NodeDiedError(text)) == "The actor died because its node has died. Node Id: abc (pid 17)"


def test_without_an_exit_detail_the_last_line_or_the_class_is_the_reason() -> None:
    assert watchdog.ray_reason(ActorDiedError("first line\nsecond line")) == "second line"
    assert watchdog.ray_reason(ActorDiedError("")) == "ActorDiedError"


def test_only_rays_loss_errors_count_along_the_chain() -> None:
    outer = ValueError("wrapped")
    outer.__cause__ = NodeDiedError("node gone")
    assert [type(e).__name__ for e in watchdog.ray_losses(outer)] == ["NodeDiedError"]
    assert watchdog.ray_losses(ValueError("plain")) == []


def test_the_watchdogs_own_finding_is_the_answer() -> None:
    """When the watchdog stopped the run, its stall and probe results stand; Ray's account fills in the reason of
    a dead worker whose pid it names."""
    dog = watchdog.Watchdog(CONFIG)
    silent = beat(1, 90.0)
    dog.stall = Stall("silent", (silent,), (beat(0, 1.0),), CONFIG.silence_s)
    dog.lost = [watchdog.Lost(silent, "probe: dead")]
    found = watchdog.lost_workers(ActorDiedError(RAY_DIED), dog)
    assert found is not None
    stall, lost = found
    assert stall is dog.stall
    assert lost[0].reason.startswith("Worker exit detail: The leased worker")


def test_an_alive_worker_keeps_the_probes_words() -> None:
    dog = watchdog.Watchdog(CONFIG)
    stuck = beat(1, 90.0)
    dog.stall = Stall("silent", (stuck,), (), CONFIG.silence_s)
    dog.lost = [watchdog.Lost(stuck, "alive, no answer", dead=False)]
    found = watchdog.lost_workers(ActorDiedError(RAY_DIED), dog)
    assert found is not None
    assert found[1] == dog.lost


def test_a_loss_the_watchdog_did_not_see_is_named_from_rays_error() -> None:
    dog = watchdog.Watchdog(CONFIG)
    dog.beats = []  # nothing beat (no monitor either): Ray's error is all there is
    found = watchdog.lost_workers(ActorDiedError(RAY_DIED), dog)
    assert found is not None
    stall, lost = found
    assert stall is None
    assert lost[0].beat is None
    assert "(pid 4001, ip 10.0.0.2)" in lost[0].reason


# --- the message ---------------------------------------------------------------------------------------------


def test_the_message_names_the_latest_step_and_the_stage(tmp_path: Path) -> None:
    lost = [watchdog.Lost(beat(1, 90.0), "died")]
    others = [Beat(0, 4000, "10.0.0.1", "a", None, 0.0, 1.0, 9)]
    text = watchdog.describe_loss(None, lost, tmp_path, others)
    assert text.startswith("the run stopped in training step 9, stage update_actor: a training worker was lost")


def test_a_loss_without_step_or_stage_says_neither(tmp_path: Path) -> None:
    lost = [watchdog.Lost(None, "gone")]
    text = watchdog.describe_loss(None, lost, tmp_path, [], who="the TaskRunner")
    assert text.startswith("the run stopped: the TaskRunner was lost: a worker: gone.")


def test_what_to_check_depends_on_whether_a_worker_died(tmp_path: Path) -> None:
    dead = watchdog.describe_loss(None, [watchdog.Lost(beat(1, 9.0), "died")], tmp_path, [])
    stuck = watchdog.describe_loss(None, [watchdog.Lost(beat(1, 9.0), "no answer", dead=False)], tmp_path, [])
    assert "OOM killer" in dead
    assert "OOM killer" not in stuck
    assert "stuck in the device driver" in stuck


@pytest.mark.parametrize("saved", [0, 1, 2])
def test_the_message_says_where_a_relaunch_resumes(tmp_path: Path, saved: int) -> None:
    for step in range(1, saved + 1):
        fakes.write_step(tmp_path, step)
    text = watchdog.describe_loss(None, [watchdog.Lost(beat(1, 9.0), "died")], tmp_path, [])
    if saved:
        assert f"it resumes from global_step_{saved} under {tmp_path}" in text
    else:
        assert "no checkpoint was saved yet" in text


def test_a_stall_message_adds_what_the_probe_found(tmp_path: Path) -> None:
    silent = beat(1, 90.0)
    stall = Stall("silent", (silent,), (), CONFIG.silence_s)
    probed = watchdog.describe_loss(stall, [watchdog.Lost(silent, "died")], tmp_path, [])
    assert "the watchdog stopped the run: " in probed
    assert "; probed: rank 1 (pid 4001 on node 10.0.0.2): died" in probed
    assert "probed:" not in watchdog.describe_loss(stall, [], tmp_path, [])


def test_the_reason_joins_the_stall_and_the_dead() -> None:
    dog = watchdog.Watchdog(CONFIG)
    assert dog.reason() == ""
    dog.lost = [watchdog.Lost(beat(1, 9.0), "died")]
    assert dog.reason() == "a worker died: rank 1 (pid 4001 on node 10.0.0.2): died"
    dog.stall = Stall("silent", (beat(1, 90.0),), (), CONFIG.silence_s)
    assert dog.reason().endswith("; rank 1 (pid 4001 on node 10.0.0.2): died")


# --- the plumbing, against a stand-in for Ray's API ----------------------------------------------------------


class GetTimeoutError(Exception):
    """Named as Ray's: ``probe`` recognises a timeout by the class name."""


class Remote:
    """A method with ``.remote()``: the call happens at once; its result (or error) is the 'object ref'."""

    def __init__(self, call: Any) -> None:
        self.call = call

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.call(*args, **kwargs)
        except Exception as exc:  # the error travels in the ref, as Ray's does
            return exc


class Handle:
    """An actor handle; ``ready`` is what its ``__ray_ready__`` gives (True, or an error)."""

    def __init__(self, name: str, ready: Any = True, instance: Any = None) -> None:
        self.name = name
        self.instance = instance
        self.__ray_ready__ = Remote(lambda: ready)

    def __getattr__(self, method: str) -> Remote:
        return Remote(getattr(self.instance, method))


class StandInRay(types.ModuleType):
    """The part of Ray's API the watchdog uses: named actors, get with a timeout, kill."""

    def __init__(self, actors: dict[str, Any] | None = None) -> None:
        super().__init__("ray")
        self.actors = dict(actors or {})
        self.killed: list[str] = []
        self.timeouts: list[float | None] = []
        self.initialized = True

    def get_actor(self, name: str) -> Any:
        if name not in self.actors:
            raise ValueError(f"Failed to look up actor with name '{name}'")
        return self.actors[name]

    def get(self, ref: Any, timeout: float | None = None) -> Any:
        self.timeouts.append(timeout)
        if isinstance(ref, BaseException):
            raise ref
        return ref

    def kill(self, handle: Any, no_restart: bool = True) -> None:
        self.killed.append(handle.name)

    def is_initialized(self) -> bool:
        return self.initialized

    def get_runtime_context(self) -> Any:
        return SimpleNamespace(get_node_id=lambda: "node-0")

    def remote(self, **_: Any) -> Any:
        stand_in = self

        class ActorClass:
            def __init__(self, cls: type) -> None:
                self.cls = cls

            def options(self, name: str, **__: Any) -> Any:
                def create() -> Handle:
                    handle = Handle(name, instance=self.cls())
                    stand_in.actors[name] = handle
                    return handle

                return SimpleNamespace(remote=create)

        return ActorClass


@pytest.fixture
def ray(monkeypatch: pytest.MonkeyPatch) -> StandInRay:
    stand_in = StandInRay()
    util = types.ModuleType("ray.util")
    strategies = types.ModuleType("ray.util.scheduling_strategies")
    strategies.NodeAffinitySchedulingStrategy = lambda node_id, soft: ("affinity", node_id, soft)
    monkeypatch.setitem(sys.modules, "ray", stand_in)
    monkeypatch.setitem(sys.modules, "ray.util", util)
    monkeypatch.setitem(sys.modules, "ray.util.scheduling_strategies", strategies)
    return stand_in


def test_the_probe_tells_dead_stuck_gone_and_alive_apart(ray: StandInRay) -> None:
    ray.actors = {
        "alive": Handle("alive"),
        "stuck": Handle("stuck", ready=GetTimeoutError("timed out")),
        "dead": Handle("dead", ready=ActorDiedError(RAY_DIED)),
    }
    beats = [
        Beat(4, 5, "n", "", None, 0.0, 20.0),  # no actor name: nothing to ask
        Beat(3, 4, "n", "gone", None, 0.0, 20.0),
        Beat(0, 1, "n", "alive", None, 0.0, 20.0),
        Beat(1, 2, "n", "stuck", None, 0.0, 20.0),
        Beat(2, 3, "n", "dead", None, 0.0, 20.0),
    ]
    found = {lost.beat.rank: lost for lost in watchdog.probe(beats, timeout=5.0) if lost.beat is not None}
    assert sorted(found) == [1, 2, 3]
    assert (found[1].dead, found[1].reason) == (
        False,
        "its process is alive but did not answer within 5 s (stopped, or stuck in a call)",
    )
    assert (found[2].dead, found[2].reason) == (True, watchdog.ray_reason(ActorDiedError(RAY_DIED)))
    assert (found[3].dead, found[3].reason) == (True, "its Ray actor no longer exists")


def test_the_probe_waits_at_most_its_timeout_in_all(ray: StandInRay) -> None:
    ray.actors = {f"w{i}": Handle(f"w{i}") for i in range(3)}
    watchdog.probe([Beat(i, i, "n", f"w{i}", None, 0.0, 20.0) for i in range(3)], timeout=5.0)
    assert len(ray.timeouts) == 3
    assert all(0.1 <= t <= 5.0 for t in ray.timeouts)
    assert ray.timeouts[0] > 4.0  # the first one gets (almost) all of it


def test_the_probe_never_waits_less_than_a_tenth_of_a_second(ray: StandInRay) -> None:
    ray.actors = {"w": Handle("w")}
    watchdog.probe([Beat(0, 1, "n", "w", None, 0.0, 20.0)], timeout=0.0)
    assert ray.timeouts == [0.1]


def test_every_worker_that_beat_is_killed_by_name(ray: StandInRay) -> None:
    ray.actors = {"a": Handle("a"), "b": Handle("b")}
    watchdog.kill_workers([Beat(0, 1, "n", "a", None, 0, 0), Beat(1, 2, "n", "", None, 0, 0),
                           Beat(2, 3, "n", "gone", None, 0, 0), Beat(3, 4, "n", "b", None, 0, 0)])  # fmt: skip
    assert ray.killed == ["a", "b"]


def test_no_watchdog_when_disabled_or_outside_ray(ray: StandInRay) -> None:
    from omegaconf import OmegaConf

    with watchdog.watching(OmegaConf.create({"r1_ascend": {"watchdog": {"enabled": False}}})) as dog:
        assert dog is None
    ray.initialized = False
    with watchdog.watching(OmegaConf.create({})) as dog:
        assert dog is None
    assert "r1_ascend_watchdog" not in ray.actors


def test_the_monitor_keeps_each_ranks_last_beat_and_its_age() -> None:
    monitor = watchdog.HeartbeatMonitor()
    who = {"rank": 1, "pid": 11, "node": "n1", "actor": "a1"}
    monitor.beat(who, "update_actor", 3.0, 7)
    monitor.beat({**who, "rank": 0, "pid": 10, "actor": "a0"}, None, 0.0, None)
    monitor.beat(who, "update_actor", 4.0, 8)
    first, second = monitor.snapshot()
    assert (first.rank, first.pid, first.node, first.actor, first.stage, first.step) == (0, 10, "n1", "a0", None, None)
    assert (second.rank, second.stage, second.step) == (1, "update_actor", 8)
    assert 0.0 <= second.silent_s < 5.0
    assert second.stage_s == pytest.approx(4.0 + second.silent_s)


def test_the_watchdog_stops_a_run_with_a_silent_worker(ray: StandInRay) -> None:
    """start() creates the monitor and the thread; a worker silent past the limit is probed, every worker is
    killed, and the reason is kept."""
    import time

    from omegaconf import OmegaConf

    ray.actors = {"w0": Handle("w0"), "w1": Handle("w1", ready=GetTimeoutError("timed out"))}
    settings = {"silence_s": 15, "stage_s": 600, "poll_s": 0.05}
    with watchdog.watching(OmegaConf.create({"r1_ascend": {"watchdog": settings}})) as dog:
        assert dog is not None
        monitor = ray.actors["r1_ascend_watchdog"].instance
        now = time.monotonic()
        monitor.records[0] = ({"rank": 0, "pid": 10, "node": "n0", "actor": "w0"}, "update_actor", 1.0, 4, now)
        monitor.records[1] = ({"rank": 1, "pid": 11, "node": "n1", "actor": "w1"}, "update_actor", 1.0, 4, now - 60)
        deadline = time.monotonic() + 30
        while dog.stall is None and time.monotonic() < deadline:
            time.sleep(0.02)
    assert dog.stall is not None
    assert [b.rank for b in dog.stall.culprits] == [1]
    assert [(lost.beat.rank, lost.dead) for lost in dog.lost if lost.beat] == [(1, False)]
    assert sorted(ray.killed) == ["r1_ascend_watchdog", "w0", "w1"]  # the workers, then the monitor on close
    assert dog.reason().startswith("rank 1 (pid 11 on node n1) sent no heartbeat for 60 s")


def test_the_watchdog_goes_on_while_every_worker_beats(ray: StandInRay) -> None:
    import time

    from omegaconf import OmegaConf

    ray.actors = {"w0": Handle("w0")}
    settings = {"silence_s": 15, "stage_s": 600, "poll_s": 0.05}
    with watchdog.watching(OmegaConf.create({"r1_ascend": {"watchdog": settings}})) as dog:
        assert dog is not None
        monitor = ray.actors["r1_ascend_watchdog"].instance
        monitor.records[0] = ({"rank": 0, "pid": 10, "node": "n0", "actor": "w0"}, "gen", 1.0, 4, time.monotonic())
        time.sleep(0.3)
        assert [b.rank for b in dog.latest_beats()] == [0]
    assert (dog.stall, dog.lost, ray.killed) == (None, [], ["r1_ascend_watchdog"])


# --- reading Ray's errors, in every shape ------------------------------------------------------------------------


def test_rays_cause_attribute_and_a_repeated_error_are_both_followed() -> None:
    """Ray's RayTaskError keeps the worker's error in ``cause``; one error reached twice is read once, and what
    remains to read after it still is."""
    node = NodeDiedError("node gone")
    other = ValueError("seen twice")
    outer = RuntimeError("ray.get failed")
    outer.cause = node  # type: ignore[attr-defined]
    outer.__cause__ = other
    outer.__context__ = other
    assert watchdog.ray_losses(outer) == [node]


def test_a_cycle_in_the_chain_ends() -> None:
    first, second = ActorDiedError("a"), NodeDiedError("b")
    first.__context__, second.__context__ = second, first
    assert sorted(type(e).__name__ for e in watchdog.ray_losses(first)) == ["ActorDiedError", "NodeDiedError"]


def test_without_an_exit_detail_the_reason_is_the_last_line_cut_at_300() -> None:
    assert watchdog.ray_reason(ActorDiedError("one\ntwo\nthree")) == "three"
    assert watchdog.ray_reason(ActorDiedError("head\n" + "x" * 400)) == "x" * 300


# --- the lost workers after the trainer failed, with a stand-in Ray ------------------------------------------------


def dog_with_beats(ray: StandInRay, beats: list[Beat]) -> watchdog.Watchdog:
    """A started watchdog's state: its monitor (a stand-in actor) answers with ``beats``."""
    dog = watchdog.Watchdog(CONFIG)
    dog.monitor = Handle("r1_ascend_watchdog", instance=SimpleNamespace(snapshot=lambda: beats))
    return dog


def test_the_latest_beats_are_asked_with_a_timeout_and_kept_when_the_monitor_is_gone(ray: StandInRay) -> None:
    dog = dog_with_beats(ray, [beat(0, 1.0)])
    assert [b.rank for b in dog.latest_beats()] == [0]
    assert ray.timeouts == [10]
    dog.monitor = Handle("gone", instance=SimpleNamespace(snapshot=lambda: 1 / 0))
    assert [b.rank for b in dog.latest_beats()] == [0]


def test_the_probe_finds_the_dead_worker_rays_error_did_not_name(ray: StandInRay) -> None:
    beats = [beat(0, 1.0), beat(1, 1.0)]
    ray.actors = {"wg_WorkerDict_0:0": Handle("a"), "wg_WorkerDict_0:1": Handle("b", ready=ActorDiedError(RAY_DIED))}
    found = watchdog.lost_workers(RuntimeError("the trainer failed"), dog_with_beats(ray, beats))
    assert found is not None
    stall, lost = found
    assert stall is None
    assert [(each.beat.rank, each.dead) for each in lost if each.beat] == [(1, True)]


def test_rays_error_names_the_worker_when_every_probe_answers(ray: StandInRay) -> None:
    """The worker died and was restarted, or its pid is all Ray gives: the beat whose pid the error names."""
    beats = [Beat(0, 17, "n0", "", None, 0.0, 1.0), Beat(1, 4001, "n1", "w1", None, 0.0, 1.0, 3)]
    ray.actors = {"w1": Handle("w1")}
    found = watchdog.lost_workers(ActorDiedError(RAY_DIED), dog_with_beats(ray, beats))
    assert found is not None
    (lost,) = found[1]
    assert lost.beat is beats[1]
    assert lost.reason == watchdog.ray_reason(ActorDiedError(RAY_DIED))


def test_only_the_first_of_rays_losses_is_reported(ray: StandInRay) -> None:
    outer = ActorDiedError(RAY_DIED)
    outer.__cause__ = NodeDiedError("The actor died because its node has died. Node Id: x")
    found = watchdog.lost_workers(outer, dog_with_beats(ray, []))
    assert found is not None
    assert len(found[1]) == 1


def test_the_watchdogs_probe_alone_is_the_answer() -> None:
    """The watchdog found a dead suspect before any stall: its finding stands."""
    dog = watchdog.Watchdog(CONFIG)
    dog.lost = [watchdog.Lost(beat(1, 20.0), "probe: dead")]
    found = watchdog.lost_workers(RuntimeError("the trainer failed"), dog)
    assert found == (None, dog.lost)


def test_rays_account_replaces_the_probes_only_for_the_pid_it_names(ray: StandInRay) -> None:
    dog = watchdog.Watchdog(CONFIG)
    named, other = beat(1, 20.0), Beat(2, 77, "n", "w2", None, 0.0, 20.0)
    dog.lost = [watchdog.Lost(named, "probe: dead"), watchdog.Lost(other, "probe: dead")]
    found = watchdog.lost_workers(ActorDiedError(RAY_DIED), dog)
    assert found is not None
    first, second = found[1]
    assert (first.beat, first.dead, first.reason) == (named, True, watchdog.ray_reason(ActorDiedError(RAY_DIED)))
    assert (second.beat, second.reason) == (other, "probe: dead")


@pytest.mark.parametrize(
    ("text", "rank"),
    [("name: wg_1 and more", 1), ("pid: 42 only", 1), ("pid: 7", 0), ("nobody", None)],
)
def test_rays_error_is_matched_to_a_beat_by_actor_name_or_pid(ray: StandInRay, text: str, rank: int | None) -> None:
    beats = [Beat(0, 7, "n0", "", None, 0.0, 1.0), Beat(1, 42, "n1", "wg_1", None, 0.0, 1.0)]
    ray.actors = {"wg_1": Handle("wg_1")}
    found = watchdog.lost_workers(ActorDiedError(text), dog_with_beats(ray, beats))
    assert found is not None
    (lost,) = found[1]
    assert (lost.beat.rank if lost.beat else None) == rank


def test_the_default_probe_goes_through_ray(ray: StandInRay) -> None:
    ray.actors = {"wg_WorkerDict_0:1": Handle("w", ready=ActorDiedError(RAY_DIED))}
    stall, lost = watchdog.stop_decision([beat(0, 1.0), beat(1, SUSPECT_S + 1)], CONFIG)
    assert stall is None
    assert [(each.beat.rank, each.dead) for each in lost if each.beat] == [(1, True)]
    assert ray.timeouts[0] == pytest.approx(watchdog.PROBE_S, abs=0.5)


# --- the messages, word for word where a user acts on them ---------------------------------------------------------


def test_the_reason_lists_every_lost_worker() -> None:
    dog = watchdog.Watchdog(CONFIG)
    dog.lost = [watchdog.Lost(beat(1, 9.0), "died"), watchdog.Lost(beat(2, 9.0), "gone")]
    assert dog.reason() == (
        "a worker died: rank 1 (pid 4001 on node 10.0.0.2): died; rank 2 (pid 4002 on node 10.0.0.3): gone"
    )
    dog.lost = []
    dog.stall = Stall("silent", (beat(1, 90.0),), (), CONFIG.silence_s)
    assert dog.reason() == dog.stall.describe()


def test_the_stalls_stage_and_step_name_the_loss(tmp_path: Path) -> None:
    culprits = (beat(1, 90.0), Beat(2, 4002, "n", "a2", "update_actor", 5.0, 90.0, 11))
    stall = Stall("silent", culprits, (), CONFIG.silence_s)
    lost = [watchdog.Lost(Beat(3, 4003, "n", "a3", "generate_sequences", 1.0, 1.0, None), "died")]
    text = watchdog.describe_loss(stall, lost, tmp_path, [])
    assert text.startswith("the run stopped in training step 11, stage update_actor: the watchdog stopped the run")
    assert f"{stall.describe()}. The job's other workers were stopped with it." in watchdog.describe_loss(
        stall, [], tmp_path, []
    )


def test_every_lost_worker_is_named_in_the_message(tmp_path: Path) -> None:
    lost = [watchdog.Lost(beat(1, 9.0), "died"), watchdog.Lost(beat(2, 9.0), "gone")]
    text = watchdog.describe_loss(None, lost, tmp_path, [])
    assert "was lost: rank 1 (pid 4001 on node 10.0.0.2): died; rank 2 (pid 4002 on node 10.0.0.3): gone." in text


def test_what_to_check_word_for_word(tmp_path: Path) -> None:
    dead = watchdog.describe_loss(None, [watchdog.Lost(beat(1, 9.0), "died")], tmp_path, [])
    assert (
        "Check why it died: the node's kernel log for the OOM killer (dmesg -T | grep -i -e oom -e killed), the "
        "worker's log (<ray temp dir>/session_latest/logs/ on that node, named after its pid), npu-smi info for "
        "device errors; a lost node must rejoin (scripts/ray_start_npu.sh on it) before the relaunch. Then"
    ) in dead
    stuck = watchdog.describe_loss(None, [watchdog.Lost(beat(1, 9.0), "no answer", dead=False)], tmp_path, [])
    assert (
        "Check the named node: a worker that stops answering is stopped, stuck in the device driver (npu-smi info, "
        "the device log under /var/log/npu) or cut off with its node (its Ray log). Then"
    ) in stuck


def watch(ray: StandInRay, records: dict[int, tuple[str, float, float]], seconds: float = 0.0) -> watchdog.Watchdog:
    """Run the watchdog (poll every 0.05 s) over workers w<rank> whose last beat was ``silent`` seconds ago, in
    ``stage`` for ``stage_s`` seconds; until it stops the run (or ``seconds`` more), then close it."""
    import time

    from omegaconf import OmegaConf

    settings = {"silence_s": 15, "stage_s": 600, "poll_s": 0.05}
    with watchdog.watching(OmegaConf.create({"r1_ascend": {"watchdog": settings}})) as dog:
        assert dog is not None
        monitor = ray.actors["r1_ascend_watchdog"].instance
        now = time.monotonic()
        for rank, (stage, stage_s, silent) in records.items():
            who = {"rank": rank, "pid": 10 + rank, "node": f"n{rank}", "actor": f"w{rank}"}
            monitor.records[rank] = (who, stage, stage_s, 4, now - silent)
        deadline = time.monotonic() + 30
        while dog.stall is None and not dog.lost and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(seconds)
    return dog


def test_an_overdue_stage_stops_the_run_and_each_worker_is_killed_once(ray: StandInRay) -> None:
    ray.actors = {"w0": Handle("w0"), "w1": Handle("w1")}
    dog = watch(ray, {0: ("update_actor", 700.0, 0.0), 1: ("update_actor", 700.0, 0.0)}, seconds=0.3)
    assert dog.stall is not None
    assert dog.stall.kind == "overdue"
    assert ray.killed == ["w0", "w1", "r1_ascend_watchdog"]  # one look stops the run; close() ends the monitor


def test_the_monitor_runs_beside_the_driver_with_no_cpu_and_the_thread_is_a_daemon(ray: StandInRay) -> None:
    calls: list[object] = []
    remote = ray.remote

    def recording(**options: object) -> object:
        calls.append(options)
        return remote(**options)

    ray.remote = recording  # type: ignore[method-assign]
    dog = watchdog.Watchdog(CONFIG)
    dog.start()
    try:
        assert calls == [{"num_cpus": 0, "max_concurrency": 16}]
        assert dog.thread is not None
        assert (dog.thread.name, dog.thread.daemon) == ("r1-ascend-watchdog", True)
    finally:
        dog.close()
    assert dog.thread is not None
    assert not dog.thread.is_alive()


def test_a_monitor_that_does_not_answer_once_is_asked_again(ray: StandInRay, caplog: pytest.LogCaptureFixture) -> None:
    """One failed look is logged; the watchdog goes on and stops the run when a worker falls silent later."""
    import time

    from omegaconf import OmegaConf

    ray.actors = {"w0": Handle("w0", ready=ActorDiedError(RAY_DIED))}
    settings = {"silence_s": 15, "stage_s": 600, "poll_s": 0.05}
    with watchdog.watching(OmegaConf.create({"r1_ascend": {"watchdog": settings}})) as dog:
        assert dog is not None
        monitor = ray.actors["r1_ascend_watchdog"].instance
        real = monitor.snapshot
        failures = iter([RuntimeError("monitor busy")])

        def flaky() -> list[Beat]:
            for error in failures:
                raise error
            return real()

        monitor.snapshot = flaky
        monitor.records[0] = ({"rank": 0, "pid": 10, "node": "n0", "actor": "w0"}, "gen", 1.0, 4, time.monotonic() - 60)
        deadline = time.monotonic() + 30
        while dog.stall is None and time.monotonic() < deadline:
            time.sleep(0.02)
    assert dog.stall is not None
    assert "r1-ascend watchdog: the monitor did not answer (monitor busy)" in caplog.text
    assert f"r1-ascend watchdog: stopping the run: {dog.reason()}" in caplog.text
    assert 60 in ray.timeouts
