"""The rollout–actor consistency guard: compare the rollout's log-probs of its sampled tokens with the actor's.

Kept apart from the patch module (verl_rollout_guard) so the arithmetic, the configuration and the errors can be
tested on plain tensors. Per token, Δ = log p_actor(t) − log p_rollout(t) (natural log, both at the sampling
temperature) over the valid response tokens of a step. A per-step mean dilutes a fault that touches a few experts,
layers or sequences, so the guard gates four statistics that each see a different shape of fault:

- ``abs_diff_mean``: mean |Δ| — everything is a little off (wrong weights everywhere, a precision change);
- ``seq_abs_diff_median``: the median over sequences of the per-sequence mean |Δ| — every sequence is a little off
  (a config or weight difference that touches all tokens), blind to the few sequences a healthy bf16 routing flip
  moves, so it can sit far closer to the healthy level than the mean;
- ``seq_abs_diff_max``: the largest per-sequence mean |Δ| — a few sequences are off (a bad rank or batch slot);
- ``tail_fraction``: the fraction of tokens with |Δ| above ``TAIL_CUT`` — a few tokens are far off (one expert or
  a few layers wrong: only the tokens routed through them move);
- ``kl_k3``: verl's ``rollout_corr`` k3 estimator of KL(rollout ‖ actor), E[e^Δ − 1 − Δ], as prime-rl gates it.

Logged besides: the largest single-token |Δ|, the k1 estimator E[−Δ], and NeMo-RL's token probability
multiplicative error E[e^|Δ|]. Every statistic derives from per-micro-batch partials — sums, counts, maxima and the
list of per-sequence means — so the actor can emit them inside the update and the driver folds them over
micro-batches and data-parallel ranks exactly.
Each gated statistic has two levels: above ``warn`` it is logged and flagged; above ``stop`` (or NaN) the run stops.
How the defaults were measured: docs/rollout_guard.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .._errors import RolloutActorMismatchError, RolloutGuardConfigError

#: Hydra key of the guard's settings (top level of the recipe config).
CONFIG_KEY = "r1_ascend.rollout_guard"
#: |Δ| above this counts towards ``tail_fraction`` (nats): e^0.5 ≈ 1.65, a token 65 % more or less likely on one side.
TAIL_CUT = 0.5
#: Δ is clipped to ±this before exponentiating (e^50 is finite in float32; beyond that the step is stopped anyway).
EXP_CLIP = 50.0

#: The statistics the guard gates, in the order they are checked and reported.
GATED = ("abs_diff_mean", "seq_abs_diff_median", "seq_abs_diff_max", "tail_fraction", "kl_k3")
#: Default levels per gated statistic, for NPU runs: from the peers' published healthy levels, since the NPU's
#: cannot be measured on the CPU (docs/rollout_guard.md "Levels"; ``r1-ascend guard-levels`` re-measures them).
DEFAULT_WARN: dict[str, float] = {
    "abs_diff_mean": 0.05,
    "seq_abs_diff_median": 0.05,
    "seq_abs_diff_max": 0.25,
    "tail_fraction": 0.02,
    "kl_k3": 0.01,
}
DEFAULT_STOP: dict[str, float] = {
    "abs_diff_mean": 0.1,
    "seq_abs_diff_median": 0.1,
    "seq_abs_diff_max": 0.5,
    "tail_fraction": 0.05,
    "kl_k3": 0.03,
}
UNITS = {
    "abs_diff_mean": "nats",
    "seq_abs_diff_median": "nats",
    "seq_abs_diff_max": "nats",
    "tail_fraction": "of tokens",
    "kl_k3": "nats",
}
CONFIG_FIELDS = ("enabled", "warn", "stop")
#: Keys of earlier releases, and where their meaning lives now.
RENAMED = {"max_mean_abs_diff": "stop.abs_diff_mean"}

PREFIX = "rollout_guard/"
#: Logged statistic names (the two first keep their names from earlier releases).
METRIC_NAMES = {
    "abs_diff_mean": f"{PREFIX}log_prob_abs_diff_mean",
    "abs_diff_max": f"{PREFIX}log_prob_abs_diff_max",
    "seq_abs_diff_median": f"{PREFIX}seq_abs_diff_median",
    "seq_abs_diff_max": f"{PREFIX}seq_abs_diff_max",
    "tail_fraction": f"{PREFIX}tail_fraction",
    "kl_k1": f"{PREFIX}kl_k1",
    "kl_k3": f"{PREFIX}kl_k3",
    "prob_mult_error": f"{PREFIX}prob_mult_error",
}
METRIC_MEAN = METRIC_NAMES["abs_diff_mean"]
METRIC_MAX = METRIC_NAMES["abs_diff_max"]
#: The levels in force are logged as ``rollout_guard/warn/<metric>`` and ``rollout_guard/stop/<metric>``.
WARN_PREFIX = f"{PREFIX}warn/"
STOP_PREFIX = f"{PREFIX}stop/"
METRIC_TOKENS = f"{PREFIX}tokens"
METRIC_SEQUENCES = f"{PREFIX}sequences"
#: 1 when a gated statistic was above its warn level at that step.
METRIC_WARNED = f"{PREFIX}warned"
#: 1 when the actor's log-probs came from the update (on-policy shortcut), 0 when from the old-log-prob pass.
METRIC_IN_UPDATE = f"{PREFIX}measured_in_update"

LIKELY_CAUSES = (
    "the rollout decoded from stale or garbage weights (a graph replaying freed parameter addresses: check that "
    "patch vllm_ascend_torchair_live_params is applied and no ACL graph mode is used with the offloading rollout)",
    "the weight sync missed, skipped or mis-converted parameters (Megatron->HF export, expert or QKV layout, MLA "
    "matrices or their absorbed copies not recomputed after the update, a few layers or experts left stale)",
    "the two engines compute different models (group-limited routing or yarn rope settings differ: run "
    "r1-ascend check-model)",
    "the rollout and the actor use different sampling transforms (temperature, top_p/top_k < 1 in training)",
    "a kernel or precision change in one engine (FP8/INT8 rollout, a different attention backend)",
)


def _levels(values: Any, defaults: Mapping[str, float], where: str) -> dict[str, float]:
    if values is None:
        return dict(defaults)
    if not isinstance(values, Mapping):
        msg = f"{CONFIG_KEY}.{where} must be a mapping with keys among {list(GATED)}, got {values!r}"
        raise RolloutGuardConfigError(msg)
    unknown = sorted(set(values) - set(GATED))
    if unknown:
        msg = f"unknown statistic(s) {unknown} under {CONFIG_KEY}.{where}; valid: {list(GATED)}"
        raise RolloutGuardConfigError(msg)
    levels = dict(defaults)
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            msg = f"{CONFIG_KEY}.{where}.{name} must be a positive finite number ({UNITS[name]}), got {value!r}"
            raise RolloutGuardConfigError(msg)
        levels[name] = float(value)
    return levels


@dataclass(frozen=True)
class GuardConfig:
    enabled: bool = True
    warn: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WARN))
    stop: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_STOP))

    @classmethod
    def from_config(cls, config: Any) -> GuardConfig:
        """Read ``r1_ascend.rollout_guard`` (absent = defaults); levels not given keep their defaults.

        Unknown keys, unknown statistics, non-positive levels and a warn level above its stop level are errors.
        """
        from omegaconf import OmegaConf

        node = OmegaConf.select(config, CONFIG_KEY, default=None)
        values: Mapping[str, Any] = {} if node is None else OmegaConf.to_container(node, resolve=True)  # type: ignore[assignment]
        if not isinstance(values, Mapping):
            msg = f"{CONFIG_KEY} must be a mapping with keys {list(CONFIG_FIELDS)}, got {values!r}"
            raise RolloutGuardConfigError(msg)
        for old, new in RENAMED.items():
            if old in values:
                msg = f"{CONFIG_KEY}.{old} was replaced by {CONFIG_KEY}.{new} (and other statistics): set that instead"
                raise RolloutGuardConfigError(msg)
        unknown = sorted(set(values) - set(CONFIG_FIELDS))
        if unknown:
            msg = f"unknown key(s) {unknown} under {CONFIG_KEY}; valid keys: {list(CONFIG_FIELDS)}"
            raise RolloutGuardConfigError(msg)
        enabled = values.get("enabled", True)
        if not isinstance(enabled, bool):
            msg = f"{CONFIG_KEY}.enabled must be true or false, got {enabled!r}"
            raise RolloutGuardConfigError(msg)
        warn = _levels(values.get("warn"), DEFAULT_WARN, "warn")
        stop = _levels(values.get("stop"), DEFAULT_STOP, "stop")
        inverted = [name for name in GATED if warn[name] > stop[name]]
        if inverted:
            shown = ", ".join(f"{n}: warn {warn[n]:g} > stop {stop[n]:g}" for n in inverted)
            msg = f"{CONFIG_KEY}: a warn level must not exceed its stop level ({shown})"
            raise RolloutGuardConfigError(msg)
        return cls(enabled, warn, stop)


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


#: How each partial folds over micro-batches and ranks.
_SUMMED = ("abs_sum", "k1_sum", "k3_sum", "mult_sum", "tail_count", "tokens", "sequences")
_MAXED = ("abs_max", "seq_mean_max")
_LISTED = "seq_means"


@dataclass(frozen=True)
class DiffStats:
    """Partial sums, counts and maxima of Δ over valid response tokens; every statistic derives from them."""

    tokens: int
    abs_sum: float
    abs_max: float
    k1_sum: float = 0.0
    k3_sum: float = 0.0
    mult_sum: float = 0.0
    tail_count: int = 0
    sequences: int = 0
    seq_mean_max: float = 0.0
    #: every sequence's mean |Δ| (for the median; a few thousand floats per step at most)
    seq_means: tuple[float, ...] = ()

    @property
    def mean(self) -> float:
        return self.abs_sum / self.tokens if self.tokens else math.nan

    def statistics(self) -> dict[str, float]:
        """Every logged statistic by name (see ``METRIC_NAMES``); NaN when no token was compared."""
        n = self.tokens
        per_token = (lambda total: total / n) if n else (lambda _total: math.nan)
        return {
            "abs_diff_mean": per_token(self.abs_sum),
            "abs_diff_max": self.abs_max if n else math.nan,
            "seq_abs_diff_median": _median(self.seq_means) if n else math.nan,
            "seq_abs_diff_max": self.seq_mean_max if n else math.nan,
            "tail_fraction": per_token(float(self.tail_count)),
            "kl_k1": per_token(self.k1_sum),
            "kl_k3": per_token(self.k3_sum),
            "prob_mult_error": per_token(self.mult_sum),
        }

    @classmethod
    def from_tensors(cls, actor: Any, rollout: Any, mask: Any) -> DiffStats:
        """The partials of one batch: ``actor``/``rollout`` log-probs and ``mask``, each [sequences, tokens]."""
        import torch

        if actor.shape != rollout.shape or actor.shape != mask.shape:
            msg = (
                f"actor log-probs {tuple(actor.shape)}, rollout log-probs {tuple(rollout.shape)} and response mask "
                f"{tuple(mask.shape)} must have the same shape"
            )
            raise ValueError(msg)
        valid = mask.to(device=actor.device, dtype=torch.bool)
        delta = actor.detach().float() - rollout.detach().float().to(actor.device)
        delta = torch.where(valid, delta, torch.zeros_like(delta))  # padding (verl pads with -1) never counts
        tokens = int(valid.sum())
        if tokens == 0:
            return cls(0, 0.0, 0.0)
        # NaN must never look healthy: it propagates into every sum and maximum below.
        absolute = delta.abs()
        clipped = delta.clamp(-EXP_CLIP, EXP_CLIP)
        k3 = torch.where(valid, torch.expm1(clipped) - clipped, torch.zeros_like(delta))
        mult = torch.where(valid, torch.exp(absolute.clamp(max=EXP_CLIP)), torch.zeros_like(delta))
        per_seq_tokens = valid.sum(dim=-1)
        has_tokens = per_seq_tokens > 0
        seq_means = absolute.sum(dim=-1)[has_tokens] / per_seq_tokens[has_tokens]
        masked_abs = absolute[valid]
        return cls(
            tokens=tokens,
            abs_sum=float(masked_abs.sum()),
            abs_max=float(masked_abs.max()),
            k1_sum=float(-delta[valid].sum()),
            k3_sum=float(k3.sum()),
            mult_sum=float(mult.sum()),
            tail_count=int((masked_abs > TAIL_CUT).sum()) + int(masked_abs.isnan().sum()),
            sequences=int(has_tokens.sum()),
            seq_mean_max=float(seq_means.max()),
            seq_means=tuple(float(v) for v in seq_means),
        )

    def as_raw_metrics(self) -> dict[str, Any]:
        raw: dict[str, Any] = {raw_key(name): float(getattr(self, name)) for name in (*_SUMMED, *_MAXED)}
        raw[raw_key(_LISTED)] = list(self.seq_means)
        return raw

    @classmethod
    def from_raw_metrics(cls, metrics: Mapping[str, Any]) -> DiffStats | None:
        """Fold the per-micro-batch partials (lists after verl's merge over ranks) into one; None if absent."""
        if raw_key("tokens") not in metrics:
            return None
        columns = {name: _as_list(metrics.get(raw_key(name), [])) for name in (*_SUMMED, *_MAXED)}
        lengths = {name: len(values) for name, values in columns.items()}
        if len(set(lengths.values())) != 1:
            msg = f"rollout guard partials disagree in length: {lengths}"
            raise ValueError(msg)
        folded: dict[str, Any] = {name: sum(columns[name]) for name in _SUMMED}
        folded.update({name: max(columns[name], default=0.0) for name in _MAXED})
        for name in ("tokens", "tail_count", "sequences"):
            folded[name] = int(folded[name])
        folded[_LISTED] = tuple(_as_list(metrics.get(raw_key(_LISTED), [])))
        if len(folded[_LISTED]) != folded["sequences"]:
            msg = (
                f"rollout guard partials: {len(folded[_LISTED])} per-sequence means for {folded['sequences']} sequences"
            )
            raise ValueError(msg)
        return cls(**folded)


def raw_key(name: str) -> str:
    """The metric key of one partial the actor emits inside the update (folded away by the driver)."""
    return f"{PREFIX}_{name}"


RAW_KEYS = tuple(raw_key(f.name) for f in fields(DiffStats))


def _median(values: tuple[float, ...]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _as_list(value: Any) -> list[float]:
    """Flatten a metric value: a number, a list per micro-batch, or (after verl's merge) a list per rank of those."""
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        return [item for v in value for item in _as_list(v)]
    return [float(value)]


@dataclass(frozen=True)
class Verdict:
    """The gated statistics of one step against their levels: which are above warn, which above stop."""

    values: dict[str, float]
    warned: tuple[str, ...]
    stopped: tuple[str, ...]

    @classmethod
    def judge(cls, stats: DiffStats, config: GuardConfig) -> Verdict:
        values = stats.statistics()
        if stats.tokens == 0:
            return cls(values, (), ())
        # `not value <= level` is True for NaN: a NaN statistic is never healthy
        warned = tuple(name for name in GATED if not values[name] <= config.warn[name])
        stopped = tuple(name for name in GATED if not values[name] <= config.stop[name])
        return cls(values, warned, stopped)

    def describe(self, names: Iterable[str], levels: Mapping[str, float]) -> str:
        return ", ".join(f"{METRIC_NAMES[n]} = {self.values[n]:.4g} {UNITS[n]} (level {levels[n]:g})" for n in names)


def metrics(
    stats: DiffStats, config: GuardConfig, *, in_update: bool, verdict: Verdict | None = None
) -> dict[str, float]:
    """The step's logged ``rollout_guard/*`` metrics: statistics, the levels in force, counts, flags."""
    verdict = verdict or Verdict.judge(stats, config)
    logged = {METRIC_NAMES[name]: value for name, value in verdict.values.items()}
    for name in GATED:
        logged[WARN_PREFIX + METRIC_NAMES[name].removeprefix(PREFIX)] = config.warn[name]
        logged[STOP_PREFIX + METRIC_NAMES[name].removeprefix(PREFIX)] = config.stop[name]
    logged[METRIC_TOKENS] = float(stats.tokens)
    logged[METRIC_SEQUENCES] = float(stats.sequences)
    logged[METRIC_WARNED] = 1.0 if verdict.warned else 0.0
    logged[METRIC_IN_UPDATE] = 1.0 if in_update else 0.0
    return logged


def check(stats: DiffStats, config: GuardConfig, *, step: int, in_update: bool) -> Verdict:
    """Judge one step; raise ``RolloutActorMismatchError`` when a gated statistic is above its stop level (or NaN).

    Returns the verdict, whose ``warned`` names the statistics above their warn level (the caller logs them).
    """
    verdict = Verdict.judge(stats, config)
    if not verdict.stopped:
        return verdict
    where = (
        "inside the actor update (on-policy shortcut)" if in_update else "by the old-log-prob pass before the update"
    )
    causes = "; ".join(f"({i}) {cause}" for i, cause in enumerate(LIKELY_CAUSES, start=1))
    msg = (
        f"rollout guard: at training step {step} the rollout's log-probs of its own sampled tokens disagree with the "
        f"actor's beyond the stop level: {verdict.describe(verdict.stopped, config.stop)}; over {stats.tokens} "
        f"response tokens in {stats.sequences} sequences (mean |Δ| {verdict.values['abs_diff_mean']:.4g}, max "
        f"{verdict.values['abs_diff_max']:.4g} nats), measured {where}. Levels: {CONFIG_KEY}.stop.*; healthy runs "
        f"stay far below them (docs/rollout_guard.md). The run was stopped so that it does not train on rollouts "
        f"from a different policy. Likely causes: {causes}."
    )
    raise RolloutActorMismatchError(msg)


def warning_message(verdict: Verdict, config: GuardConfig, *, step: int) -> str:
    return (
        f"rollout guard: step {step} is above the warn level: {verdict.describe(verdict.warned, config.warn)}. "
        f"Not stopped (stop levels {CONFIG_KEY}.stop.*). A healthy run does not warn (docs/rollout_guard.md): "
        f"check the weight sync and the two engines' model settings if it persists."
    )
