"""verl_worker_watchdog and its rule: workers report their stage; a silent or overdue worker is named.

The patch runs on verl 0.6.1's real ``ActorRolloutRefWorker`` methods (their ``@register`` dispatch attributes must
survive the wrapping); the rule (``rules.watchdog``) is fuzzed over heartbeat snapshots.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from r1_ascend.patches import (
    WatchdogConfigError,
    apply_one,
    check_signature,
    patched_by,
    restore_all,
    spec_by_name,
)
from r1_ascend.patches.rules.watchdog import BEAT_S, MIN_MISSED_BEATS, Beat, WatchdogConfig, find_stall, rank_ranges

SPEC = spec_by_name("verl_worker_watchdog")
STAGE_NAMES = ("generate_sequences", "compute_log_prob", "update_actor", "save_checkpoint")

# --- the rule ------------------------------------------------------------------------------------------------------


def test_defaults_and_a_valid_mapping() -> None:
    assert WatchdogConfig.from_mapping({}) == WatchdogConfig()
    config = WatchdogConfig.from_mapping({"silence_s": 30, "stage_s": 600, "poll_s": 2, "enabled": False})
    assert (config.silence_s, config.stage_s, config.poll_s, config.enabled) == (30.0, 600.0, 2.0, False)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"silence": 30}, r"unknown key\(s\) \['silence'\]"),
        ({"enabled": "yes"}, "enabled must be true or false"),
        ({"silence_s": 0}, "silence_s must be a positive number"),
        ({"stage_s": float("nan")}, "stage_s must be a positive number"),
        ({"poll_s": True}, "poll_s must be a positive number"),
        ({"silence_s": MIN_MISSED_BEATS * BEAT_S - 1}, "shorter than 3 heartbeats"),
        ({"silence_s": 20, "poll_s": 25}, "poll_s .* must not exceed silence_s"),
    ],
)
def test_settings_that_cannot_work_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(WatchdogConfigError, match=message):
        WatchdogConfig.from_mapping(values)


def test_the_recipe_configs_read_and_preflight_reports_a_bad_one() -> None:
    from omegaconf import OmegaConf

    from r1_ascend.recipe.checks import check_recipe_config

    def watchdog_problems(config: Any) -> list[str]:
        found = check_recipe_config(config, resolve_classes=False, expect_device=None, environ={})
        return [problem for problem in found if "r1_ascend.watchdog" in problem]

    for name in ("grpo_deepseekv3_671b", "grpo_deepseekv3_smoke", "grpo_qwen25_7b"):
        config = OmegaConf.load(f"recipe/config/{name}.yaml")
        assert WatchdogConfig.from_config(config).enabled, name
        assert watchdog_problems(config) == []
        config.r1_ascend.watchdog.silence_s = 1
        assert "shorter than 3 heartbeats" in watchdog_problems(config)[0]


beats = st.builds(
    Beat,
    rank=st.integers(0, 255),
    pid=st.integers(2, 1 << 22),
    node=st.sampled_from(["10.0.0.1", "10.0.0.2"]),
    actor=st.just("wg_WorkerDict_0:0"),
    stage=st.one_of(st.none(), st.sampled_from(STAGE_NAMES)),
    stage_s=st.floats(0, 20000),
    silent_s=st.floats(0, 400),
    step=st.one_of(st.none(), st.integers(1, 1000)),
)


@given(st.lists(beats, max_size=12, unique_by=lambda b: b.rank), st.floats(15, 300), st.floats(60, 15000))
def test_a_stall_names_exactly_the_workers_beyond_a_limit(found: list[Beat], silence: float, stage: float) -> None:
    config = WatchdogConfig(silence_s=silence, stage_s=stage)
    stall = find_stall(found, config)
    silent = {b.rank for b in found if b.silent_s > silence}
    overdue = {b.rank for b in found if b.stage and b.stage_s > stage}
    if not silent and not overdue:
        assert stall is None
        return
    assert stall is not None
    # a lost worker makes its peers' stage overdue as well: the silent one is the cause to name
    assert stall.kind == ("silent" if silent else "overdue")
    assert {b.rank for b in stall.culprits} == (silent or overdue)
    assert set(stall.culprits) | set(stall.others) == set(found)
    text = stall.describe()
    if stall.kind == "silent":
        for beat in stall.culprits:
            assert beat.where() in text
    else:
        assert f"rank(s) {rank_ranges(sorted(overdue))}" in text
        assert f"stage {stall.stage}" in text


@given(st.sets(st.integers(0, 300), min_size=1))
def test_rankrank_ranges_list_every_rank_once(ranks: set[int]) -> None:
    listed: list[int] = []
    for part in rank_ranges(sorted(ranks)).split(", "):
        low, _, high = part.partition("-")
        listed += range(int(low), int(high or low) + 1)
    assert listed == sorted(ranks)


# --- the patch on verl's worker -------------------------------------------------------------------------------------


@pytest.fixture
def patched() -> Any:
    from verl.workers.megatron_workers import ActorRolloutRefWorker

    apply_one(SPEC)
    yield ActorRolloutRefWorker
    restore_all()


def test_decorated_methods_are_checked_against_their_real_signature() -> None:
    """verl's ``GPUMemoryLogger`` and ``register`` wrap without functools.wraps; the check looks through them, so a
    drifted parameter list still fails."""
    from dataclasses import replace

    from verl.workers.megatron_workers import ActorRolloutRefWorker

    from r1_ascend.patches import PatchTargetError

    method = ActorRolloutRefWorker.update_actor
    assert list(inspect.signature(method).parameters) == ["args", "kwargs"]  # what inspect sees
    target = SPEC.target("ActorRolloutRefWorker.update_actor")
    check_signature(target, method, patch=SPEC.name)
    with pytest.raises(PatchTargetError, match="drifted: expected \\(self, batch\\), found \\(self, data\\)"):
        check_signature(replace(target, params=("self", "batch")), method, patch=SPEC.name)


def test_every_stage_is_wrapped_and_keeps_verls_dispatch(patched: Any) -> None:
    from verl.single_controller.base.decorator import MAGIC_ATTR

    from r1_ascend.patches import verl_worker_watchdog as patch

    assert set(patch.STAGES) == {t.attribute.rsplit(".", 1)[1] for t in SPEC.targets}
    for stage in patch.STAGES:
        method = getattr(patched, stage)
        assert patched_by(method) == SPEC.name, stage
        assert getattr(method, MAGIC_ATTR, None), f"{stage} lost verl's @register attributes"


class Worker:
    """A worker process in miniature: the watchdog patch's heartbeat (no thread) beating to a monitor that keeps
    what it was sent, and a stage listener that keeps what it heard."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import ray

        from r1_ascend.patches import verl_worker_watchdog as patch

        self.patch = patch
        self.sent: list[tuple[Any, ...]] = []
        self.heard: list[tuple[str, str, int | None]] = []
        sent = self.sent

        class Monitor:
            class beat:
                @staticmethod
                def remote(*args: Any) -> None:
                    sent.append(args)

        monkeypatch.setattr(ray, "get_actor", lambda name: Monitor)
        monkeypatch.setattr(ray, "is_initialized", lambda: True)
        monkeypatch.setattr(patch, "_identity", lambda: {"rank": 3, "pid": 1, "node": "n", "actor": "a"})
        monkeypatch.setattr(patch, "_HEART", patch._Heart())
        monkeypatch.setattr(patch._Heart, "_run", lambda self: None)  # no background beats in the test
        monkeypatch.setattr(patch, "STAGE_LISTENERS", [lambda *event: self.heard.append(event)])


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> Worker:
    return Worker(monkeypatch)


def test_a_stage_is_reported_while_the_method_runs(worker: Worker) -> None:
    patch, sent, heard = worker.patch, worker.sent, worker.heard

    class Batch:
        meta_info: ClassVar[dict[str, int]] = {"global_steps": 7}

    inside: list[str | None] = []
    wrapper = patch._build_stage("generate_sequences", lambda self, batch: inside.append(patch._HEART.stage))
    wrapper(object(), Batch())
    assert inside == ["generate_sequences"]
    assert heard == [("generate_sequences", "enter", 7), ("generate_sequences", "leave", 7)]
    assert [args[1] for args in sent] == ["generate_sequences", None]  # entering, then between stages
    assert sent[0][0] == {"rank": 3, "pid": 1, "node": "n", "actor": "a"}
    assert sent[0][3] == 7


def test_a_worker_that_fails_out_of_a_stage_stays_reported_in_it(worker: Worker) -> None:
    """When a peer's node is lost, the survivors' collective raises: the stage they failed in is where the run
    stopped, so their heartbeat keeps naming it (until the next stage), while listeners still hear the leave."""
    patch, sent, heard = worker.patch, worker.sent, worker.heard

    def collective(self: Any, data: Any) -> None:
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")

    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        patch._build_stage("update_actor", collective)(object(), object())
    assert patch._HEART.stage == "update_actor"
    assert heard == [("update_actor", "enter", None), ("update_actor", "leave", None)]
    patch._HEART.beat()  # what the heartbeat thread sends next
    assert [args[1] for args in sent] == ["update_actor", "update_actor"]
    patch._build_stage("save_checkpoint", lambda self, *args: None)(object(), "path", None, 2, 1)
    assert patch._HEART.stage is None  # a stage that returns leaves the worker between stages again


def test_without_a_monitor_the_worker_runs_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's own entry point creates no monitor: the heartbeat is skipped, the method runs."""
    import ray

    from r1_ascend.patches import verl_worker_watchdog as patch

    def no_monitor(name: str) -> None:
        raise ValueError(f"Failed to look up actor with name {name!r}")

    monkeypatch.setattr(ray, "get_actor", no_monitor)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(patch, "_identity", lambda: {"rank": 0, "pid": 1, "node": "n", "actor": ""})
    monkeypatch.setattr(patch, "_HEART", patch._Heart())
    monkeypatch.setattr(patch._Heart, "_run", lambda self: None)
    wrapper = patch._build_stage("update_actor", lambda self, data: "updated")
    assert wrapper(object(), object()) == "updated"
    assert patch._HEART.stage is None
    assert patch._HEART.monitor is None


def test_outside_ray_a_stage_starts_no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrapped method called outside a Ray worker (a test, a script) must not start a local Ray: Ray's API calls
    start one on first use."""
    import ray

    from r1_ascend.patches import verl_worker_watchdog as patch

    assert not ray.is_initialized()
    monkeypatch.setattr(patch, "_HEART", patch._Heart())
    monkeypatch.setattr(patch._Heart, "_run", lambda self: None)
    assert patch._build_stage("update_actor", lambda self, data: "updated")(object(), object()) == "updated"
    assert not ray.is_initialized()
