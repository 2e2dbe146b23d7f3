"""The rehearsal's learning verdicts (r1_ascend.rehearse.training) at the edges of their rules, on step metrics as
``step_metrics`` returns them: one zero-gradient step among healthy ones, a reward rise exactly at the required
margin, a window longer than the run, a guard statistic exactly at its warn level."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from r1_ascend.patches.rules import rollout_guard as guard
from r1_ascend.rehearse import training
from r1_ascend.rehearse.training import TrainingError


def steps_with(norms: list[float | None]) -> dict[int, dict[str, float]]:
    """One step per entry; None leaves the grad norm out of that step's metrics."""
    return {
        step: ({} if norm is None else {training.GRAD_NORM: norm}) | {training.REWARD: 0.5}
        for step, norm in enumerate(norms, start=1)
    }


@pytest.mark.parametrize(
    "norms",
    [[1.5, 0.0, 1.5], [0.0, 0.0, 1e-12], [0.0, None, 2.0], [3.0]],
    ids=["one-zero-step", "only-the-last-flows", "one-step-unlogged", "single-step"],
)
def test_gradients_that_flow_at_some_step_pass(norms: list[float | None]) -> None:
    """A step with all-zero advantages (every sample of every prompt scored alike) has grad norm exactly 0; that
    happens in a healthy run. The verdict fails only a run where no step moved the weights."""
    training.check_gradients(steps_with(norms))


@pytest.mark.parametrize(
    "norms", [[0.0, 0.0, 0.0], [None, None], [0.0, None], []], ids=["all-zero", "never-logged", "zero-or-none", "none"]
)
def test_no_step_with_a_gradient_fails(norms: list[float | None]) -> None:
    with pytest.raises(TrainingError, match="grad_norm is 0 at every step"):
        training.check_gradients(steps_with(norms))


@given(st.lists(st.one_of(st.none(), st.floats(0, 10)), max_size=8))
def test_gradients_pass_exactly_when_some_step_has_a_positive_norm(norms: list[float | None]) -> None:
    flowed = any(norm is not None and norm > 0 for norm in norms)
    if flowed:
        training.check_gradients(steps_with(norms))
    else:
        with pytest.raises(TrainingError):
            training.check_gradients(steps_with(norms))


def test_a_rise_of_exactly_the_margin_passes() -> None:
    """Rewards chosen so the difference of the window means is exact in binary floating point."""
    curve = training.Curve({1: 0.25, 2: 0.25, 3: 0.75, 4: 0.75}, 2)
    assert curve.last - curve.first == 0.5
    training.check_learning(curve, 0.5)
    with pytest.raises(TrainingError, match=r"needed \+0\.75"):
        training.check_learning(curve, 0.75)


def test_the_window_is_cut_to_the_run() -> None:
    """Fewer steps than the window: both means are over every step, so the rise is 0."""
    curve = training.reward_curve({1: {training.REWARD: 0.2}, 2: {training.REWARD: 0.8}}, window=3)
    assert curve.window == 2
    assert curve.first == curve.last == pytest.approx(0.5)


def test_the_windows_are_the_first_and_last_steps() -> None:
    rewards = {1: 0.0, 2: 0.1, 3: 0.2, 4: 0.3, 5: 0.4, 6: 1.0}
    curve = training.reward_curve({step: {training.REWARD: value} for step, value in rewards.items()}, window=2)
    assert curve.first == pytest.approx(0.05)
    assert curve.last == pytest.approx(0.7)


def test_no_step_at_all_has_no_reward() -> None:
    with pytest.raises(TrainingError, match="missing at steps all"):
        training.reward_curve({})


def test_the_largest_gap_is_the_largest_step_mean() -> None:
    steps = {1: {training.GAP: 0.002}, 2: {}, 3: {training.GAP: 0.009}, 4: {training.GAP: 0.004}}
    assert training.max_gap(steps) == 0.009


def guarded(value: float, level: float, warned: float = 0.0) -> dict[str, float]:
    key = guard.METRIC_MEAN
    return {key: value, guard.WARN_PREFIX + key.removeprefix(guard.PREFIX): level, guard.METRIC_WARNED: warned}


def test_a_statistic_at_its_warn_level_is_quiet() -> None:
    """The guard warns above the level, not at it."""
    training.check_guard_quiet({1: guarded(0.02, 0.02)})
    with pytest.raises(TrainingError, match=r"step 1: rollout_guard/log_prob_abs_diff_mean = 0\.0201"):
        training.check_guard_quiet({1: guarded(0.0201, 0.02)})


def test_a_nan_statistic_is_never_quiet() -> None:
    with pytest.raises(TrainingError, match=r"log_prob_abs_diff_mean = nan"):
        training.check_guard_quiet({1: guarded(math.nan, 0.02)})


def test_a_statistic_without_its_level_is_not_judged() -> None:
    """A statistic logged without the level it is judged by (a run of an older guard) raises nothing by itself."""
    training.check_guard_quiet({1: {guard.METRIC_MEAN: 5.0}})


def test_every_loud_step_is_named() -> None:
    steps = {1: guarded(0.5, 0.02), 2: guarded(0.001, 0.02), 3: guarded(0.001, 0.02, warned=1.0)}
    with pytest.raises(TrainingError) as info:
        training.check_guard_quiet(steps)
    message = str(info.value)
    assert "step 1: rollout_guard/log_prob_abs_diff_mean = 0.5 (warn level 0.02)" in message
    assert f"step 3: {guard.METRIC_WARNED} = 1" in message
    assert "step 2" not in message


@pytest.mark.parametrize("count", [8, 9])
def test_non_finite_metrics_are_listed_up_to_eight(count: int) -> None:
    steps = {step: {"actor/entropy": math.nan} for step in range(1, count + 1)}
    with pytest.raises(TrainingError) as info:
        training.check_finite(steps, [Path("run1.log"), Path("run2.log")])
    shown = ", ".join(f"actor/entropy at step {step}" for step in range(1, 9))
    more = " (+1 more)" if count > 8 else ""
    assert str(info.value) == f"non-finite metrics: {shown}{more}; logs: run1.log, run2.log"


def test_a_flat_curve_is_shown_step_by_step() -> None:
    curve = training.Curve({1: 0.25, 2: 0.25, 3: 0.25}, 1)
    with pytest.raises(TrainingError, match=r"curve: 1: 0\.25, 2: 0\.25, 3: 0\.25$"):
        training.check_learning(curve, 0.5)


def test_every_statistic_above_its_level_is_listed_per_step() -> None:
    seq_max = guard.METRIC_NAMES["seq_abs_diff_max"]
    two = guarded(0.5, 0.02) | {seq_max: 0.75, guard.WARN_PREFIX + seq_max.removeprefix(guard.PREFIX): 0.25}
    with pytest.raises(TrainingError) as info:
        training.check_guard_quiet({1: two, 2: guarded(0.5, 0.02)})
    mean = f"{guard.METRIC_MEAN} = 0.5 (warn level 0.02)"
    assert str(info.value).endswith(f"step 1: {mean}, {seq_max} = 0.75 (warn level 0.25); step 2: {mean}")
