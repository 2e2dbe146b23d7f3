"""The rollout–actor consistency guard: compare the rollout's log-probs of its sampled tokens with the actor's.

Kept apart from the patch module (verl_rollout_guard) so the arithmetic, the configuration and the error can be
tested on plain tensors. The statistic is the token-mean of |log p_actor(t) - log p_rollout(t)| over the valid
response tokens of a step (natural log, both at the sampling temperature); its maximum is logged too. How the
default threshold is derived: docs/rollout_guard.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import RolloutActorMismatchError, RolloutGuardConfigError

#: Hydra key of the guard's settings (top level of the recipe config).
CONFIG_KEY = "r1_ascend.rollout_guard"
#: Stop threshold on the step's mean |Δ log-prob|, in nats (docs/rollout_guard.md).
DEFAULT_MAX_MEAN_ABS_DIFF = 1.0
CONFIG_FIELDS = ("enabled", "max_mean_abs_diff")

PREFIX = "rollout_guard/"
METRIC_MEAN = f"{PREFIX}log_prob_abs_diff_mean"
METRIC_MAX = f"{PREFIX}log_prob_abs_diff_max"
METRIC_THRESHOLD = f"{PREFIX}threshold"
METRIC_TOKENS = f"{PREFIX}tokens"
#: 1 when the actor's log-probs came from the update (on-policy shortcut), 0 when from the old-log-prob pass.
METRIC_IN_UPDATE = f"{PREFIX}measured_in_update"
#: Per-micro-batch partial sums the actor emits inside the update; the driver folds them into the metrics above.
RAW_SUM = f"{PREFIX}_abs_diff_sum"
RAW_TOKENS = f"{PREFIX}_tokens"
RAW_MAX = f"{PREFIX}_abs_diff_max"
RAW_KEYS = (RAW_SUM, RAW_TOKENS, RAW_MAX)

LIKELY_CAUSES = (
    "the rollout decoded from stale or garbage weights (a graph replaying freed parameter addresses: check that "
    "patch vllm_ascend_torchair_live_params is applied and no ACL graph mode is used with the offloading rollout)",
    "the weight sync missed or mis-converted parameters (Megatron->HF export, expert or QKV layout, MLA matrices)",
    "the rollout and the actor use different sampling transforms (temperature, top_p/top_k < 1 in training)",
    "a kernel or precision change in one engine (FP8/INT8 rollout, a different attention backend)",
)


@dataclass(frozen=True)
class GuardConfig:
    enabled: bool = True
    max_mean_abs_diff: float = DEFAULT_MAX_MEAN_ABS_DIFF

    @classmethod
    def from_config(cls, config: Any) -> GuardConfig:
        """Read ``r1_ascend.rollout_guard`` (absent = defaults: on, 1.0 nat); unknown keys are an error."""
        from omegaconf import OmegaConf

        node = OmegaConf.select(config, CONFIG_KEY, default=None)
        values: Mapping[str, Any] = {} if node is None else OmegaConf.to_container(node, resolve=True)  # type: ignore[assignment]
        if not isinstance(values, Mapping):
            msg = f"{CONFIG_KEY} must be a mapping with keys {list(CONFIG_FIELDS)}, got {values!r}"
            raise RolloutGuardConfigError(msg)
        unknown = sorted(set(values) - set(CONFIG_FIELDS))
        if unknown:
            msg = f"unknown key(s) {unknown} under {CONFIG_KEY}; valid keys: {list(CONFIG_FIELDS)}"
            raise RolloutGuardConfigError(msg)
        enabled = values.get("enabled", True)
        threshold = values.get("max_mean_abs_diff", DEFAULT_MAX_MEAN_ABS_DIFF)
        if not isinstance(enabled, bool):
            msg = f"{CONFIG_KEY}.enabled must be true or false, got {enabled!r}"
            raise RolloutGuardConfigError(msg)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < math.inf:
            msg = f"{CONFIG_KEY}.max_mean_abs_diff must be a positive number of nats, got {threshold!r}"
            raise RolloutGuardConfigError(msg)
        return cls(enabled, float(threshold))


def check_rollout_config(config: Any) -> None:
    """The guard needs the rollout's own log-probs (verl ``actor_rollout_ref.rollout.calculate_log_probs``)."""
    if not config.actor_rollout_ref.rollout.get("calculate_log_probs", False):
        msg = (
            f"{CONFIG_KEY}.enabled is true but actor_rollout_ref.rollout.calculate_log_probs is false, so the rollout "
            f"returns no log-probs to compare with the actor's. Set actor_rollout_ref.rollout.calculate_log_probs=true "
            f"(the shipped recipes do), or switch the guard off with +{CONFIG_KEY}.enabled=false."
        )
        raise RolloutGuardConfigError(msg)


def config_problems(config: Any) -> list[str]:
    """Everything ``fit`` would refuse about the guard's settings, as messages (for ``r1-ascend preflight``)."""
    try:
        settings = GuardConfig.from_config(config)
        if settings.enabled:
            check_rollout_config(config)
    except RolloutGuardConfigError as exc:
        return [str(exc)]
    return []


@dataclass(frozen=True)
class DiffStats:
    """|Δ log-prob| summed, counted and maximised over valid response tokens."""

    abs_sum: float
    tokens: int
    abs_max: float

    @property
    def mean(self) -> float:
        return self.abs_sum / self.tokens if self.tokens else math.nan

    @classmethod
    def from_tensors(cls, actor: Any, rollout: Any, mask: Any) -> DiffStats:
        import torch

        if actor.shape != rollout.shape or actor.shape != mask.shape:
            msg = (
                f"actor log-probs {tuple(actor.shape)}, rollout log-probs {tuple(rollout.shape)} and response mask "
                f"{tuple(mask.shape)} must have the same shape"
            )
            raise ValueError(msg)
        valid = mask.to(torch.bool)
        diff = (actor.detach().float() - rollout.detach().float().to(actor.device)).abs()[valid]
        if diff.numel() == 0:
            return cls(0.0, 0, 0.0)
        # NaN (e.g. a NaN placeholder) must never look healthy: it propagates into sum and max.
        return cls(float(diff.sum()), int(diff.numel()), float(diff.max()))

    def as_raw_metrics(self) -> dict[str, float]:
        return {RAW_SUM: self.abs_sum, RAW_TOKENS: float(self.tokens), RAW_MAX: self.abs_max}

    @classmethod
    def from_raw_metrics(cls, metrics: Mapping[str, Any]) -> DiffStats | None:
        """Fold the per-micro-batch partials (lists after verl's merge over ranks) into one; None if absent."""
        if RAW_TOKENS not in metrics:
            return None
        sums, tokens, maxes = (_as_list(metrics[key]) for key in RAW_KEYS)
        if not (len(sums) == len(tokens) == len(maxes)):
            msg = f"rollout guard partials disagree in length: {len(sums)} sums, {len(tokens)} counts, {len(maxes)} max"
            raise ValueError(msg)
        return cls(sum(sums), int(sum(tokens)), max(maxes, default=0.0) if maxes else 0.0)


def _as_list(value: Any) -> list[float]:
    """Flatten a metric value: a number, a list per micro-batch, or (after verl's merge) a list per rank of those."""
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        return [item for v in value for item in _as_list(v)]
    return [float(value)]


def metrics(stats: DiffStats, config: GuardConfig, *, in_update: bool) -> dict[str, float]:
    return {
        METRIC_MEAN: stats.mean,
        METRIC_MAX: stats.abs_max,
        METRIC_THRESHOLD: config.max_mean_abs_diff,
        METRIC_TOKENS: float(stats.tokens),
        METRIC_IN_UPDATE: 1.0 if in_update else 0.0,
    }


def check(stats: DiffStats, config: GuardConfig, *, step: int, in_update: bool) -> None:
    """Raise ``RolloutActorMismatchError`` unless the step's mean |Δ log-prob| is within the threshold."""
    if stats.tokens == 0:
        return
    mean = stats.mean
    if mean <= config.max_mean_abs_diff:  # False for NaN
        return
    where = (
        "inside the actor update (on-policy shortcut)" if in_update else "by the old-log-prob pass before the update"
    )
    causes = "; ".join(f"({i}) {cause}" for i, cause in enumerate(LIKELY_CAUSES, start=1))
    msg = (
        f"rollout guard: at training step {step} the rollout's log-probs of its own sampled tokens differ from the "
        f"actor's by {mean:.4g} nats on average (max {stats.abs_max:.4g}) over {stats.tokens} response tokens, "
        f"measured {where}; the threshold is {config.max_mean_abs_diff:g} nats ({CONFIG_KEY}.max_mean_abs_diff), "
        f"which healthy bf16 runs stay far below (docs/rollout_guard.md). The run was stopped so that it does not "
        f"train on rollouts from a different policy. Likely causes: {causes}."
    )
    raise RolloutActorMismatchError(msg)
