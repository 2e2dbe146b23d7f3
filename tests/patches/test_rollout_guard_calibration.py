"""The guard's self-calibration and escalation (r1_ascend.patches.rules.rollout_guard) on plain numbers, at their
boundaries: the last calibration step and the first gated one, a baseline of zero (the floor), the caps, a
calibration step above an absolute warn level, N-1 and N warned steps in a row, a healthy step between them, and the
state a checkpoint saves and a resume reads back."""

from __future__ import annotations

import json
import math

import pytest
from omegaconf import OmegaConf

from r1_ascend.patches import RolloutActorMismatchError, RolloutGuardConfigError
from r1_ascend.patches.rules import rollout_guard as guard
from r1_ascend.patches.rules.rollout_guard import Calibration, DiffStats, GuardConfig, GuardState

#: Round numbers, so that every level is easy to follow: caps 1 / 4, factors 4 / 8, floor 0.01, three steps.
CAP_WARN, CAP_STOP, WARN_X, STOP_X, FLOOR, STEPS = 1.0, 4.0, 4.0, 8.0, 0.01, 3


def settings(*, steps: int = STEPS, escalate_after: int = 3) -> GuardConfig:
    calibration = Calibration(
        steps=steps,
        warn_factor=dict.fromkeys(guard.GATED, WARN_X),
        stop_factor=dict.fromkeys(guard.GATED, STOP_X),
        floor=dict.fromkeys(guard.GATED, FLOOR),
    )
    return GuardConfig(
        warn=dict.fromkeys(guard.GATED, CAP_WARN),
        stop=dict.fromkeys(guard.GATED, CAP_STOP),
        calibration=calibration,
        escalate_after=escalate_after,
    )


def step(value: float, *, median: float | None = None, tokens: int = 1000) -> DiffStats:
    """A step whose five gated statistics are all ``value``, or with the median (and so the largest sequence mean)
    at ``median``."""
    median = value if median is None else median
    return DiffStats(
        tokens=tokens,
        abs_sum=value * tokens,
        abs_max=max(value, median),
        k3_sum=value * tokens,
        tail_count=0 if math.isnan(value) else round(value * tokens),
        sequences=1,
        seq_mean_max=median,
        seq_means=(median,),
    )


def run(state: GuardState, config: GuardConfig, values: list[float], start: int = 1) -> list[guard.Verdict]:
    return [state.judge(step(v), config, step=start + i, in_update=False) for i, v in enumerate(values)]


# --- the calibrated levels -------------------------------------------------------------------------------------


def test_a_calibrated_level_is_its_factor_times_the_baseline() -> None:
    baseline = dict.fromkeys(guard.GATED, 0.05)
    levels = guard.calibrated_levels(baseline, settings(), over=[1, 2, 3])
    assert levels.calibrated
    assert levels.warn == dict.fromkeys(guard.GATED, WARN_X * 0.05)
    assert levels.stop == dict.fromkeys(guard.GATED, STOP_X * 0.05)
    assert levels.baseline == baseline
    assert levels.over == (1, 2, 3)


@pytest.mark.parametrize("baseline", [0.0, FLOOR / 2, FLOOR])
def test_a_baseline_at_or_below_its_floor_is_raised_to_the_floor(baseline: float) -> None:
    """A baseline of zero (fp32 on both sides, no token in the tail) must not give levels of zero."""
    levels = guard.calibrated_levels(dict.fromkeys(guard.GATED, baseline), settings())
    assert levels.warn == dict.fromkeys(guard.GATED, WARN_X * FLOOR)
    assert levels.stop == dict.fromkeys(guard.GATED, STOP_X * FLOOR)
    assert levels.baseline == dict.fromkeys(guard.GATED, baseline), "the baseline is logged as measured"


def test_a_baseline_just_above_its_floor_is_used() -> None:
    above = FLOOR * 1.5
    levels = guard.calibrated_levels(dict.fromkeys(guard.GATED, above), settings())
    assert levels.warn["kl_k3"] == pytest.approx(WARN_X * above)
    assert levels.warn["kl_k3"] > WARN_X * FLOOR


def test_a_calibrated_level_never_exceeds_its_absolute_level() -> None:
    config = settings()
    at_warn_cap = CAP_WARN / WARN_X  # warn exactly at its cap, stop at half of its own
    levels = guard.calibrated_levels(dict.fromkeys(guard.GATED, at_warn_cap), config)
    assert (levels.warn["kl_k3"], levels.stop["kl_k3"]) == (CAP_WARN, STOP_X * at_warn_cap)
    above = guard.calibrated_levels(dict.fromkeys(guard.GATED, at_warn_cap * 1.01), config)
    assert above.warn["kl_k3"] == CAP_WARN
    assert above.stop["kl_k3"] == pytest.approx(STOP_X * at_warn_cap * 1.01)
    far = guard.calibrated_levels(dict.fromkeys(guard.GATED, CAP_STOP), config)
    assert (far.warn, far.stop) == (config.warn, config.stop)
    below = guard.calibrated_levels(dict.fromkeys(guard.GATED, at_warn_cap * 0.99), config)
    assert below.warn["kl_k3"] == pytest.approx(CAP_WARN * 0.99)
    assert below.warn["kl_k3"] < CAP_WARN


def test_the_baseline_is_the_largest_value_of_each_statistic() -> None:
    samples = [dict.fromkeys(guard.GATED, 0.1), {**dict.fromkeys(guard.GATED, 0.05), "kl_k3": 0.3}]
    assert guard.baseline_of(samples) == {**dict.fromkeys(guard.GATED, 0.1), "kl_k3": 0.3}
    with pytest.raises(ValueError, match="at least one calibration step"):
        guard.baseline_of([])


# --- calibration over the first steps --------------------------------------------------------------------------


def test_the_last_calibration_step_runs_at_the_absolute_levels_and_the_next_at_the_calibrated_ones() -> None:
    """The same step (0.5 nat: 6x the calibrated stop level, half the absolute warn level) passes as calibration
    step 3 and is stopped as step 4, the first gated step."""
    config, healthy, odd = settings(), FLOOR, 0.5
    assert STOP_X * healthy < odd < CAP_WARN
    last = GuardState()
    *_, third = run(last, config, [healthy, healthy, odd])
    assert not third.levels.calibrated
    assert (third.warned, third.stopped) == ((), ())
    assert len(last.calibration) == STEPS, "the last calibration step is measured"

    first = GuardState()
    run(first, config, [healthy] * STEPS)
    assert first.levels(config).calibrated
    with pytest.raises(RolloutActorMismatchError, match=r"at training step 4 ") as info:
        first.judge(step(odd), config, step=4, in_update=False)
    assert f"(level {STOP_X * healthy:.4g})" in str(info.value)
    assert f"= {STOP_X:g} x the baseline {healthy:.4g}" in str(info.value)


def test_levels_are_absolute_until_the_calibration_steps_were_measured() -> None:
    config, state = settings(), GuardState()
    for measured in range(STEPS):
        assert state.levels(config) == guard.Levels.absolute(config), f"after {measured} steps"
        assert state.calibrating(config)
        run(state, config, [0.02], start=measured + 1)
    assert state.levels(config) == guard.calibrated_levels(dict.fromkeys(guard.GATED, 0.02), config, [1, 2, 3])
    assert not state.calibrating(config)
    run(state, config, [0.03], start=STEPS + 1)
    assert state.levels(config).baseline == dict.fromkeys(guard.GATED, 0.02), "a gated step is not learned"


def test_a_calibration_step_above_an_absolute_warn_level_warns_and_is_not_learned() -> None:
    """A run that starts wrong must not learn a wrong baseline silently: the step warns, and calibration waits for
    a step the absolute levels call healthy. A step exactly at the warn level is not above it, and is learned."""
    config, state = settings(), GuardState()
    verdicts = run(state, config, [0.02, CAP_WARN * 1.5, CAP_WARN, 0.03])
    assert [bool(v.warned) for v in verdicts] == [False, True, False, False]
    assert [o.step for o in state.calibration] == [1, 3, 4]
    assert state.levels(config).baseline == dict.fromkeys(guard.GATED, CAP_WARN)


def test_calibration_off_keeps_the_absolute_levels() -> None:
    config, state = settings(steps=0), GuardState()
    *_, last = run(state, config, [0.02] * 5)
    assert not last.levels.calibrated
    assert state.levels(config) == guard.Levels.absolute(config)
    assert not state.calibrating(config)


def test_a_step_without_compared_tokens_is_neither_learned_nor_counted() -> None:
    config, state = settings(), GuardState()
    run(state, config, [CAP_WARN * 1.5])
    verdict = state.judge(step(0.0, tokens=0), config, step=2, in_update=False)
    assert (verdict.warned, verdict.stopped) == ((), ())
    assert (len(state.calibration), len(state.warned_run)) == (0, 1)


def test_nan_stops_a_calibration_step() -> None:
    with pytest.raises(RolloutActorMismatchError, match="at training step 1 "):
        GuardState().judge(step(math.nan), settings(), step=1, in_update=False)


# --- escalation ------------------------------------------------------------------------------------------------


def test_warned_steps_in_a_row_stop_the_run_at_the_nth() -> None:
    config, state = settings(steps=0, escalate_after=3), GuardState()
    warned = CAP_WARN * 1.5
    run(state, config, [warned, warned])  # N - 1 warned steps go on
    assert len(state.warned_run) == 2
    with pytest.raises(RolloutActorMismatchError) as info:
        state.judge(step(warned), config, step=3, in_update=True)
    message = str(info.value)
    assert message.startswith("rollout guard: escalated to a stop at training step 3: 3 steps in a row (1-3)")
    assert "r1_ascend.rollout_guard.escalate_after=3" in message
    assert "rollout_guard/log_prob_abs_diff_mean above its warn level in 3 of them (1.5, 1.5, 1.5 nats" in message
    assert "warn level now 1, the absolute level r1_ascend.rollout_guard.warn.abs_diff_mean" in message


def test_a_healthy_step_between_warned_steps_starts_the_count_again() -> None:
    config, state = settings(steps=0, escalate_after=3), GuardState()
    warned = CAP_WARN * 1.5
    run(state, config, [warned, warned, CAP_WARN, warned, warned])  # at the warn level: not warned
    assert [o.step for o in state.warned_run] == [4, 5]
    with pytest.raises(RolloutActorMismatchError, match=r"step 6: 3 steps in a row \(4-6\)"):
        run(state, config, [warned], start=6)


def test_one_warned_step_stops_with_escalate_after_one_and_none_with_zero() -> None:
    with pytest.raises(RolloutActorMismatchError, match="escalated to a stop at training step 1: 1 steps"):
        run(GuardState(), settings(steps=0, escalate_after=1), [CAP_WARN * 1.5])
    state = GuardState()
    run(state, settings(steps=0, escalate_after=0), [CAP_WARN * 1.5] * 10)
    assert len(state.warned_run) == 10


def test_warned_calibration_steps_escalate_too() -> None:
    """A run that starts wrong, every step above an absolute warn level, is stopped after escalate_after steps."""
    with pytest.raises(RolloutActorMismatchError, match="escalated to a stop at training step 3"):
        run(GuardState(), settings(escalate_after=3), [CAP_WARN * 1.5] * 3)


def test_the_escalation_names_first_the_statistic_that_warned_every_step() -> None:
    config, state = settings(steps=0, escalate_after=2), GuardState()
    state.judge(step(1.5, median=0.5), config, step=7, in_update=False)  # the mean only
    with pytest.raises(RolloutActorMismatchError) as info:
        state.judge(step(1.5, median=1.25), config, step=8, in_update=False)  # the mean, the median, the largest
    kept = str(info.value).split("Kept warning: ")[1]
    assert kept.startswith("rollout_guard/log_prob_abs_diff_mean above its warn level in 2 of them (1.5, 1.5 nats")
    assert "rollout_guard/seq_abs_diff_median above its warn level in 1 of them (0.5, 1.25 nats" in kept


# --- the state a checkpoint keeps ------------------------------------------------------------------------------


def test_the_state_survives_a_round_trip_through_json() -> None:
    config, state = settings(), GuardState()
    run(state, config, [0.02, 0.04, 0.03, 0.2])  # the fourth warns: 5x the baseline, above 4x
    assert [o.step for o in state.warned_run] == [4]
    restored = GuardState.from_record(json.loads(json.dumps(state.record())), "global_step_4/rollout_guard.json")
    assert restored == state
    assert restored.levels(config) == state.levels(config)


def test_a_calibration_cut_short_by_a_checkpoint_continues_after_the_resume() -> None:
    config, state = settings(), GuardState()
    run(state, config, [0.02, 0.05])
    resumed = GuardState.from_record(state.record(), "saved")
    assert resumed.calibrating(config)
    run(resumed, config, [0.03], start=3)
    assert resumed.levels(config) == guard.calibrated_levels(dict.fromkeys(guard.GATED, 0.05), config, [1, 2, 3])


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"version": 99, "calibration": [], "warned_run": []}, "version 99, expected 1"),
        ({"version": 1, "calibration": []}, "KeyError"),
        ({"version": 1, "calibration": [{"step": 1, "values": {"kl_k3": 0.1}}], "warned_run": []}, "statistics"),
        ([1, 2], "AttributeError"),
    ],
    ids=["version", "missing-key", "statistics", "not-a-mapping"],
)
def test_a_damaged_state_is_refused_naming_the_file_and_the_way_out(record: object, expected: str) -> None:
    with pytest.raises(RolloutGuardConfigError) as info:
        GuardState.from_record(record, "/ckpt/global_step_5/rollout_guard.json")
    message = str(info.value)
    assert message.startswith("the rollout guard's state saved in /ckpt/global_step_5/rollout_guard.json cannot be")
    assert expected in message
    assert "calibration.on_resume=recalibrate" in message


# --- messages ----------------------------------------------------------------------------------------------------


def test_a_level_says_whether_it_is_calibrated_floored_or_capped() -> None:
    config = settings()
    floored = guard.calibrated_levels(dict.fromkeys(guard.GATED, 0.0), config, [1, 2, 3])
    assert floored.explain("kl_k3", "stop") == (
        f"{STOP_X * FLOOR:g} = {STOP_X:g} x the baseline 0 raised to its floor {FLOOR:g} (calibration steps 1-3)"
    )
    capped = guard.calibrated_levels(dict.fromkeys(guard.GATED, 0.5), config, [1, 2, 3])
    assert capped.explain("kl_k3", "warn") == (
        f"{CAP_WARN:g}, the absolute cap r1_ascend.rollout_guard.warn.kl_k3 ({WARN_X:g} x the baseline 0.5 is above it)"
    )
    assert guard.Levels.absolute(config).explain("kl_k3", "stop") == (
        f"{CAP_STOP:g}, the absolute level r1_ascend.rollout_guard.stop.kl_k3"
    )


def test_metrics_log_the_baseline_once_calibrated() -> None:
    config, state = settings(), GuardState()
    run(state, config, [0.02] * STEPS)
    verdict = state.judge(step(0.03), config, step=4, in_update=False)
    logged = guard.metrics(step(0.03), verdict, in_update=False)
    for name in guard.GATED:
        assert logged[guard.level_key(guard.BASELINE_PREFIX, name)] == 0.02
        assert logged[guard.level_key(guard.WARN_PREFIX, name)] == pytest.approx(WARN_X * 0.02)
        assert logged[guard.level_key(guard.STOP_PREFIX, name)] == pytest.approx(STOP_X * 0.02)


def test_preflight_lines_show_caps_factors_floors_calibration_and_escalation() -> None:
    lines = settings().describe()
    assert lines[0].split() == ["statistic", "warn", "cap", "stop", "cap", "floor", "warn", "x", "stop", "x"]
    assert lines[1].split() == ["abs_diff_mean", f"{CAP_WARN:g}", f"{CAP_STOP:g}", f"{FLOOR:g}", f"{WARN_X:g}",
                                f"{STOP_X:g}"]  # fmt: skip
    assert f"the first {STEPS} healthy step(s)" in lines[-2]
    assert "on resume: restore" in lines[-2]
    assert lines[-1] == "escalation: 3 warned steps in a row stop the run"
    assert "calibration: off" in settings(steps=0).describe()[-2]
    assert "escalation: off" in settings(escalate_after=0).describe()[-1]
    assert GuardConfig(enabled=False).describe()[0].startswith("off (r1_ascend.rollout_guard.enabled=false)")


# --- settings ------------------------------------------------------------------------------------------------------


def configured(**values: object) -> GuardConfig:
    return GuardConfig.from_config(OmegaConf.create({"r1_ascend": {"rollout_guard": values}}))


def test_absent_calibration_settings_are_the_defaults() -> None:
    found = configured()
    assert found.calibration == Calibration()
    assert found.escalate_after == guard.DEFAULT_ESCALATE_AFTER
    assert (found.calibration.steps, found.calibration.on_resume) == (guard.DEFAULT_CALIBRATION_STEPS, "restore")
    assert found.calibration.warn_factor == guard.DEFAULT_WARN_FACTOR
    assert found.calibration.floor == guard.DEFAULT_FLOOR


def test_the_default_factors_and_floors_make_valid_levels() -> None:
    for name in guard.GATED:
        assert 1 <= guard.DEFAULT_WARN_FACTOR[name] <= guard.DEFAULT_STOP_FACTOR[name], name
        assert 0 < guard.DEFAULT_FLOOR[name] * guard.DEFAULT_WARN_FACTOR[name] <= guard.DEFAULT_WARN[name], name
        assert guard.DEFAULT_FLOOR[name] * guard.DEFAULT_STOP_FACTOR[name] <= guard.DEFAULT_STOP[name], name


def test_calibration_settings_are_read_and_the_rest_kept() -> None:
    found = configured(
        calibration={"steps": 0, "warn_factor": {"kl_k3": 1}, "floor": {"tail_fraction": 1e-9}},
        escalate_after=0,
    )
    assert (found.calibration.steps, found.escalate_after) == (0, 0)
    assert found.calibration.warn_factor == {**guard.DEFAULT_WARN_FACTOR, "kl_k3": 1.0}
    assert found.calibration.floor["tail_fraction"] == 1e-9
    assert found.calibration.stop_factor == guard.DEFAULT_STOP_FACTOR


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"calibration": {"steps": -1}}, "calibration.steps must be a whole number >= 0 (0: no calibration), got -1"),
        ({"calibration": {"steps": 2.5}}, "calibration.steps must be a whole number >= 0"),
        ({"calibration": {"steps": True}}, "calibration.steps must be a whole number >= 0"),
        ({"calibration": {"warn_factor": {"kl_k3": 0.999}}}, "calibration.warn_factor.kl_k3 must be a finite number "
         ">= 1 (a multiple of the run's healthy baseline), got 0.999"),
        ({"calibration": {"stop_factor": {"kl_k3": math.inf}}}, "calibration.stop_factor.kl_k3 must be a finite"),
        ({"calibration": {"warn_factor": {"kl_k3": 9}, "stop_factor": {"kl_k3": 8}}},
         "calibration: a warn_factor must not exceed its stop_factor (kl_k3: warn_factor 9 > stop_factor 8)"),
        ({"calibration": {"floor": {"kl_k3": 0}}}, "calibration.floor.kl_k3 must be a positive finite number (nats)"),
        ({"calibration": {"floor": {"abs_diff_max": 0.1}}}, "unknown statistic(s) ['abs_diff_max'] under"),
        ({"calibration": {"on_resume": "keep"}}, "calibration.on_resume must be one of ['restore', 'recalibrate']"),
        ({"calibration": {"length": 3}}, "unknown key(s) ['length'] under r1_ascend.rollout_guard.calibration"),
        ({"calibration": 3}, "r1_ascend.rollout_guard.calibration must be a mapping with keys ['steps'"),
        ({"escalate_after": -2}, "escalate_after must be a whole number >= 0 (0: never), got -2"),
        ({"escalate_after": "3"}, "escalate_after must be a whole number >= 0"),
    ],
)  # fmt: skip
def test_calibration_settings_that_cannot_work_are_refused(values: dict[str, object], expected: str) -> None:
    with pytest.raises(RolloutGuardConfigError) as info:
        configured(**values)
    assert expected in str(info.value)


def test_a_factor_of_exactly_one_is_accepted() -> None:
    found = configured(calibration={"warn_factor": {"kl_k3": 1}, "stop_factor": {"kl_k3": 1}})
    assert found.calibration.warn_factor["kl_k3"] == found.calibration.stop_factor["kl_k3"] == 1.0
