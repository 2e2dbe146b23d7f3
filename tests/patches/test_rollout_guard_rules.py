"""The rollout guard's rules (r1_ascend.patches.rules.rollout_guard) at their edges, on plain tensors and mappings: a
statistic exactly at its level, a token exactly at the tail cut, a step with no compared token, warn equal to stop,
the smallest positive level, partials that do not line up, and what is logged and said."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from r1_ascend.patches import RolloutActorMismatchError, RolloutGuardConfigError
from r1_ascend.patches.rules import rollout_guard as guard
from r1_ascend.patches.rules.rollout_guard import DiffStats, GuardConfig, Verdict


def config(**guard_settings: object) -> object:
    return OmegaConf.create(
        {
            "r1_ascend": {"rollout_guard": guard_settings},
            "actor_rollout_ref": {"rollout": {"calculate_log_probs": True}},
        }
    )


# --- settings --------------------------------------------------------------------------------------------------


def test_absent_settings_are_the_defaults() -> None:
    settings = GuardConfig.from_config(OmegaConf.create({}))
    assert (settings.enabled, settings.warn, settings.stop) == (True, guard.DEFAULT_WARN, guard.DEFAULT_STOP)
    assert GuardConfig.from_config(config(warn=None)).warn == guard.DEFAULT_WARN


def test_a_warn_level_equal_to_its_stop_level_is_accepted() -> None:
    settings = GuardConfig.from_config(config(warn={"kl_k3": 0.03}, stop={"kl_k3": 0.03}))
    assert settings.warn["kl_k3"] == settings.stop["kl_k3"] == 0.03
    assert settings.warn["abs_diff_mean"] == guard.DEFAULT_WARN["abs_diff_mean"]


def test_a_warn_level_above_its_stop_level_is_refused_naming_both() -> None:
    with pytest.raises(RolloutGuardConfigError) as info:
        GuardConfig.from_config(config(warn={"kl_k3": 0.04, "tail_fraction": 0.06}))
    assert str(info.value) == (
        "r1_ascend.rollout_guard: a warn level must not exceed its stop level (tail_fraction: warn 0.06 > stop 0.05, "
        "kl_k3: warn 0.04 > stop 0.03)"
    )


@pytest.mark.parametrize("value", [1e-12, 3, 0.5])
def test_any_positive_finite_level_is_a_float(value: float) -> None:
    settings = GuardConfig.from_config(config(stop={"abs_diff_mean": value}, warn={"abs_diff_mean": value}))
    assert settings.stop["abs_diff_mean"] == float(value)
    assert isinstance(settings.stop["abs_diff_mean"], float)


@pytest.mark.parametrize("value", [0, -0.1, math.inf, math.nan, True, "0.1", None])
def test_a_level_that_is_not_a_positive_finite_number_is_refused(value: object) -> None:
    with pytest.raises(RolloutGuardConfigError) as info:
        GuardConfig.from_config(config(stop={"kl_k3": value}))
    assert str(info.value) == (
        f"r1_ascend.rollout_guard.stop.kl_k3 must be a positive finite number (nats), got {value!r}"
    )


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"warn": {"abs_diff_max": 1.0}}, "unknown statistic(s) ['abs_diff_max'] under r1_ascend.rollout_guard.warn"),
        ({"stop": [0.1]}, "r1_ascend.rollout_guard.stop must be a mapping with keys among"),
        ({"max_mean_abs_diff": 1.0}, "r1_ascend.rollout_guard.max_mean_abs_diff was replaced by "
         "r1_ascend.rollout_guard.stop.abs_diff_mean"),
        ({"levels": {}}, "unknown key(s) ['levels'] under r1_ascend.rollout_guard; valid keys: ['enabled', 'warn', "
         "'stop', 'calibration', 'escalate_after']"),
        ({"enabled": "yes"}, "r1_ascend.rollout_guard.enabled must be true or false, got 'yes'"),
    ],
)  # fmt: skip
def test_settings_that_cannot_work_are_refused_with_the_reason(settings: dict[str, object], expected: str) -> None:
    with pytest.raises(RolloutGuardConfigError) as info:
        GuardConfig.from_config(config(**settings))
    assert str(info.value).startswith(expected)


def test_the_settings_must_be_a_mapping() -> None:
    with pytest.raises(RolloutGuardConfigError, match=r"^r1_ascend\.rollout_guard must be a mapping with keys"):
        GuardConfig.from_config(OmegaConf.create({"r1_ascend": {"rollout_guard": [1]}}))


def test_preflight_reports_the_guards_problems_and_nothing_for_a_good_config() -> None:
    assert guard.config_problems(config()) == []
    no_log_probs = OmegaConf.create({"actor_rollout_ref": {"rollout": {"calculate_log_probs": False}}})
    (problem,) = guard.config_problems(no_log_probs)
    assert "calculate_log_probs is false" in problem
    off = OmegaConf.merge(no_log_probs, {"r1_ascend": {"rollout_guard": {"enabled": False}}})
    assert guard.config_problems(off) == []  # switched off, it needs nothing
    assert guard.config_problems(config(warn={"x": 1})) != []


# --- statistics on tensors -------------------------------------------------------------------------------------


def stats(actor: list[list[float]], rollout: list[list[float]], mask: list[list[int]]) -> DiffStats:
    return DiffStats.from_tensors(torch.tensor(actor), torch.tensor(rollout), torch.tensor(mask))


def test_a_token_exactly_at_the_tail_cut_is_not_in_the_tail() -> None:
    cut = guard.TAIL_CUT
    found = stats([[cut, cut + 0.25, 0.0]], [[0.0, 0.0, 0.0]], [[1, 1, 1]])
    assert found.tail_count == 1
    assert found.statistics()["tail_fraction"] == pytest.approx(1 / 3)


def test_the_statistics_of_one_batch() -> None:
    """Two sequences: Δ = (0.25, -0.5 | 1.0, padding) by the definitions of the module docstring."""
    found = stats([[0.25, -0.5], [1.0, 9.0]], [[0.0, 0.0], [0.0, 0.0]], [[1, 1], [1, 0]])
    deltas = [0.25, -0.5, 1.0]
    assert (found.tokens, found.sequences) == (3, 2)
    assert found.abs_sum == pytest.approx(1.75)
    assert found.abs_max == 1.0
    assert found.k1_sum == pytest.approx(-sum(deltas))
    assert found.k3_sum == pytest.approx(sum(math.expm1(d) - d for d in deltas))
    assert found.mult_sum == pytest.approx(sum(math.exp(abs(d)) for d in deltas))
    assert found.seq_means == pytest.approx((0.375, 1.0))
    assert found.seq_mean_max == pytest.approx(1.0)
    assert found.tail_count == 1
    values = found.statistics()
    assert values["abs_diff_mean"] == pytest.approx(1.75 / 3)
    assert values["seq_abs_diff_median"] == pytest.approx((0.375 + 1.0) / 2)
    assert found.mean == pytest.approx(1.75 / 3)


def test_exponentials_are_clipped_at_the_limit() -> None:
    far = guard.EXP_CLIP + 10
    found = stats([[far]], [[0.0]], [[1]])
    assert found.k3_sum == pytest.approx(math.expm1(guard.EXP_CLIP) - guard.EXP_CLIP)
    assert found.mult_sum == pytest.approx(math.exp(guard.EXP_CLIP))
    assert found.abs_max == pytest.approx(far)


def test_a_sequence_without_a_valid_token_has_no_mean() -> None:
    found = stats([[0.5, 0.5], [9.0, 9.0]], [[0.0, 0.0], [0.0, 0.0]], [[1, 1], [0, 0]])
    assert (found.sequences, found.seq_means) == (1, (0.5,))


def test_no_compared_token_gives_nan_statistics_and_no_verdict() -> None:
    empty = stats([[1.0]], [[0.0]], [[0]])
    assert (empty.tokens, empty.abs_sum, empty.abs_max) == (0, 0.0, 0.0)
    assert math.isnan(empty.mean)
    assert all(math.isnan(v) for v in empty.statistics().values())
    verdict = Verdict.judge(empty, GuardConfig())
    assert (verdict.warned, verdict.stopped) == ((), ())


def test_shapes_must_agree() -> None:
    with pytest.raises(ValueError, match=r"actor log-probs \(1, 2\), rollout log-probs \(1, 2\) and response mask "
                       r"\(1, 3\) must have the same shape"):  # fmt: skip
        stats([[0.0, 0.0]], [[0.0, 0.0]], [[1, 1, 1]])


def test_a_nan_token_is_in_the_tail_and_everywhere() -> None:
    found = stats([[math.nan, 0.0]], [[0.0, 0.0]], [[1, 1]])
    assert found.tail_count == 1
    verdict = Verdict.judge(found, GuardConfig())
    assert verdict.stopped == guard.GATED


@pytest.mark.parametrize(("values", "median"), [((), None), ((3.0,), 3.0), ((4.0, 1.0), 2.5), ((5.0, 1.0, 3.0), 3.0)])
def test_the_median_of_the_sequence_means(values: tuple[float, ...], median: float | None) -> None:
    found = DiffStats(tokens=1, abs_sum=0.0, abs_max=0.0, sequences=len(values), seq_means=values)
    result = found.statistics()["seq_abs_diff_median"]
    assert math.isnan(result) if median is None else result == median


# --- folding partials ------------------------------------------------------------------------------------------


def test_partials_fold_by_sum_and_max_over_nested_lists() -> None:
    a = stats([[0.25, -0.5]], [[0.0, 0.0]], [[1, 1]]).as_raw_metrics()
    b = stats([[1.0]], [[0.0]], [[1]]).as_raw_metrics()
    merged = {key: [[a[key]], [b[key]]] for key in a}  # per rank, per micro-batch
    folded = DiffStats.from_raw_metrics(merged)
    whole = stats([[0.25, -0.5], [1.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]], [[1, 1], [1, 0]])
    assert folded is not None
    assert (folded.tokens, folded.sequences, folded.tail_count) == (whole.tokens, whole.sequences, whole.tail_count)
    assert isinstance(folded.tokens, int)
    assert folded.abs_sum == pytest.approx(whole.abs_sum)
    assert folded.abs_max == whole.abs_max
    assert folded.seq_mean_max == pytest.approx(whole.seq_mean_max)
    assert folded.seq_means == pytest.approx(whole.seq_means)


def test_no_partials_means_no_measurement() -> None:
    assert DiffStats.from_raw_metrics({"actor/loss": 1.0}) is None


def test_partials_that_do_not_line_up_are_an_error() -> None:
    raw = stats([[0.25]], [[0.0]], [[1]]).as_raw_metrics()
    with pytest.raises(ValueError, match="rollout guard partials disagree in length"):
        DiffStats.from_raw_metrics({**raw, guard.raw_key("abs_sum"): [0.1, 0.2]})
    with pytest.raises(ValueError, match="rollout guard partials: 2 per-sequence means for 1 sequences"):
        DiffStats.from_raw_metrics({**raw, guard.raw_key("seq_means"): [0.1, 0.2]})


# --- verdicts, logs and messages -------------------------------------------------------------------------------


def one_statistic(value: float) -> DiffStats:
    """A step whose mean |Δ| is ``value`` (one token, one sequence), everything else quiet."""
    return DiffStats(tokens=1, abs_sum=value, abs_max=value, sequences=1, seq_mean_max=value, seq_means=(value,))


def test_a_statistic_at_its_level_is_not_above_it() -> None:
    """Only the statistics this step has move: the mean, the median and the largest sequence mean (no tail, no KL)."""
    moved = ("abs_diff_mean", "seq_abs_diff_median", "seq_abs_diff_max")
    levels = GuardConfig(warn=dict.fromkeys(guard.GATED, 0.5), stop=dict.fromkeys(guard.GATED, 2.0))
    at = Verdict.judge(one_statistic(0.5), levels)
    assert (at.warned, at.stopped) == ((), ())
    above = Verdict.judge(one_statistic(0.75), levels)
    assert (above.warned, above.stopped) == (moved, ())
    at_stop = Verdict.judge(one_statistic(2.0), levels)
    assert (at_stop.warned, at_stop.stopped) == (moved, ())
    stopped = Verdict.judge(one_statistic(2.25), levels)
    assert (stopped.warned, stopped.stopped) == (moved, moved)


def test_the_logged_metrics_carry_the_levels_counts_and_flags() -> None:
    settings = GuardConfig()
    verdict = Verdict.judge(one_statistic(0.06), settings)
    logged = guard.metrics(one_statistic(0.06), verdict, in_update=True, calibrating=True, warned_steps=1)
    assert logged[guard.METRIC_MEAN] == 0.06
    assert logged["rollout_guard/warn/log_prob_abs_diff_mean"] == settings.warn["abs_diff_mean"]
    assert logged["rollout_guard/stop/kl_k3"] == settings.stop["kl_k3"]
    assert not any(key.startswith(guard.BASELINE_PREFIX) for key in logged), "no baseline at the absolute levels"
    assert (logged[guard.METRIC_TOKENS], logged[guard.METRIC_SEQUENCES]) == (1.0, 1.0)
    assert (logged[guard.METRIC_WARNED], logged[guard.METRIC_IN_UPDATE]) == (1.0, 1.0)
    assert (logged[guard.METRIC_CALIBRATING], logged[guard.METRIC_WARNED_STEPS]) == (1.0, 1.0)
    quiet = guard.metrics(one_statistic(0.001), Verdict.judge(one_statistic(0.001), settings), in_update=False)
    assert (quiet[guard.METRIC_WARNED], quiet[guard.METRIC_IN_UPDATE]) == (0.0, 0.0)
    assert (quiet[guard.METRIC_CALIBRATING], quiet[guard.METRIC_WARNED_STEPS]) == (0.0, 0.0)


def test_check_returns_the_verdict_below_stop_and_raises_above() -> None:
    settings = GuardConfig()
    assert guard.check(one_statistic(0.06), settings, step=3, in_update=False).warned
    with pytest.raises(RolloutActorMismatchError) as info:
        guard.check(one_statistic(0.2), settings, step=3, in_update=True)
    message = str(info.value)
    assert message.startswith("rollout guard: at training step 3 the rollout's log-probs of its own sampled tokens")
    assert "rollout_guard/log_prob_abs_diff_mean = 0.2 nats (level 0.1)" in message
    assert "over 1 response tokens in 1 sequences (mean |Δ| 0.2, max 0.2 nats)" in message
    assert "measured inside the actor update (on-policy shortcut)" in message
    assert "(1) the rollout decoded from stale" in message
    assert "(5) a kernel or precision change" in message
    with pytest.raises(RolloutActorMismatchError, match="by the old-log-prob pass before the update"):
        guard.check(one_statistic(0.2), settings, step=3, in_update=False)


def test_the_warning_names_every_statistic_above_warn() -> None:
    settings = GuardConfig()
    verdict = Verdict.judge(one_statistic(0.06), settings)
    text = guard.warning_message(verdict, step=4, warned_steps=1, config=settings)
    assert text.startswith(
        "rollout guard: step 4 is above the warn level (the run is still calibrating: the absolute levels apply, and "
        "this step is left out of the baseline): rollout_guard/log_prob_abs_diff_mean = 0.06 nats (level 0.05), "
        "rollout_guard/seq_abs_diff_median = 0.06 nats (level 0.05)"
    )
    assert "the absolute level r1_ascend.rollout_guard.warn.abs_diff_mean" in text
    assert f"Not stopped (1 of {settings.escalate_after} warned steps in a row before the run is stopped)" in text


def test_raw_keys_are_prefixed_partials() -> None:
    assert guard.raw_key("tokens") == "rollout_guard/_tokens"
    assert guard.raw_key("tokens") in guard.RAW_KEYS
