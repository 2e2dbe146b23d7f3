"""Baseline-versus-candidate regression check over a step window, for a cluster's CI.

Defaults follow the regression-baseline convention of the Ascend verl recipes (steps 5–14; throughput −5 %,
step time +5 %, peak memory +1 GB, reward ±0.05). Each check can be switched off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from r1_ascend.report import metric_names as mn
from r1_ascend.report.run import RunData
from r1_ascend.report.timing import Window, finite_mean

VERDICT_OK = "ok"
VERDICT_REGRESSION = "REGRESSION"
VERDICT_MISSING = "MISSING DATA"

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_ERROR = 2

DEFAULT_WINDOW = "5:14"


@dataclass
class Thresholds:
    """None disables a check."""

    max_throughput_drop: float | None = 0.05
    max_step_time_increase: float | None = 0.05
    max_memory_increase_gb: float | None = 1.0
    max_reward_diff: float | None = 0.05


@dataclass
class CheckResult:
    metric: str
    source: str
    baseline: float | None
    candidate: float | None
    change: str
    threshold: str
    verdict: str
    baseline_steps: int
    candidate_steps: int
    note: str = ""


def _window_values(run: RunData, key: str, window: Window) -> list[float]:
    steps, values = run.series(key)
    return [v for s, v in zip(steps, values, strict=True) if window.contains(s)]


def _mean(run: RunData, key: str, window: Window) -> tuple[float | None, int]:
    mean = finite_mean(list(_window_values(run, key, window)))
    return mean.value, mean.count


def _peak(run: RunData, key: str, window: Window) -> tuple[float | None, int]:
    values = [v for v in _window_values(run, key, window) if math.isfinite(v)]
    return (max(values) if values else None), len(values)


def compare_runs(baseline: RunData, candidate: RunData, window: Window, thresholds: Thresholds) -> list[CheckResult]:
    results = []
    if thresholds.max_throughput_drop is not None:
        results.append(
            _relative_check(
                "throughput (tokens/s per die, mean)",
                mn.THROUGHPUT_PER_DIE,
                baseline,
                candidate,
                window,
                limit=thresholds.max_throughput_drop,
                worse_when_lower=True,
            )
        )
    if thresholds.max_step_time_increase is not None:
        results.append(
            _relative_check(
                "step time (s, mean)",
                mn.STEP_TIME,
                baseline,
                candidate,
                window,
                limit=thresholds.max_step_time_increase,
                worse_when_lower=False,
            )
        )
    if thresholds.max_memory_increase_gb is not None:
        base, base_n = _peak(baseline, mn.MAX_MEMORY_ALLOCATED_GB, window)
        cand, cand_n = _peak(candidate, mn.MAX_MEMORY_ALLOCATED_GB, window)
        limit = thresholds.max_memory_increase_gb
        results.append(
            _absolute_result(
                "peak memory allocated (GiB, max)", mn.MAX_MEMORY_ALLOCATED_GB, base, cand, base_n, cand_n, limit, False
            )
        )
    if thresholds.max_reward_diff is not None:
        base, base_n = _mean(baseline, mn.REWARD_MEAN, window)
        cand, cand_n = _mean(candidate, mn.REWARD_MEAN, window)
        results.append(
            _absolute_result(
                "reward (mean)", mn.REWARD_MEAN, base, cand, base_n, cand_n, thresholds.max_reward_diff, True
            )
        )
    return results


def _relative_check(
    label: str,
    key: str,
    baseline: RunData,
    candidate: RunData,
    window: Window,
    limit: float,
    worse_when_lower: bool,
) -> CheckResult:
    base, base_n = _mean(baseline, key, window)
    cand, cand_n = _mean(candidate, key, window)
    threshold = f"{'-' if worse_when_lower else '+'}{limit:.1%}"
    if base is None or cand is None:
        return CheckResult(
            label, key, base, cand, "n/a", threshold, VERDICT_MISSING, base_n, cand_n, _absent(base, cand)
        )
    if base <= 0:
        note = "baseline value is not positive; a relative change is undefined"
        return CheckResult(label, key, base, cand, "n/a", threshold, VERDICT_MISSING, base_n, cand_n, note)
    change = (cand - base) / base
    regressed = change < -limit if worse_when_lower else change > limit
    return _covered(
        CheckResult(label, key, base, cand, f"{change:+.2%}", threshold, _verdict(regressed), base_n, cand_n)
    )


def _absolute_result(
    label: str,
    key: str,
    base: float | None,
    cand: float | None,
    base_n: int,
    cand_n: int,
    limit: float,
    both_directions: bool,
) -> CheckResult:
    threshold = f"±{limit:g}" if both_directions else f"+{limit:g}"
    if base is None or cand is None:
        return CheckResult(
            label, key, base, cand, "n/a", threshold, VERDICT_MISSING, base_n, cand_n, _absent(base, cand)
        )
    change = cand - base
    regressed = abs(change) > limit if both_directions else change > limit
    return _covered(
        CheckResult(label, key, base, cand, f"{change:+.4g}", threshold, _verdict(regressed), base_n, cand_n)
    )


def _verdict(regressed: bool) -> str:
    return VERDICT_REGRESSION if regressed else VERDICT_OK


def _covered(result: CheckResult) -> CheckResult:
    """Both runs must cover the window equally: a candidate that crashed mid-window must not pass.

    Means over different step sets are not comparable either way (the reward drifts over a run), so any verdict on
    them becomes missing data, which fails the check with exit code 2.
    """
    if result.baseline_steps == result.candidate_steps:
        return result
    fewer = "candidate" if result.candidate_steps < result.baseline_steps else "baseline"
    result.note = (
        f"the runs logged this metric on different numbers of steps in the window "
        f"(baseline {result.baseline_steps}, candidate {result.candidate_steps}); the {fewer} is incomplete "
        "(truncated, crashed or a narrower window is needed)"
    )
    result.verdict = VERDICT_MISSING
    return result


def _absent(base: float | None, cand: float | None) -> str:
    which = [name for name, value in (("baseline", base), ("candidate", cand)) if value is None]
    return f"not logged in the window by the {' and '.join(which)}"


def exit_code(results: list[CheckResult]) -> int:
    """1 when any check regressed; otherwise 2 when a check could not be evaluated; else 0."""
    if any(r.verdict == VERDICT_REGRESSION for r in results):
        return EXIT_REGRESSION
    if any(r.verdict == VERDICT_MISSING for r in results) or not results:
        return EXIT_ERROR
    return EXIT_OK
