"""The regression check (r1_ascend.report.compare) at the edges of its limits, on runs built step by step: a change
of exactly the limit passes and a little more fails, in the direction that is worse only; a stage must pass both its
relative limit and its floor in seconds; a window both runs do not cover alike is missing data, never a pass.

Values are chosen so that each change is exact in binary floating point, and the expectations follow from the
limits. Checks are looked up by their metric, so a check added to ``compare_runs`` leaves these tests as they are.
"""

from __future__ import annotations

import math

import pytest

from r1_ascend.report import compare
from r1_ascend.report import metric_names as mn
from r1_ascend.report.compare import VERDICT_MISSING, VERDICT_OK, VERDICT_REGRESSION, Thresholds
from r1_ascend.report.run import RunData
from r1_ascend.report.timing import Window

WINDOW = Window(2, 3)


def run(name: str, **series: list[float]) -> RunData:
    """Steps 1.. with one value per step of each metric (``__`` for ``/``); every step is a training step."""
    keys = {key.replace("__", "/"): values for key, values in series.items()}
    steps = max(len(values) for values in keys.values())
    return RunData(
        name,
        steps={
            step: {mn.STEP_TIME: 100.0} | {key: values[step - 1] for key, values in keys.items() if step <= len(values)}
            for step in range(1, steps + 1)
        },
    )


def none_but(**limits: object) -> Thresholds:
    """Every check off but the ones given."""
    off = Thresholds(
        max_throughput_drop=None,
        max_step_time_increase=None,
        max_memory_increase_gb=None,
        max_reward_diff=None,
        max_stage_increase=dict.fromkeys(compare.STAGE_NAMES),
    )
    for name, value in limits.items():
        if name in compare.STAGE_NAMES:
            off.max_stage_increase[name] = value  # type: ignore[assignment]
        else:
            setattr(off, name, value)
    return off


def result(base: RunData, cand: RunData, thresholds: Thresholds, metric: str) -> compare.CheckResult:
    (found,) = [r for r in compare.compare_runs(base, cand, WINDOW, thresholds) if r.source == metric]
    return found


# --- whole-run checks: relative -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("candidate", "verdict"), [(95.0, VERDICT_OK), (94.75, VERDICT_REGRESSION), (150.0, VERDICT_OK)]
)
def test_throughput_fails_only_below_the_allowed_drop(candidate: float, verdict: str) -> None:
    base = run("b", perf__throughput=[1.0, 100.0, 100.0, 1.0])
    cand = run("c", perf__throughput=[1.0, candidate, candidate, 1.0])
    found = result(base, cand, none_but(max_throughput_drop=0.05), mn.THROUGHPUT_PER_DIE)
    assert found.verdict == verdict
    assert found.threshold == "-5.0%"
    assert (found.baseline, found.candidate) == (100.0, candidate)


@pytest.mark.parametrize(
    ("candidate", "verdict"), [(105.0, VERDICT_OK), (105.25, VERDICT_REGRESSION), (50.0, VERDICT_OK)]
)
def test_step_time_fails_only_above_the_allowed_increase(candidate: float, verdict: str) -> None:
    base = run("b", timing_s__step=[100.0, 100.0, 100.0])
    cand = run("c", timing_s__step=[100.0, candidate, candidate])
    found = result(base, cand, none_but(max_step_time_increase=0.05), mn.STEP_TIME)
    assert found.verdict == verdict
    assert found.threshold == "+5.0%"
    assert found.change == f"{(candidate - 100.0) / 100.0:+.2%}"


@pytest.mark.parametrize("baseline", [0.0, -3.0])
def test_a_relative_change_from_a_non_positive_baseline_is_missing(baseline: float) -> None:
    found = result(
        run("b", perf__throughput=[baseline] * 3),
        run("c", perf__throughput=[5.0] * 3),
        none_but(max_throughput_drop=0.05),
        mn.THROUGHPUT_PER_DIE,
    )
    assert (found.verdict, found.change) == (VERDICT_MISSING, "n/a")
    assert found.note == "baseline value is not positive; a relative change is undefined"
    # the row still says which check, its limit, both values and both counts
    assert (found.metric, found.threshold) == ("throughput (tokens/s per die, mean)", "-5.0%")
    assert (found.baseline, found.candidate, found.baseline_steps, found.candidate_steps) == (baseline, 5.0, 2, 2)


def test_a_positive_baseline_under_one_is_compared() -> None:
    found = result(
        run("b", perf__throughput=[0.5] * 3),
        run("c", perf__throughput=[0.5] * 3),
        none_but(max_throughput_drop=0.05),
        mn.THROUGHPUT_PER_DIE,
    )
    assert (found.verdict, found.change) == (VERDICT_OK, "+0.00%")


# --- whole-run checks: absolute -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("added", "verdict"), [(1.0, VERDICT_OK), (1.25, VERDICT_REGRESSION), (-4.0, VERDICT_OK)])
def test_peak_memory_fails_only_above_the_allowed_increase(added: float, verdict: str) -> None:
    base = run("b", perf__max_memory_allocated_gb=[30.0, 30.0, 30.0])
    cand = run("c", perf__max_memory_allocated_gb=[30.0, 30.0 + added, 30.0 + added])
    found = result(base, cand, none_but(max_memory_increase_gb=1.0), mn.MAX_MEMORY_ALLOCATED_GB)
    assert found.verdict == verdict
    assert found.threshold == "+1"


def test_memory_is_compared_by_its_peak_not_its_mean() -> None:
    base = run("b", perf__max_memory_allocated_gb=[0.0, 30.0, 30.0])
    cand = run("c", perf__max_memory_allocated_gb=[99.0, 30.0, 31.5])  # step 1 is outside the window
    found = result(base, cand, none_but(max_memory_increase_gb=1.0), mn.MAX_MEMORY_ALLOCATED_GB)
    assert (found.baseline, found.candidate, found.verdict) == (30.0, 31.5, VERDICT_REGRESSION)


@pytest.mark.parametrize(
    ("candidate", "verdict"),
    [(0.5625, VERDICT_OK), (0.4375, VERDICT_OK), (0.625, VERDICT_REGRESSION), (0.375, VERDICT_REGRESSION)],
)
def test_reward_fails_beyond_the_allowed_difference_either_way(candidate: float, verdict: str) -> None:
    base = run("b", critic__rewards__mean=[0.5, 0.5, 0.5])
    cand = run("c", critic__rewards__mean=[0.5, candidate, candidate])
    found = result(base, cand, none_but(max_reward_diff=0.0625), mn.REWARD_MEAN)
    assert found.verdict == verdict
    assert found.threshold == "±0.0625"
    assert found.change == f"{candidate - 0.5:+.4g}"


def test_non_finite_values_are_left_out_of_mean_and_peak() -> None:
    base = run("b", critic__rewards__mean=[0.5, 0.5, 0.5], perf__max_memory_allocated_gb=[1.0, 2.0, 2.0])
    cand = run("c", critic__rewards__mean=[0.5, math.nan, 0.5], perf__max_memory_allocated_gb=[1.0, math.inf, 2.0])
    thresholds = none_but(max_reward_diff=0.0625, max_memory_increase_gb=1.0)
    reward = result(base, cand, thresholds, mn.REWARD_MEAN)
    assert (reward.candidate, reward.candidate_steps) == (0.5, 1)
    memory = result(base, cand, thresholds, mn.MAX_MEMORY_ALLOCATED_GB)
    assert (memory.candidate, memory.candidate_steps) == (2.0, 1)


# --- both runs must cover the window alike ---------------------------------------------------------------------


def test_a_candidate_with_fewer_steps_in_the_window_is_missing_data() -> None:
    base = run("b", critic__rewards__mean=[0.5, 0.5, 0.5])
    cand = run("c", critic__rewards__mean=[0.5, 0.5])
    found = result(base, cand, none_but(max_reward_diff=0.0625), mn.REWARD_MEAN)
    assert (found.verdict, found.baseline_steps, found.candidate_steps) == (VERDICT_MISSING, 2, 1)
    assert "(baseline 2, candidate 1); the candidate is incomplete" in found.note


def test_a_baseline_with_fewer_steps_is_named_as_the_incomplete_one() -> None:
    found = result(
        run("b", critic__rewards__mean=[0.5, 0.5]),
        run("c", critic__rewards__mean=[0.5, 0.5, 0.5]),
        none_but(max_reward_diff=0.0625),
        mn.REWARD_MEAN,
    )
    assert "the baseline is incomplete" in found.note


@pytest.mark.parametrize(("which", "named"), [("base", "baseline"), ("cand", "candidate"), ("both", "baseline and")])
def test_a_metric_one_run_never_logged_is_missing(which: str, named: str) -> None:
    logged = run("x", perf__throughput=[100.0] * 3, critic__rewards__mean=[0.5] * 3)
    silent = run("y", timing_s__gen=[1.0] * 3)
    base = silent if which in ("base", "both") else logged
    cand = silent if which in ("cand", "both") else logged
    for metric, limits in (
        (mn.THROUGHPUT_PER_DIE, {"max_throughput_drop": 0.05}),
        (mn.REWARD_MEAN, {"max_reward_diff": 0.1}),
    ):
        found = result(base, cand, none_but(**limits), metric)
        assert found.verdict == VERDICT_MISSING
        assert found.note.startswith(f"not logged in the window by the {named}")


def test_the_window_is_inclusive_at_both_ends() -> None:
    base = run("b", critic__rewards__mean=[0.0, 0.5, 0.5, 0.0])
    cand = run("c", critic__rewards__mean=[1.0, 0.5, 0.5, 1.0])
    found = result(base, cand, none_but(max_reward_diff=0.0625), mn.REWARD_MEAN)
    assert (found.verdict, found.baseline_steps) == (VERDICT_OK, 2)


# --- stages ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base_s", "cand_s", "verdict"),
    [
        (20.0, 22.0, VERDICT_OK),  # +10 % and +2 s: at both limits
        (20.0, 23.0, VERDICT_REGRESSION),  # +15 % and +3 s
        (10.0, 11.5, VERDICT_OK),  # +15 % but +1.5 s: under the floor
        (40.0, 43.0, VERDICT_OK),  # +3 s but +7.5 %: under the relative limit
        (40.0, 44.0, VERDICT_OK),  # +10 % exactly (+4 s): at the relative limit only
        (10.0, 12.0, VERDICT_OK),  # +2 s exactly (+20 %): at the floor only
        (0.5, 0.5, VERDICT_OK),  # a positive baseline under a second is compared, not missing
    ],
)
def test_a_stage_regresses_only_past_its_limit_and_its_floor(base_s: float, cand_s: float, verdict: str) -> None:
    base = run("b", timing_s__update_actor=[base_s] * 3)
    cand = run("c", timing_s__update_actor=[cand_s] * 3)
    thresholds = none_but(update=0.10)
    found = result(base, cand, thresholds, mn.UPDATE_ACTOR_TIME)
    assert found.verdict == verdict
    assert (found.stage, found.threshold) == ("update", "+10.0% and +2 s")
    assert found.change == f"{(cand_s - base_s) / base_s:+.2%} ({cand_s - base_s:+.3g} s)"
    assert compare.regressed_stages(compare.compare_runs(base, cand, WINDOW, thresholds)) == (
        [found] if verdict == VERDICT_REGRESSION else []
    )


def test_a_stage_of_a_non_positive_or_missing_baseline_is_missing() -> None:
    thresholds = none_but(ref=0.10)
    zero = result(run("b", timing_s__ref=[0.0] * 3), run("c", timing_s__ref=[5.0] * 3), thresholds, mn.REF_TIME)
    assert (zero.verdict, zero.note) == (
        VERDICT_MISSING,
        "baseline value is not positive; a relative change is undefined",
    )
    absent = result(run("b", timing_s__gen=[1.0] * 3), run("c", timing_s__ref=[5.0] * 3), thresholds, mn.REF_TIME)
    assert (absent.verdict, absent.note) == (VERDICT_MISSING, "not logged in the window by the baseline")


def test_a_stage_covered_unequally_is_missing() -> None:
    thresholds = none_but(reward=0.10)
    found = result(
        run("b", timing_s__reward=[5.0] * 3), run("c", timing_s__reward=[5.0] * 2), thresholds, mn.REWARD_TIME
    )
    assert (found.verdict, found.baseline_steps, found.candidate_steps) == (VERDICT_MISSING, 2, 1)


def test_reshard_from_a_timer_and_from_gen_minus_generate_are_compared_with_a_note() -> None:
    reshard = next(stage for stage in compare.STAGES if stage.name == "reshard")
    timer = run("b", timing_s__reshard=[10.0] * 3)
    derived = run("c", timing_s__gen=[30.0] * 3, timing_s__generate_sequences=[20.0] * 3)
    found = result(timer, derived, none_but(reshard=0.10), reshard.source)
    assert (found.baseline, found.candidate, found.verdict) == (10.0, 10.0, VERDICT_OK)
    assert found.note.startswith("measured differently: baseline timer, candidate derived")
    same = result(derived, derived, none_but(reshard=0.10), reshard.source)
    assert same.note == ""


def test_reshard_is_read_on_training_steps_in_the_window_only() -> None:
    reshard = next(stage for stage in compare.STAGES if stage.name == "reshard")
    base = run("b", timing_s__reshard=[99.0, 10.0, 10.0, 99.0])
    cand = run("c", timing_s__reshard=[1.0, 10.0, math.nan, 1.0])
    found = result(base, cand, none_but(reshard=0.10), reshard.source)
    assert (found.baseline_steps, found.candidate_steps) == (2, 1)


def test_a_stage_switched_off_is_not_checked() -> None:
    base = run("b", timing_s__update_actor=[10.0] * 3)
    assert [r for r in compare.compare_runs(base, base, WINDOW, none_but()) if r.stage == "update"] == []


# --- exit code -------------------------------------------------------------------------------------------------


def check(verdict: str) -> compare.CheckResult:
    return compare.CheckResult("m", "k", 1.0, 1.0, "0", "t", verdict, 1, 1)


@pytest.mark.parametrize(
    ("verdicts", "code"),
    [
        ([VERDICT_OK, VERDICT_OK], compare.EXIT_OK),
        ([VERDICT_OK, VERDICT_MISSING], compare.EXIT_ERROR),
        ([VERDICT_MISSING, VERDICT_REGRESSION], compare.EXIT_REGRESSION),
        ([], compare.EXIT_ERROR),
    ],
)
def test_exit_code(verdicts: list[str], code: int) -> None:
    assert compare.exit_code([check(v) for v in verdicts]) == code
    assert (compare.EXIT_OK, compare.EXIT_REGRESSION, compare.EXIT_ERROR) == (0, 1, 2)


#: Every metric the default checks read, logged on every step (values arbitrary but positive).
EVERY_METRIC = {
    "perf__throughput": [100.0] * 3,
    "critic__rewards__mean": [0.5] * 3,
    "perf__max_memory_allocated_gb": [10.0] * 3,
    **{f"timing_s__{key}": [4.0] * 3 for key in ("gen", "reshard", "reward", "old_log_prob", "ref", "update_actor")},
}


@pytest.mark.parametrize("absent_from", ["baseline", "candidate"])
def test_a_missing_row_keeps_the_checks_label_threshold_the_value_logged_and_both_counts(absent_from: str) -> None:
    """A reader of a MISSING DATA row sees which check it is, its limit, the side that logged the metric with its
    value and step count, and which side did not: the same label and threshold as when both logged it."""
    full, empty = run("full", **EVERY_METRIC), run("empty", timing_s__step=[100.0] * 3)
    both = {r.source: r for r in compare.compare_runs(full, full, WINDOW, compare.Thresholds())}
    assert {r.stage for r in both.values() if r.stage} == set(compare.STAGE_NAMES)  # the defaults check every stage
    base, cand = (empty, full) if absent_from == "baseline" else (full, empty)
    rows = {r.source: r for r in compare.compare_runs(base, cand, WINDOW, compare.Thresholds())}
    missing = [source for source, row in rows.items() if row.verdict == VERDICT_MISSING]
    assert len(missing) == len(both) - 1  # all but the step time, which every step logs
    for source in missing:
        row, whole = rows[source], both[source]
        assert (row.metric, row.threshold, row.stage, row.change) == (whole.metric, whole.threshold, whole.stage, "n/a")
        logged = (
            (row.baseline, row.baseline_steps) if absent_from == "candidate" else (row.candidate, row.candidate_steps)
        )
        silent = (
            (row.candidate, row.candidate_steps) if absent_from == "candidate" else (row.baseline, row.baseline_steps)
        )
        assert logged == (whole.baseline, whole.baseline_steps), source
        assert silent == (None, 0), source
        assert row.note == f"not logged in the window by the {absent_from}", source


@pytest.mark.parametrize("logged_by", ["baseline", "candidate"])
def test_an_optional_metric_logged_by_one_run_is_missing_data_not_skipped(logged_by: str) -> None:
    """The expert-load check is skipped only when neither run logs it (a dense model); one MoE run beside a run
    without it is a comparison that cannot be made, and says so."""
    (key,) = compare.OPTIONAL_METRICS
    moe, dense = run("moe", **{key.replace("/", "__"): [1.5] * 3}), run("dense", timing_s__step=[100.0] * 3)
    base, cand = (moe, dense) if logged_by == "baseline" else (dense, moe)
    rows = [r for r in compare.compare_runs(base, cand, WINDOW, compare.Thresholds()) if r.source == key]
    assert [(r.verdict, r.baseline_steps + r.candidate_steps) for r in rows] == [(VERDICT_MISSING, 2)]
    assert [r for r in compare.compare_runs(dense, dense, WINDOW, compare.Thresholds()) if r.source == key] == []


def test_a_non_finite_reshard_time_is_left_out_of_its_mean() -> None:
    base = run("base", timing_s__reshard=[4.0, 4.0, 4.0])
    cand = run("cand", timing_s__reshard=[4.0, math.nan, 4.0])
    found = result(base, cand, none_but(reshard=0.1), "timing_s/reshard or timing_s/gen − timing_s/generate_sequences")
    assert (found.candidate, found.candidate_steps) == (4.0, 1)
