"""Baseline-versus-candidate regression check over a step window, for a cluster's CI.

Defaults follow the regression-baseline convention of the Ascend verl recipes (steps 5–14; throughput −5 %,
step time +5 %, peak memory +1 GB, reward ±0.05). A MoE run is also gated on its expert load (the worst layer's
busiest expert over the mean, ``moe/max_over_mean``, +10 %): with expert parallelism the step waits for the busiest
expert, so a rise is a throughput regression in the making. Runs in which neither side logs it (dense models, runs
without patch ``verl_moe_expert_load``) skip that check. Each check can be switched off.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from r1_ascend.patches.rules import expert_load
from r1_ascend.report import metric_names as mn
from r1_ascend.report.run import RunData
from r1_ascend.report.timing import Window, finite_mean, reshard_seconds

VERDICT_OK = "ok"
VERDICT_REGRESSION = "REGRESSION"
VERDICT_MISSING = "MISSING DATA"

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_ERROR = 2

DEFAULT_WINDOW = "5:14"


@dataclass(frozen=True)
class Stage:
    name: str
    label: str
    source: str


# The stages of one GRPO step, in execution order; reshard has no stock timer (see timing.reshard_seconds).
STAGES: tuple[Stage, ...] = (
    Stage("gen", "gen", mn.GEN_TIME),
    Stage("reshard", "reshard", f"{mn.RESHARD_TIME} or {mn.GEN_TIME} − {mn.GENERATE_SEQUENCES_TIME}"),
    Stage("reward", "reward", mn.REWARD_TIME),
    Stage("old_log_prob", "old log-prob", mn.OLD_LOG_PROB_TIME),
    Stage("ref", "ref", mn.REF_TIME),
    Stage("update", "update", mn.UPDATE_ACTOR_TIME),
)
STAGE_NAMES = tuple(stage.name for stage in STAGES)
DEFAULT_STAGE_INCREASE = 0.10
DEFAULT_STAGE_FLOOR_S = 2.0


def _default_stage_limits() -> dict[str, float | None]:
    return dict.fromkeys(STAGE_NAMES, DEFAULT_STAGE_INCREASE)


@dataclass
class Thresholds:
    """None disables a check."""

    max_throughput_drop: float | None = 0.05
    max_step_time_increase: float | None = 0.05
    max_memory_increase_gb: float | None = 1.0
    max_reward_diff: float | None = 0.05
    # per stage: largest allowed relative increase of its mean time; an increase must also exceed the floor
    max_stage_increase: dict[str, float | None] = field(default_factory=_default_stage_limits)
    stage_floor_s: float = DEFAULT_STAGE_FLOOR_S
    max_expert_load_increase: float | None = 0.10


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
    stage: str | None = None


def _window_values(run: RunData, key: str, window: Window) -> list[float]:
    steps, values = run.series(key)
    return [v for s, v in zip(steps, values, strict=True) if window.contains(s)]


def _stage_values(run: RunData, stage: Stage, window: Window) -> tuple[list[float], set[str]]:
    """A stage's per-step seconds in the window and, for reshard, where they came from (timer or derived)."""
    if stage.name != "reshard":
        return [v for v in _window_values(run, stage.source, window) if math.isfinite(v)], set()
    values, origins = [], set()
    for step in run.training_steps():
        if window.contains(step):
            value, origin = reshard_seconds(run.steps[step])
            if value is not None and origin is not None and math.isfinite(value):
                values.append(value)
                origins.add(origin)
    return values, origins


def _mean(run: RunData, key: str, window: Window) -> tuple[float | None, int]:
    mean = finite_mean(list(_window_values(run, key, window)))
    return mean.value, mean.count


def _peak(run: RunData, key: str, window: Window) -> tuple[float | None, int]:
    values = [v for v in _window_values(run, key, window) if math.isfinite(v)]
    return (max(values) if values else None), len(values)


#: Whole-run checks on the relative change of a mean: (Thresholds field, label, metric, worse when lower).
RELATIVE_CHECKS: tuple[tuple[str, str, str, bool], ...] = (
    ("max_throughput_drop", "throughput (tokens/s per die, mean)", mn.THROUGHPUT_PER_DIE, True),
    ("max_step_time_increase", "step time (s, mean)", mn.STEP_TIME, False),
    (
        "max_expert_load_increase",
        "expert load (worst layer's busiest/mean, mean)",
        expert_load.WORST["max_over_mean"],
        False,
    ),
)
#: Metrics only some models log: a check on one is skipped when neither run logs it in the window.
OPTIONAL_METRICS = frozenset({expert_load.WORST["max_over_mean"]})
#: A metric's value over the window (mean or peak) and how many steps gave it.
Reduce = Callable[[RunData, str, Window], tuple[float | None, int]]
#: Whole-run checks on an absolute change: (Thresholds field, label, metric, mean or peak, either direction).
ABSOLUTE_CHECKS: tuple[tuple[str, str, str, Reduce, bool], ...] = (
    ("max_memory_increase_gb", "peak memory allocated (GiB, max)", mn.MAX_MEMORY_ALLOCATED_GB, _peak, False),
    ("max_reward_diff", "reward (mean)", mn.REWARD_MEAN, _mean, True),
)


def compare_runs(baseline: RunData, candidate: RunData, window: Window, thresholds: Thresholds) -> list[CheckResult]:
    results = []
    for field_name, label, key, worse_when_lower in RELATIVE_CHECKS:
        limit = getattr(thresholds, field_name)
        if key in OPTIONAL_METRICS and not (
            _window_values(baseline, key, window) or _window_values(candidate, key, window)
        ):
            continue  # a dense model, or a run without the metric's patch: nothing to compare
        if limit is not None:
            results.append(_relative_check(label, key, baseline, candidate, window, limit, worse_when_lower))
    for field_name, label, key, reduce, both_directions in ABSOLUTE_CHECKS:
        limit = getattr(thresholds, field_name)
        if limit is not None:
            base, base_n = reduce(baseline, key, window)
            cand, cand_n = reduce(candidate, key, window)
            results.append(_absolute_result(label, key, base, cand, base_n, cand_n, limit, both_directions))
    for stage in STAGES:
        limit = thresholds.max_stage_increase.get(stage.name)
        if limit is not None:
            results.append(_stage_check(stage, baseline, candidate, window, limit, thresholds.stage_floor_s))
    return results


def _stage_check(
    stage: Stage, baseline: RunData, candidate: RunData, window: Window, limit: float, floor_s: float
) -> CheckResult:
    """Relative increase of the stage's mean time; a regression also needs more than ``floor_s`` seconds more.

    The floor keeps a short stage (the rule reward takes seconds) from failing on noise of a fraction of a second.
    """
    base_values, base_origin = _stage_values(baseline, stage, window)
    cand_values, cand_origin = _stage_values(candidate, stage, window)
    base, cand = finite_mean(list(base_values)), finite_mean(list(cand_values))
    label = f"{stage.label} time (s, mean)"
    threshold = f"+{limit:.1%} and +{floor_s:g} s"
    result = CheckResult(label, stage.source, base.value, cand.value, "n/a", threshold, VERDICT_MISSING, 0, 0)
    result.baseline_steps, result.candidate_steps, result.stage = base.count, cand.count, stage.name
    if base.value is None or cand.value is None:
        result.note = _absent(base.value, cand.value)
        return result
    if base.value <= 0:
        result.note = "baseline value is not positive; a relative change is undefined"
        return result
    change = (cand.value - base.value) / base.value
    result.change = f"{change:+.2%} ({cand.value - base.value:+.3g} s)"
    result.verdict = _verdict(change > limit and cand.value - base.value > floor_s)
    result = _covered(result)
    if base_origin != cand_origin and result.verdict != VERDICT_MISSING:
        result.note = (
            f"measured differently: baseline {'/'.join(sorted(base_origin))}, "
            f"candidate {'/'.join(sorted(cand_origin))} (dedicated timer vs gen − generate_sequences)"
        )
    return result


def regressed_stages(results: list[CheckResult]) -> list[CheckResult]:
    return [r for r in results if r.stage is not None and r.verdict == VERDICT_REGRESSION]


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
