"""The report's rollout-guard levels and its "steps above" columns at their edges: a statistic exactly at its level,
a NaN statistic, and a log of a release before 0.5 whose only level is ``rollout_guard/threshold`` (the stop level of
the mean then). Console logs are written as verl's ``LocalLogger`` prints them and read by ``r1-ascend report``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from r1_ascend.patches.rules import rollout_guard as guard
from r1_ascend.report import metric_names as mn
from r1_ascend.report.cli import main
from r1_ascend.report.figures import guard_level_series
from r1_ascend.report.run import RunData

MEAN = guard.METRIC_MEAN
SEQ_MAX = guard.METRIC_NAMES["seq_abs_diff_max"]


def level_key(what: str, key: str) -> str:
    return (guard.WARN_PREFIX if what == "warn" else guard.STOP_PREFIX) + key.removeprefix(guard.PREFIX)


def report(tmp_path: Path, steps: dict[int, dict[str, float]]) -> str:
    """``r1-ascend report`` on a console log of these steps; the consistency table's rows by statistic."""
    log = tmp_path / "run.log"
    log.write_text(
        "".join(
            f"step:{step} - " + " - ".join(f"{key}:{value}" for key, value in metrics.items()) + "\n"
            for step, metrics in steps.items()
        )
    )
    assert main([str(log), "--out", str(tmp_path / "report"), "--no-figures"]) == 0
    return (tmp_path / "report" / "report.md").read_text(encoding="utf-8")


def row(text: str, key: str) -> list[str]:
    """The cells of the consistency table's row of ``key``: last, max (step), baseline, warn, stop, above warn,
    above stop."""
    (line,) = [line for line in text.splitlines() if line.startswith(f"| `{key}` |")]
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def levelled(value: float, warn: float = 0.05, stop: float = 0.1) -> dict[str, float]:
    return {MEAN: value, level_key("warn", MEAN): warn, level_key("stop", MEAN): stop}


def test_a_statistic_at_its_level_is_not_above_it(tmp_path: Path) -> None:
    """The guard warns and stops above a level, not at it."""
    text = report(tmp_path, {1: levelled(0.05), 2: levelled(0.06), 3: levelled(0.1), 4: levelled(0.11)})
    assert row(text, MEAN)[2:] == ["–", "0.05", "0.1", "steps 2, 3, 4", "steps 4"]


def test_a_nan_statistic_is_above_every_level(tmp_path: Path) -> None:
    """A NaN statistic is never healthy (the guard stops on it); the table must not call its step quiet."""
    text = report(tmp_path, {1: levelled(0.01), 2: levelled(math.nan), 3: levelled(0.02)})
    last, top, _baseline, warn, stop, above_warn, above_stop = row(text, MEAN)
    assert (warn, stop) == ("0.05", "0.1")
    assert (above_warn, above_stop) == ("steps 2", "steps 2")
    assert (last, top) == ("0.02", "0.02 (3)")  # last and max are over the finite values


def test_the_levels_in_force_are_those_of_each_step(tmp_path: Path) -> None:
    """Levels changed between runs (a resume with new settings): each step is judged by its own."""
    text = report(tmp_path, {1: levelled(0.07, warn=0.08), 2: levelled(0.07, warn=0.06)})
    assert row(text, MEAN)[5] == "steps 2"
    assert row(text, MEAN)[3] == "0.06"  # the table shows the last level


def test_the_calibrated_baseline_is_listed_once_logged(tmp_path: Path) -> None:
    """Logged from the first step after calibration; the table shows the last one, and the levels set from it."""
    baseline = guard.level_key(guard.BASELINE_PREFIX, "abs_diff_mean")
    steps = {1: levelled(0.01), 2: {**levelled(0.01, warn=0.02, stop=0.04), baseline: 0.0025}}
    assert row(report(tmp_path, steps), MEAN)[2:5] == ["0.0025", "0.02", "0.04"]


# --- a log of a release before 0.5: one level, rollout_guard/threshold, the mean's stop level --------------------


def old_step(mean: float, threshold: float = 0.1) -> dict[str, float]:
    return {MEAN: mean, mn.ROLLOUT_GUARD_THRESHOLD: threshold}


def test_an_old_threshold_is_the_stop_level_of_the_mean() -> None:
    run = RunData("old", steps={1: old_step(0.01), 2: old_step(0.02, threshold=0.2)})
    assert guard_level_series(run, MEAN, "stop") == ([1, 2], [0.1, 0.2])
    assert guard_level_series(run, MEAN, "warn") == ([], [])  # there was no warn level
    assert guard_level_series(run, SEQ_MAX, "stop") == ([], [])  # nor a level of another statistic


def test_a_logged_stop_level_wins_over_an_old_threshold() -> None:
    run = RunData("new", steps={1: {**old_step(0.01), level_key("stop", MEAN): 0.3}})
    assert guard_level_series(run, MEAN, "stop") == ([1], [0.3])


@pytest.mark.parametrize("what", ["warn", "stop"])
def test_levels_are_read_per_statistic(what: str) -> None:
    run = RunData("new", steps={1: {SEQ_MAX: 0.1, level_key(what, SEQ_MAX): 0.25, level_key(what, MEAN): 0.05}})
    assert guard_level_series(run, SEQ_MAX, what) == ([1], [0.25])


def test_the_report_judges_an_old_log_by_its_threshold(tmp_path: Path) -> None:
    text = report(tmp_path, {1: old_step(0.05), 2: old_step(0.1), 3: old_step(0.15)})
    *_, warn, stop, above_warn, above_stop = row(text, MEAN)
    assert (warn, stop) == ("–", "0.1")
    assert (above_warn, above_stop) == ("–", "steps 3")
