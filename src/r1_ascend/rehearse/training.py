"""What the rehearsal's run learned, read from verl's console logs: the reward curve, the rollout-actor gap, and
every logged metric checked for NaN.

A rehearsal that runs but does not train proves the control flow only. These verdicts make it prove the model
path: a reward that rises over the run, gradients that flow, no metric that is NaN (a NaN hides a broken loss or
a broken log-prob as well as it hides a missing one), and the rollout's log-probs close to the actor's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from r1_ascend.patches.rules import rollout_guard as guard
from r1_ascend.report.console import parse_console_file

REWARD = "critic/score/mean"
GRAD_NORM = "actor/grad_norm"
GAP = guard.METRIC_MEAN


class TrainingError(RuntimeError):
    """The run did not train as expected; the message names the metric, the step and the log."""


def step_metrics(logs: list[Path]) -> dict[int, dict[str, float]]:
    """Each step's metrics; a step logged by a later run (after a resume) replaces the earlier one."""
    steps: dict[int, dict[str, float]] = {}
    for log in logs:
        for record in parse_console_file(log).records:
            steps[record.step] = dict(record.metrics)
    return dict(sorted(steps.items()))


def check_finite(steps: dict[int, dict[str, float]], logs: list[Path]) -> None:
    """No logged metric is NaN or infinite."""
    bad = [
        (step, name) for step, metrics in steps.items() for name, value in metrics.items() if not math.isfinite(value)
    ]
    if bad:
        shown = ", ".join(f"{name} at step {step}" for step, name in bad[:8])
        more = f" (+{len(bad) - 8} more)" if len(bad) > 8 else ""
        raise TrainingError(f"non-finite metrics: {shown}{more}; logs: {', '.join(map(str, logs))}")


@dataclass(frozen=True)
class Curve:
    """The reward per step and the means the rehearsal's learning verdict compares."""

    rewards: dict[int, float]
    window: int

    @property
    def first(self) -> float:
        values = list(self.rewards.values())[: self.window]
        return sum(values) / len(values)

    @property
    def last(self) -> float:
        values = list(self.rewards.values())[-self.window :]
        return sum(values) / len(values)


def reward_curve(steps: dict[int, dict[str, float]], window: int = 3) -> Curve:
    missing = [step for step, metrics in steps.items() if REWARD not in metrics]
    if missing or not steps:
        raise TrainingError(f"{REWARD} is missing at steps {missing or 'all'}")
    return Curve({step: metrics[REWARD] for step, metrics in steps.items()}, min(window, len(steps)))


def check_learning(curve: Curve, min_rise: float) -> None:
    """The mean reward of the last ``window`` steps exceeds that of the first by at least ``min_rise``."""
    if curve.last - curve.first < min_rise:
        raise TrainingError(
            f"the reward did not rise: mean {curve.first:.3f} over the first {curve.window} steps, {curve.last:.3f} "
            f"over the last {curve.window} (needed +{min_rise}); curve: "
            + ", ".join(f"{step}: {value:.2f}" for step, value in curve.rewards.items())
        )


@dataclass(frozen=True)
class Flat:
    """What a control run's reward curve must show: no learning. Its last-window mean stays within ``max_rise`` of its
    first and below ``last_below`` (the learning run ends above 0.7, :class:`Learning`)."""

    max_rise: float = 0.2
    last_below: float = 0.5


FLAT = Flat()


def check_flat(curve: Curve, control: str, flat: Flat = FLAT) -> None:
    """A control run (``control`` says which) did not learn: the curve meets ``flat``."""
    shown = ", ".join(f"{step}: {value:.2f}" for step, value in curve.rewards.items())
    if curve.last - curve.first >= flat.max_rise or curve.last >= flat.last_below:
        raise TrainingError(
            f"the control run ({control}) learned: mean reward {curve.first:.3f} over the first {curve.window} steps, "
            f"{curve.last:.3f} over the last (a control must rise by less than {flat.max_rise} and end below "
            f"{flat.last_below}): something other than the reward signal moves the policy; curve: {shown}"
        )


@dataclass(frozen=True)
class Learning:
    """What a learning rehearsal's reward curve must show besides its rise: it starts near the random model's base
    rate, ends well above it, and once learning is under way it never falls back to where it started (a step below
    the first window's mean is a run that unlearned, however its last steps end)."""

    first_at_most: float = 0.35
    last_at_least: float = 0.7
    steady_from: int = 5


LEARNING = Learning()


def check_learning_holds(curve: Curve, learning: Learning = LEARNING) -> None:
    """The curve meets ``learning``: first-window mean at most ``first_at_most``, last-window mean at least
    ``last_at_least``, and no step from ``steady_from`` on below the first-window mean."""
    shown = ", ".join(f"{step}: {value:.2f}" for step, value in curve.rewards.items())
    if curve.first > learning.first_at_most:
        raise TrainingError(
            f"the reward started at {curve.first:.3f} over the first {curve.window} steps, above the "
            f"{learning.first_at_most} a random model earns: the task is too easy to show learning; curve: {shown}"
        )
    if curve.last < learning.last_at_least:
        raise TrainingError(
            f"the reward reached only {curve.last:.3f} over the last {curve.window} steps (at least "
            f"{learning.last_at_least} expected); curve: {shown}"
        )
    fallen = [step for step, value in curve.rewards.items() if step >= learning.steady_from and value < curve.first]
    if fallen:
        raise TrainingError(
            f"the reward fell below its first-{curve.window}-step mean {curve.first:.3f} at step(s) "
            f"{', '.join(map(str, fallen))} (from step {learning.steady_from} on it must stay above); curve: {shown}"
        )


def check_gradients(steps: dict[int, dict[str, float]]) -> None:
    """Gradients flowed: the actor's grad norm is positive at some step (all-zero advantages give exactly 0)."""
    norms = [metrics.get(GRAD_NORM, 0.0) for metrics in steps.values()]
    if not any(norm > 0 for norm in norms):
        raise TrainingError(f"{GRAD_NORM} is 0 at every step: no advantage was non-zero, nothing was learned")


def max_gap(steps: dict[int, dict[str, float]]) -> float:
    """The largest per-step mean |rollout - actor| log-prob difference (nats) the rollout guard logged."""
    gaps = [metrics[GAP] for metrics in steps.values() if GAP in metrics]
    if not gaps:
        raise TrainingError(f"{GAP} was never logged: the rollout guard did not measure the rollout")
    return max(gaps)


def check_guard_quiet(steps: dict[int, dict[str, float]]) -> None:
    """A healthy run never warns: no step has a guard statistic above the warn level it logged."""
    loud = {}
    for step, metrics in steps.items():
        above = [
            f"{key} = {metrics[key]:.4g} (warn level {metrics[level]:g})"
            for key in (guard.METRIC_NAMES[name] for name in guard.GATED)
            if key in metrics
            and (level := guard.WARN_PREFIX + key.removeprefix(guard.PREFIX)) in metrics
            and not metrics[key] <= metrics[level]
        ]
        if above or metrics.get(guard.METRIC_WARNED, 0.0) > 0:
            loud[step] = above or [f"{guard.METRIC_WARNED} = 1"]
    if loud:
        shown = "; ".join(f"step {step}: {', '.join(items)}" for step, items in loud.items())
        raise TrainingError(f"the rollout guard warned on a run that should be healthy: {shown}")
