"""The rehearsal's learning verdicts (r1_ascend.rehearse.training) on console logs written the way verl writes them:
a run that learns passes; no rise, no gradient, a NaN metric or an unmeasured rollout each fail, naming what."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from r1_ascend.rehearse import training
from r1_ascend.rehearse.training import TrainingError

PREFIX = "\x1b[36m(R1AscendTaskRunner pid=7)\x1b[0m "


def step_line(step: int, **metrics: float) -> str:
    pairs = " - ".join(f"{name.replace('__', '/')}:{value}" for name, value in metrics.items())
    return f"{PREFIX}step:{step} - {pairs}\n"


def write_run(path: Path, steps: dict[int, dict[str, float]]) -> Path:
    path.write_text("".join(step_line(step, **metrics) for step, metrics in steps.items()))
    return path


def healthy(step: int, reward: float) -> dict[str, float]:
    return {
        "critic__score__mean": reward,
        "actor__grad_norm": 1.5,
        "rollout_guard__log_prob_abs_diff_mean": 0.004,
        "actor__pg_loss": -0.02,
    }


REWARDS = [0.12, 0.22, 0.22, 0.34, 0.5, 0.59, 0.75, 0.94, 0.97, 1.0, 1.0, 1.0]


def logs(tmp_path: Path, rewards: list[float], edit=None) -> list[Path]:
    steps = {i + 1: healthy(i + 1, r) for i, r in enumerate(rewards)}
    if edit is not None:
        edit(steps)
    half = len(steps) // 2
    first = {s: m for s, m in steps.items() if s <= half}
    second = {s: m for s, m in steps.items() if s > half}
    return [write_run(tmp_path / "run1.log", first), write_run(tmp_path / "run2.log", second)]


def test_a_run_that_learns_passes(tmp_path: Path) -> None:
    metrics = training.step_metrics(logs(tmp_path, REWARDS))
    training.check_finite(metrics, [])
    training.check_gradients(metrics)
    curve = training.reward_curve(metrics)
    training.check_learning(curve, 0.25)
    assert curve.first == pytest.approx(sum(REWARDS[:3]) / 3)
    assert curve.last == pytest.approx(1.0)
    assert training.max_gap(metrics) == pytest.approx(0.004)


def test_a_flat_reward_fails_and_shows_the_curve(tmp_path: Path) -> None:
    curve = training.reward_curve(training.step_metrics(logs(tmp_path, [0.2] * 12)))
    with pytest.raises(TrainingError, match=r"did not rise: mean 0\.200 .* 0\.200 .*1: 0\.20"):
        training.check_learning(curve, 0.25)


@given(st.lists(st.floats(0, 1), min_size=6, max_size=16), st.floats(0.05, 0.9))
def test_the_rise_is_last_minus_first(rewards: list[float], rise: float) -> None:
    curve = training.Curve(dict(enumerate(rewards, 1)), 3)
    expected_ok = sum(rewards[-3:]) / 3 - sum(rewards[:3]) / 3 >= rise
    if expected_ok:
        training.check_learning(curve, rise)
    else:
        with pytest.raises(TrainingError):
            training.check_learning(curve, rise)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_metric_is_named_with_its_step(tmp_path: Path, bad: float) -> None:
    def plant(steps: dict[int, dict[str, float]]) -> None:
        steps[5]["actor__entropy"] = bad

    paths = logs(tmp_path, REWARDS, plant)
    with pytest.raises(TrainingError, match="actor/entropy at step 5"):
        training.check_finite(training.step_metrics(paths), paths)


def test_zero_gradients_at_every_step_fail(tmp_path: Path) -> None:
    def zero(steps: dict[int, dict[str, float]]) -> None:
        for metrics in steps.values():
            metrics["actor__grad_norm"] = 0.0

    with pytest.raises(TrainingError, match="grad_norm is 0 at every step"):
        training.check_gradients(training.step_metrics(logs(tmp_path, REWARDS, zero)))


def test_an_unmeasured_rollout_fails(tmp_path: Path) -> None:
    def drop(steps: dict[int, dict[str, float]]) -> None:
        for metrics in steps.values():
            del metrics["rollout_guard__log_prob_abs_diff_mean"]

    with pytest.raises(TrainingError, match="never logged"):
        training.max_gap(training.step_metrics(logs(tmp_path, REWARDS, drop)))


def test_a_missing_reward_fails(tmp_path: Path) -> None:
    def drop(steps: dict[int, dict[str, float]]) -> None:
        del steps[4]["critic__score__mean"]

    with pytest.raises(TrainingError, match=r"missing at steps \[4\]"):
        training.reward_curve(training.step_metrics(logs(tmp_path, REWARDS, drop)))


def test_a_resumed_step_replaces_the_killed_runs_value(tmp_path: Path) -> None:
    first = write_run(tmp_path / "run1.log", {1: healthy(1, 0.1), 2: healthy(2, 0.9)})
    second = write_run(tmp_path / "run2.log", {2: healthy(2, 0.3), 3: healthy(3, 0.5)})
    rewards = training.reward_curve(training.step_metrics([first, second])).rewards
    assert rewards == {1: 0.1, 2: 0.3, 3: 0.5}


def _with_guard(metrics: dict[str, float], mean: float, warn: float = 0.02, warned: float = 0.0) -> dict[str, float]:
    return {
        **metrics,
        "rollout_guard__log_prob_abs_diff_mean": mean,
        "rollout_guard__warn__log_prob_abs_diff_mean": warn,
        "rollout_guard__warned": warned,
    }


def test_a_quiet_guard_passes(tmp_path: Path) -> None:
    steps = {s: _with_guard(healthy(s, r), 0.004) for s, r in enumerate(REWARDS[:4], start=1)}
    training.check_guard_quiet(training.step_metrics([write_run(tmp_path / "run.log", steps)]))


@pytest.mark.parametrize("how", ["above the logged level", "flagged by the guard"])
def test_a_warning_fails_a_run_that_should_be_healthy(tmp_path: Path, how: str) -> None:
    steps = {s: _with_guard(healthy(s, r), 0.004) for s, r in enumerate(REWARDS[:4], start=1)}
    if how == "above the logged level":
        steps[3] = _with_guard(healthy(3, 0.2), 0.03)
    else:
        steps[3] = _with_guard(healthy(3, 0.2), 0.004, warned=1.0)
    with pytest.raises(TrainingError, match=r"warned .*step 3: rollout_guard/") as info:
        training.check_guard_quiet(training.step_metrics([write_run(tmp_path / "run.log", steps)]))
    assert "step 2" not in str(info.value)


def curve_of(rewards: list[float]) -> training.Curve:
    return training.Curve(dict(enumerate(rewards, 1)), 3)


def test_a_curve_that_starts_low_ends_high_and_never_falls_back_holds() -> None:
    training.check_learning_holds(curve_of([0.2, 0.2, 0.3, 0.25, 0.3, 0.5, 0.6, 0.8, 0.9, 1.0]))


@pytest.mark.parametrize(
    ("rewards", "match"),
    [
        ([0.4, 0.3, 0.36, 0.5, 0.6, 0.7, 0.8, 0.9, 0.9, 0.9], r"started at 0\.353"),
        ([0.2, 0.2, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.7, 0.69], r"reached only 0\.697"),
        (
            [0.1, 0.2, 0.3, 0.3, 0.5, 0.19, 0.7, 0.8, 0.9, 1.0],
            r"fell below its first-3-step mean 0\.200 at step\(s\) 6",
        ),
    ],
    ids=["first-above", "last-below", "dip-after-step-5"],
)
def test_each_learning_boundary_fails_naming_it(rewards: list[float], match: str) -> None:
    with pytest.raises(TrainingError, match=match):
        training.check_learning_holds(curve_of(rewards))


def test_a_dip_before_step_5_is_allowed_and_one_at_the_first_mean_is_not_a_fall() -> None:
    training.check_learning_holds(curve_of([0.3, 0.2, 0.1, 0.05, 0.2, 0.5, 0.7, 0.8, 0.9, 1.0]))


@given(st.lists(st.floats(0, 1), min_size=6, max_size=12))
def test_learning_holds_exactly_when_all_three_conditions_do(rewards: list[float]) -> None:
    curve = curve_of(rewards)
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    ok = first <= 0.35 and last >= 0.7 and all(r >= first for r in rewards[4:])
    if ok:
        training.check_learning_holds(curve)
    else:
        with pytest.raises(TrainingError):
            training.check_learning_holds(curve)
