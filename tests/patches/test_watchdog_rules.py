"""The watchdog's rules (r1_ascend.patches.rules.watchdog) at their edges: a worker silent exactly for the limit is
not yet lost, a stage exactly at its limit not yet overdue, the smallest settings that can work are accepted and one
less is refused, and the messages name the right ranks, stage and step."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from r1_ascend.patches import WatchdogConfigError
from r1_ascend.patches.rules.watchdog import (
    BEAT_S,
    MIN_MISSED_BEATS,
    Beat,
    Stall,
    WatchdogConfig,
    find_stall,
    rank_ranges,
)

CONFIG = WatchdogConfig(silence_s=60.0, stage_s=600.0, poll_s=5.0)


def beat(rank: int, silent_s: float = 1.0, stage: str | None = "update_actor", stage_s: float = 10.0, step=3) -> Beat:
    return Beat(rank, 100 + rank, f"node{rank}", f"actor{rank}", stage, stage_s, silent_s, step)


# --- settings ------------------------------------------------------------------------------------------------


def test_the_defaults_are_the_documented_ones() -> None:
    assert WatchdogConfig.from_mapping({}) == WatchdogConfig(True, 180.0, 10800.0, 5.0)


def test_the_shortest_silence_is_three_beats() -> None:
    shortest = MIN_MISSED_BEATS * BEAT_S
    assert WatchdogConfig.from_mapping({"silence_s": shortest, "poll_s": 1}).silence_s == shortest
    with pytest.raises(WatchdogConfigError, match=rf"silence_s = {shortest - 0.5:g} s is shorter than 3 heartbeats"):
        WatchdogConfig.from_mapping({"silence_s": shortest - 0.5, "poll_s": 1})


def test_polling_may_be_as_slow_as_the_silence_limit_not_slower() -> None:
    assert WatchdogConfig.from_mapping({"silence_s": 20, "poll_s": 20}).poll_s == 20.0
    with pytest.raises(WatchdogConfigError, match=r"poll_s \(20\.5 s\) must not exceed silence_s \(20 s\)"):
        WatchdogConfig.from_mapping({"silence_s": 20, "poll_s": 20.5})


@pytest.mark.parametrize("key", ["silence_s", "stage_s", "poll_s"])
@pytest.mark.parametrize("value", [0, -1, math.inf, math.nan, True, "60", None])
def test_every_duration_must_be_a_positive_number(key: str, value: object) -> None:
    with pytest.raises(WatchdogConfigError, match=rf"r1_ascend\.watchdog\.{key} must be a positive number of seconds"):
        WatchdogConfig.from_mapping({key: value})


def test_durations_are_read_as_seconds() -> None:
    config = WatchdogConfig.from_mapping({"enabled": False, "silence_s": 30, "stage_s": 1, "poll_s": 2})
    assert config == WatchdogConfig(False, 30.0, 1.0, 2.0)
    assert all(isinstance(v, float) for v in (config.silence_s, config.stage_s, config.poll_s))


@pytest.mark.parametrize("values", [{"enabled": "yes"}, {"enabled": 1}, {"silence": 60}])
def test_an_unknown_key_or_a_non_boolean_switch_is_refused(values: dict[str, object]) -> None:
    with pytest.raises(WatchdogConfigError, match=r"r1_ascend\.watchdog"):
        WatchdogConfig.from_mapping(values)


def test_the_config_is_read_from_the_recipe_key() -> None:
    from omegaconf import OmegaConf

    config = OmegaConf.create({"r1_ascend": {"watchdog": {"silence_s": 45, "poll_s": 3}}})
    assert WatchdogConfig.from_config(config) == WatchdogConfig(True, 45.0, 10800.0, 3.0)
    assert WatchdogConfig.from_config(OmegaConf.create({})) == WatchdogConfig()
    with pytest.raises(WatchdogConfigError, match="must be a mapping"):
        WatchdogConfig.from_config(OmegaConf.create({"r1_ascend": {"watchdog": [1]}}))


def test_interpolations_in_the_settings_are_resolved() -> None:
    """Hydra configs refer to other keys (``${...}``); the watchdog reads the values they name."""
    from omegaconf import OmegaConf

    config = OmegaConf.create(
        {"limits": {"silence": 45}, "r1_ascend": {"watchdog": {"silence_s": "${limits.silence}"}}}
    )
    assert WatchdogConfig.from_config(config).silence_s == 45.0


# --- when a worker is lost or stuck --------------------------------------------------------------------------


def test_silent_exactly_for_the_limit_is_not_yet_lost() -> None:
    assert find_stall([beat(0, silent_s=CONFIG.silence_s)], CONFIG) is None
    stall = find_stall([beat(0, silent_s=CONFIG.silence_s + 0.01)], CONFIG)
    assert stall is not None
    assert (stall.kind, stall.limit_s) == ("silent", CONFIG.silence_s)


def test_a_stage_exactly_at_its_limit_is_not_yet_overdue() -> None:
    assert find_stall([beat(0, stage_s=CONFIG.stage_s)], CONFIG) is None
    stall = find_stall([beat(0, stage_s=CONFIG.stage_s + 0.01)], CONFIG)
    assert stall is not None
    assert (stall.kind, stall.limit_s) == ("overdue", CONFIG.stage_s)


def test_between_stages_nothing_is_overdue() -> None:
    assert find_stall([beat(0, stage=None, stage_s=10 * CONFIG.stage_s)], CONFIG) is None


def test_silence_is_named_before_an_overdue_stage_and_culprits_are_in_rank_order() -> None:
    beats = [beat(3, silent_s=90), beat(0, stage_s=900), beat(1, silent_s=70), beat(2)]
    stall = find_stall(beats, CONFIG)
    assert stall is not None
    assert stall.kind == "silent"
    assert [b.rank for b in stall.culprits] == [1, 3]
    assert [b.rank for b in stall.others] == [0, 2]


def test_overdue_culprits_and_the_others() -> None:
    stall = find_stall([beat(2, stage_s=700), beat(0, stage_s=650), beat(1, stage_s=5)], CONFIG)
    assert stall is not None
    assert [b.rank for b in stall.culprits] == [0, 2]
    assert [b.rank for b in stall.others] == [1]


@given(st.lists(st.tuples(st.floats(0, 200), st.floats(0, 2000)), max_size=6))
def test_a_stall_is_found_exactly_when_a_limit_is_passed(times: list[tuple[float, float]]) -> None:
    beats = [beat(rank, silent_s=silent, stage_s=stage) for rank, (silent, stage) in enumerate(times)]
    silent = [b.rank for b in beats if b.silent_s > CONFIG.silence_s]
    overdue = [b.rank for b in beats if b.stage_s > CONFIG.stage_s]
    stall = find_stall(beats, CONFIG)
    if silent:
        assert stall is not None
        assert (stall.kind, [b.rank for b in stall.culprits]) == ("silent", silent)
    elif overdue:
        assert stall is not None
        assert (stall.kind, [b.rank for b in stall.culprits]) == ("overdue", overdue)
    else:
        assert stall is None


# --- what is said ----------------------------------------------------------------------------------------------


def test_the_stage_is_the_culprits_most_common_one_else_the_others() -> None:
    culprits = (beat(0, stage="generate_sequences"), beat(1, stage="update_actor"), beat(2, stage="update_actor"))
    assert Stall("silent", culprits, (), 60).stage == "update_actor"
    between = (beat(0, stage=None),)
    assert Stall("silent", between, (beat(1, stage="compute_log_prob"),), 60).stage == "compute_log_prob"
    assert Stall("silent", between, (beat(1, stage=None),), 60).stage is None


def test_the_step_is_the_latest_any_worker_reported() -> None:
    assert Stall("silent", (beat(0, step=4),), (beat(1, step=5), beat(2, step=None)), 60).step == 5
    assert Stall("silent", (beat(0, step=None),), (), 60).step is None


def test_a_silent_worker_is_described_with_its_peers_wait() -> None:
    stall = Stall("silent", (beat(1, silent_s=75.4, stage=None),), (beat(0, stage_s=80.6), beat(2, stage=None)), 60)
    text = stall.describe()
    assert text.startswith("rank 1 (pid 101 on node node1) sent no heartbeat for 75 s, last in no stage (limit 60 s)")
    assert "; 1 other worker(s) were waiting in update_actor for up to 81 s." in text
    alone = Stall("silent", (beat(1, silent_s=75),), (beat(0, stage=None),), 60).describe()
    assert "other worker" not in alone
    assert "last in update_actor (limit 60 s). A silent worker was killed" in alone


def test_an_overdue_stage_is_described_with_its_longest_rank() -> None:
    culprits = (beat(0, stage_s=700), beat(1, stage_s=905.2), beat(2, stage_s=650), beat(5, stage_s=610))
    text = Stall("overdue", culprits, (), 600).describe()
    assert text.startswith("stage update_actor has run for 905 s on rank(s) 0-2, 5 (limit 600 s)")
    assert text.endswith("longest: rank 1 (pid 101 on node node1)")


@pytest.mark.parametrize(
    ("ranks", "text"),
    [([], ""), ([4], "4"), ([0, 1, 2, 5], "0-2, 5"), ([1, 3, 4, 5, 7, 8], "1, 3-5, 7-8"), ([10, 11], "10-11")],
)
def test_rank_ranges(ranks: list[int], text: str) -> None:
    assert rank_ranges(ranks) == text


def test_every_silent_worker_is_named_and_what_silence_means() -> None:
    culprits = (beat(1, silent_s=70), beat(3, silent_s=90, stage=None))
    text = Stall("silent", culprits, (), 60).describe()
    assert text == (
        "rank 1 (pid 101 on node node1) sent no heartbeat for 70 s, last in update_actor; rank 3 (pid 103 on node "
        "node3) sent no heartbeat for 90 s, last in no stage (limit 60 s). A silent worker was killed (OOM killer, a "
        "device error), stopped (SIGSTOP, a process stuck in the device driver) or lost with its node"
    )


def test_a_too_short_silence_is_refused_with_the_shortest_allowed() -> None:
    with pytest.raises(WatchdogConfigError) as info:
        WatchdogConfig.from_mapping({"silence_s": 10, "poll_s": 1})
    assert str(info.value) == (
        "r1_ascend.watchdog.silence_s = 10 s is shorter than 3 heartbeats (15 s): a busy host would be taken for a "
        "lost worker; set at least that"
    )
