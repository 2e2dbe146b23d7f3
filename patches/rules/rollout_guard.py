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
The configured levels are absolute caps. The first ``calibration.steps`` gated steps of a run measure its own healthy
level (:class:`GuardState`); from then on each statistic warns and stops at multiples of that baseline (never below a
floor, never above the caps, :func:`calibrated_levels`), and ``escalate_after`` warned steps in a row stop the run
too. How the defaults were measured and why: docs/rollout_guard.md "Levels".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
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
#: Self-calibration (docs/rollout_guard.md "Levels"): the first this many gated steps of a run (counted from its
#: start, and continued from a checkpoint on resume) run at the absolute levels and measure the run's baseline, the
#: largest value of each statistic over them; 0 switches calibration off (the absolute levels throughout).
DEFAULT_CALIBRATION_STEPS = 3
#: After calibration: warn above WARN_FACTOR x max(baseline, FLOOR), stop above STOP_FACTOR x max(baseline, FLOOR),
#: each capped by the absolute level (docs/rollout_guard.md "Levels": measured on five healthy rehearsals and five
#: one-process runs, 10 steps each). The median is the steadiest statistic of a healthy run: its later steps stayed
#: within 1.8x the largest of the first three, so 4x warns and 8x stops. The mean carries the few tokens a near-tied
#: routing decision moves once the policy has converged (a later step up to 6x the first three's largest): 8x and
#: 16x of at least its floor.
DEFAULT_WARN_FACTOR: dict[str, float] = {
    "abs_diff_mean": 8.0,
    "seq_abs_diff_median": 4.0,
    "seq_abs_diff_max": 4.0,
    "tail_fraction": 4.0,
    "kl_k3": 4.0,
}
DEFAULT_STOP_FACTOR: dict[str, float] = {
    "abs_diff_mean": 16.0,
    "seq_abs_diff_median": 8.0,
    "seq_abs_diff_max": 8.0,
    "tail_fraction": 8.0,
    "kl_k3": 8.0,
}
#: The least baseline a calibrated level is computed from, per statistic, so that a near-zero baseline (fp32 on
#: both sides, no token ever in the tail) does not put the levels inside the noise. The largest sequence mean, the
#: tail fraction and k3 are set by single tokens wherever a step has few of them: one token 0.94 nat off in a
#: 512-token step of the CPU rehearsal makes them 0.12, 0.002 and 0.0012 (its largest healthy values); their floors
#: hold four times that below the warn level. The mean's floor covers its converged steps (0.0077 at most).
DEFAULT_FLOOR: dict[str, float] = {
    "abs_diff_mean": 0.002,
    "seq_abs_diff_median": 0.001,
    "seq_abs_diff_max": 0.05,
    "tail_fraction": 0.0025,
    "kl_k3": 0.002,
}
#: What a resumed run does with the calibration saved in the checkpoint it resumes from.
RESUME_RESTORE, RESUME_RECALIBRATE = "restore", "recalibrate"
RESUME_MODES = (RESUME_RESTORE, RESUME_RECALIBRATE)
#: This many warned steps in a row stop the run (a warning alone only logs); 0: never.
DEFAULT_ESCALATE_AFTER = 3
CONFIG_FIELDS = ("enabled", "warn", "stop", "calibration", "escalate_after")
CALIBRATION_FIELDS = ("steps", "warn_factor", "stop_factor", "floor", "on_resume")
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
#: The calibrated baseline of each statistic, ``rollout_guard/baseline/<metric>``, logged once calibration is done.
BASELINE_PREFIX = f"{PREFIX}baseline/"
#: 1 while the run calibrates (the absolute levels in force, the step's values measured for the baseline).
METRIC_CALIBRATING = f"{PREFIX}calibrating"
#: How many warned steps in a row end at this step (0: not warned); ``escalate_after`` of them stop the run.
METRIC_WARNED_STEPS = f"{PREFIX}warned_steps"
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


def _per_statistic(values: Any, defaults: Mapping[str, float], where: str, *, factor: bool = False) -> dict[str, float]:
    """A mapping statistic -> finite number, positive (a level or floor) or >= 1 (a ``factor``); defaults for the
    statistics not given."""
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
        number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        if not number or not (value >= 1 if factor else value > 0):
            expected = FACTOR_RULE if factor else f"a positive finite number ({UNITS[name]})"
            msg = f"{CONFIG_KEY}.{where}.{name} must be {expected}, got {value!r}"
            raise RolloutGuardConfigError(msg)
        levels[name] = float(value)
    return levels


def _mapping(values: Any, where: str, keys: Sequence[str]) -> Mapping[str, Any]:
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        msg = f"{where} must be a mapping with keys {list(keys)}, got {values!r}"
        raise RolloutGuardConfigError(msg)
    unknown = sorted(set(values) - set(keys))
    if unknown:
        msg = f"unknown key(s) {unknown} under {where}; valid keys: {list(keys)}"
        raise RolloutGuardConfigError(msg)
    return values


def _count(value: Any, where: str, meaning: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        msg = f"{CONFIG_KEY}.{where} must be a whole number >= 0 ({meaning}), got {value!r}"
        raise RolloutGuardConfigError(msg)
    return value


def _not_above(low: Mapping[str, float], high: Mapping[str, float], names: tuple[str, str], rule: str) -> None:
    """Refuse a warn setting above its stop setting (``names``: how the two are shown; ``rule``: the sentence)."""
    inverted = [n for n in GATED if low[n] > high[n]]
    if inverted:
        shown = ", ".join(f"{n}: {names[0]} {low[n]:g} > {names[1]} {high[n]:g}" for n in inverted)
        raise RolloutGuardConfigError(f"{rule} ({shown})")


FACTOR_RULE = "a finite number >= 1 (a multiple of the run's healthy baseline)"


@dataclass(frozen=True)
class Calibration:
    """How a run learns its own levels (``r1_ascend.rollout_guard.calibration``)."""

    steps: int = DEFAULT_CALIBRATION_STEPS
    warn_factor: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WARN_FACTOR))
    stop_factor: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_STOP_FACTOR))
    floor: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_FLOOR))
    on_resume: str = RESUME_RESTORE

    @classmethod
    def from_values(cls, values: Any) -> Calibration:
        where = f"{CONFIG_KEY}.calibration"
        found = _mapping(values, where, CALIBRATION_FIELDS)
        steps = _count(found.get("steps", DEFAULT_CALIBRATION_STEPS), "calibration.steps", "0: no calibration")
        warn = _per_statistic(found.get("warn_factor"), DEFAULT_WARN_FACTOR, "calibration.warn_factor", factor=True)
        stop = _per_statistic(found.get("stop_factor"), DEFAULT_STOP_FACTOR, "calibration.stop_factor", factor=True)
        _not_above(
            warn, stop, ("warn_factor", "stop_factor"), f"{where}: a warn_factor must not exceed its stop_factor"
        )
        floor = _per_statistic(found.get("floor"), DEFAULT_FLOOR, "calibration.floor")
        on_resume = found.get("on_resume", RESUME_RESTORE)
        if on_resume not in RESUME_MODES:
            msg = f"{where}.on_resume must be one of {list(RESUME_MODES)}, got {on_resume!r}"
            raise RolloutGuardConfigError(msg)
        return cls(steps, warn, stop, floor, on_resume)


@dataclass(frozen=True)
class GuardConfig:
    enabled: bool = True
    #: the absolute levels: in force while the run calibrates, and the caps of every calibrated level after
    warn: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_WARN))
    stop: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_STOP))
    calibration: Calibration = field(default_factory=Calibration)
    escalate_after: int = DEFAULT_ESCALATE_AFTER

    @classmethod
    def from_config(cls, config: Any) -> GuardConfig:
        """Read ``r1_ascend.rollout_guard`` (absent = defaults); settings not given keep their defaults.

        Unknown keys, unknown statistics, non-positive levels, factors below 1, a warn level (factor) above its stop
        level (factor), an unknown resume mode and a negative step count are errors.
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
        _mapping(values, CONFIG_KEY, CONFIG_FIELDS)
        enabled = values.get("enabled", True)
        if not isinstance(enabled, bool):
            msg = f"{CONFIG_KEY}.enabled must be true or false, got {enabled!r}"
            raise RolloutGuardConfigError(msg)
        warn = _per_statistic(values.get("warn"), DEFAULT_WARN, "warn")
        stop = _per_statistic(values.get("stop"), DEFAULT_STOP, "stop")
        _not_above(warn, stop, ("warn", "stop"), f"{CONFIG_KEY}: a warn level must not exceed its stop level")
        calibration = Calibration.from_values(values.get("calibration"))
        escalate = _count(values.get("escalate_after", DEFAULT_ESCALATE_AFTER), "escalate_after", "0: never")
        return cls(enabled, warn, stop, calibration, escalate)

    def describe(self) -> list[str]:
        """The settings in force, one line each (``r1-ascend preflight``)."""
        if not self.enabled:
            return [f"off ({CONFIG_KEY}.enabled=false): rollout and actor log-probs are not compared"]
        cal = self.calibration
        lines = [f"{'statistic':<20} {'warn cap':>9} {'stop cap':>9} {'floor':>9} {'warn x':>7} {'stop x':>7}"]
        lines += [
            f"{n:<20} {self.warn[n]:>9g} {self.stop[n]:>9g} {cal.floor[n]:>9g} {cal.warn_factor[n]:>7g} "
            f"{cal.stop_factor[n]:>7g}"
            for n in GATED
        ]
        if cal.steps:
            lines.append(
                f"calibration: the first {cal.steps} healthy step(s) of the run at the caps; then warn and stop at the "
                f"factors x max(their largest value, floor), never above the caps; on resume: {cal.on_resume}"
            )
        else:
            lines.append("calibration: off (calibration.steps=0): the caps are the levels of every step")
        lines.append(
            f"escalation: {self.escalate_after} warned steps in a row stop the run"
            if self.escalate_after
            else "escalation: off (escalate_after=0): a warning never stops the run"
        )
        return lines


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


def level_key(prefix: str, name: str) -> str:
    """The logged key of a level (``prefix``: WARN_PREFIX, STOP_PREFIX or BASELINE_PREFIX) of gated ``name``."""
    return prefix + METRIC_NAMES[name].removeprefix(PREFIX)


@dataclass(frozen=True)
class Levels:
    """The warn and stop levels in force at one step. ``baseline`` is None while they are the absolute levels (the run
    calibrates, or calibration is off); otherwise it holds the largest value of each statistic over the calibration
    steps ``over``, and ``reference`` the baseline raised to its floor, which the factors multiply."""

    warn: dict[str, float]
    stop: dict[str, float]
    baseline: dict[str, float] | None = None
    reference: dict[str, float] | None = None
    over: tuple[int, ...] = ()
    factors: tuple[dict[str, float], dict[str, float]] | None = None

    @classmethod
    def absolute(cls, config: GuardConfig) -> Levels:
        return cls(dict(config.warn), dict(config.stop))

    @property
    def calibrated(self) -> bool:
        return self.baseline is not None

    def explain(self, name: str, what: str) -> str:
        """How the ``what`` ("warn" or "stop") level of ``name`` came about, for messages."""
        level = (self.warn if what == "warn" else self.stop)[name]
        if self.baseline is None or self.reference is None or self.factors is None:
            return f"{level:g}, the absolute level {CONFIG_KEY}.{what}.{name}"
        factor = self.factors[0 if what == "warn" else 1][name]
        floored = (
            "" if self.reference[name] == self.baseline[name] else f" raised to its floor {self.reference[name]:g}"
        )
        made = f"{factor:g} x the baseline {self.baseline[name]:.4g}{floored}"
        if level < factor * self.reference[name]:
            return f"{level:.4g}, the absolute cap {CONFIG_KEY}.{what}.{name} ({made} is above it)"
        return f"{level:.4g} = {made} (calibration steps {_step_range(self.over)})"


def _step_range(steps: Sequence[int]) -> str:
    return f"{steps[0]}-{steps[-1]}" if len(steps) > 1 else str(steps[0]) if steps else "none"


def baseline_of(samples: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The calibrated baseline: the largest value of each gated statistic over healthy steps (at least one)."""
    if not samples:
        msg = "a baseline needs at least one calibration step"
        raise ValueError(msg)
    return {name: max(float(sample[name]) for sample in samples) for name in GATED}


def calibrated_levels(baseline: Mapping[str, float], config: GuardConfig, over: Sequence[int] = ()) -> Levels:
    """warn = min(absolute warn, warn_factor x max(baseline, floor)), stop likewise: multiples of the run's own healthy
    level, never inside its noise (the floor), never looser than the configured levels (the caps)."""
    cal = config.calibration
    reference = {name: max(float(baseline[name]), cal.floor[name]) for name in GATED}
    warn = {name: min(config.warn[name], cal.warn_factor[name] * reference[name]) for name in GATED}
    stop = {name: min(config.stop[name], cal.stop_factor[name] * reference[name]) for name in GATED}
    factors = (dict(cal.warn_factor), dict(cal.stop_factor))
    return Levels(warn, stop, {n: float(baseline[n]) for n in GATED}, reference, tuple(over), factors)


@dataclass(frozen=True)
class Verdict:
    """The gated statistics of one step against the levels in force: which are above warn, which above stop."""

    values: dict[str, float]
    warned: tuple[str, ...]
    stopped: tuple[str, ...]
    levels: Levels

    @classmethod
    def judge(cls, stats: DiffStats, levels: Levels | GuardConfig) -> Verdict:
        """``levels``: those in force, or a config (its absolute levels)."""
        if isinstance(levels, GuardConfig):
            levels = Levels.absolute(levels)
        values = stats.statistics()
        if stats.tokens == 0:
            return cls(values, (), (), levels)
        # `not value <= level` is True for NaN: a NaN statistic is never healthy
        warned = tuple(name for name in GATED if not values[name] <= levels.warn[name])
        stopped = tuple(name for name in GATED if not values[name] <= levels.stop[name])
        return cls(values, warned, stopped, levels)

    def describe(self, names: Iterable[str], what: str) -> str:
        levels = self.levels.warn if what == "warn" else self.levels.stop
        return ", ".join(f"{METRIC_NAMES[n]} = {self.values[n]:.4g} {UNITS[n]} (level {levels[n]:.4g})" for n in names)

    def explain(self, names: Iterable[str], what: str) -> str:
        return "; ".join(f"{METRIC_NAMES[n]}: {self.levels.explain(n, what)}" for n in names)


@dataclass(frozen=True)
class Observed:
    """One gated step as the guard remembers it: its statistics and which of them warned."""

    step: int
    values: dict[str, float]
    warned: tuple[str, ...] = ()

    def record(self) -> dict[str, Any]:
        return {"step": self.step, "values": dict(self.values), "warned": list(self.warned)}

    @classmethod
    def from_record(cls, record: Any) -> Observed:
        values = record["values"]
        if set(values) != set(GATED):
            raise ValueError(f"statistics {sorted(values)}, expected {sorted(GATED)}")
        return cls(int(record["step"]), {n: float(values[n]) for n in GATED}, tuple(record.get("warned", ())))


#: The layout of GuardState.record (stored with each checkpoint).
STATE_VERSION = 1


@dataclass
class GuardState:
    """What the guard carries from step to step and, saved with each checkpoint, across a relaunch: the healthy
    steps measured for the baseline so far, and the warned steps that end at the last step."""

    calibration: list[Observed] = field(default_factory=list)
    warned_run: list[Observed] = field(default_factory=list)

    def levels(self, config: GuardConfig) -> Levels:
        """The levels of the next step: absolute until ``calibration.steps`` healthy steps were measured, then
        calibrated from the first that many."""
        steps = config.calibration.steps
        if steps == 0 or len(self.calibration) < steps:
            return Levels.absolute(config)
        used = self.calibration[:steps]
        return calibrated_levels(baseline_of([o.values for o in used]), config, [o.step for o in used])

    def judge(self, stats: DiffStats, config: GuardConfig, *, step: int, in_update: bool) -> Verdict:
        """Judge one step at the levels in force, then remember it. Raises ``RolloutActorMismatchError`` when a
        statistic is above its stop level (or NaN), or when this step makes ``escalate_after`` warned steps in a
        row. A calibration step above an absolute warn level warns and is not measured for the baseline; a step
        without compared tokens changes nothing."""
        verdict = Verdict.judge(stats, self.levels(config))
        if verdict.stopped:
            raise RolloutActorMismatchError(stop_message(verdict, stats, step=step, in_update=in_update))
        if stats.tokens == 0:
            return verdict
        seen = Observed(step, {name: verdict.values[name] for name in GATED}, verdict.warned)
        if verdict.warned:
            self.warned_run.append(seen)
        else:
            self.warned_run.clear()
        if 0 < config.escalate_after <= len(self.warned_run):
            raise RolloutActorMismatchError(escalation_message(self.warned_run, verdict, stats, config, step=step))
        if not verdict.levels.calibrated and len(self.calibration) < config.calibration.steps and not verdict.warned:
            self.calibration.append(seen)
        return verdict

    def calibrating(self, config: GuardConfig) -> bool:
        return len(self.calibration) < config.calibration.steps

    @classmethod
    def after(cls, steps: Iterable[tuple[int, DiffStats]], config: GuardConfig) -> GuardState:
        """The state once ``(step, statistics)`` were judged in order (raises as :meth:`judge` does): what a run
        that measured them gates its next step with, e.g. ``GuardState.after(healthy, config).levels(config)``."""
        state = cls()
        for step, stats in steps:
            state.judge(stats, config, step=step, in_update=False)
        return state

    def record(self) -> dict[str, Any]:
        """JSON-ready (saved next to the checkpoint as ``STATE_FILE``)."""
        return {
            "version": STATE_VERSION,
            "calibration": [o.record() for o in self.calibration],
            "warned_run": [o.record() for o in self.warned_run],
        }

    @classmethod
    def from_record(cls, record: Any, where: str) -> GuardState:
        """The state a checkpoint saved; ``where`` names the file in the error when it cannot be read."""
        try:
            if record.get("version") != STATE_VERSION:
                raise ValueError(f"version {record.get('version')!r}, expected {STATE_VERSION}")
            return cls(
                [Observed.from_record(o) for o in record["calibration"]],
                [Observed.from_record(o) for o in record["warned_run"]],
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise RolloutGuardConfigError(unreadable_state(where, exc)) from exc


def unreadable_state(where: str, exc: BaseException) -> str:
    return (
        f"the rollout guard's state saved in {where} cannot be read ({type(exc).__name__}: {exc}). Restore the file "
        f"from a copy of the checkpoint, or relaunch with {CONFIG_KEY}.calibration.on_resume={RESUME_RECALIBRATE} to "
        f"measure a new baseline over the first resumed steps"
    )


#: The guard's state, saved in each ``global_step_N`` directory with the checkpoint.
STATE_FILE = "rollout_guard.json"


def metrics(
    stats: DiffStats, verdict: Verdict, *, in_update: bool, calibrating: bool = False, warned_steps: int = 0
) -> dict[str, float]:
    """The step's logged ``rollout_guard/*`` metrics: statistics, the levels in force and the baseline they were
    calibrated from, counts, flags."""
    logged = {METRIC_NAMES[name]: value for name, value in verdict.values.items()}
    for name in GATED:
        logged[level_key(WARN_PREFIX, name)] = verdict.levels.warn[name]
        logged[level_key(STOP_PREFIX, name)] = verdict.levels.stop[name]
        if verdict.levels.baseline is not None:
            logged[level_key(BASELINE_PREFIX, name)] = verdict.levels.baseline[name]
    logged[METRIC_TOKENS] = float(stats.tokens)
    logged[METRIC_SEQUENCES] = float(stats.sequences)
    logged[METRIC_WARNED] = 1.0 if verdict.warned else 0.0
    logged[METRIC_WARNED_STEPS] = float(warned_steps)
    logged[METRIC_CALIBRATING] = 1.0 if calibrating else 0.0
    logged[METRIC_IN_UPDATE] = 1.0 if in_update else 0.0
    return logged


def _where(in_update: bool) -> str:
    return "inside the actor update (on-policy shortcut)" if in_update else "by the old-log-prob pass before the update"


def _causes() -> str:
    return "; ".join(f"({i}) {cause}" for i, cause in enumerate(LIKELY_CAUSES, start=1))


def stop_message(verdict: Verdict, stats: DiffStats, *, step: int, in_update: bool) -> str:
    return (
        f"rollout guard: at training step {step} the rollout's log-probs of its own sampled tokens disagree with the "
        f"actor's beyond the stop level: {verdict.describe(verdict.stopped, 'stop')}; over {stats.tokens} "
        f"response tokens in {stats.sequences} sequences (mean |Δ| {verdict.values['abs_diff_mean']:.4g}, max "
        f"{verdict.values['abs_diff_max']:.4g} nats), measured {_where(in_update)}. Levels: "
        f"{verdict.explain(verdict.stopped, 'stop')}; healthy runs stay far below them (docs/rollout_guard.md). The "
        f"run was stopped so that it does not train on rollouts from a different policy. Likely causes: {_causes()}."
    )


def escalation_message(
    warned: Sequence[Observed], verdict: Verdict, stats: DiffStats, config: GuardConfig, *, step: int
) -> str:
    """Which statistics kept warning (in every one of the steps first, then the others), for how many steps, and
    their values step by step against the warn levels."""
    steps = [o.step for o in warned]
    every = [n for n in GATED if all(n in o.warned for o in warned)]
    some = [n for n in GATED if n not in every and any(n in o.warned for o in warned)]
    shown = []
    for name in [*every, *some]:
        values = ", ".join(f"{o.values[name]:.4g}" for o in warned)
        count = sum(name in o.warned for o in warned)
        shown.append(
            f"{METRIC_NAMES[name]} above its warn level in {count} of them ({values} {UNITS[name]} in steps "
            f"{_step_range(steps)}; warn level now {verdict.levels.explain(name, 'warn')})"
        )
    return (
        f"rollout guard: escalated to a stop at training step {step}: {len(warned)} steps in a row "
        f"({_step_range(steps)}) were above a warn level, and a warning alone only logs ({CONFIG_KEY}.escalate_after="
        f"{config.escalate_after}). Kept warning: {'; '.join(shown)}. Step {step} had {stats.tokens} response tokens "
        f"in {stats.sequences} sequences. A healthy run does not warn twice in a row (docs/rollout_guard.md): the "
        f"rollout keeps computing a slightly different policy. Likely causes: {_causes()}."
    )


def check(stats: DiffStats, levels: Levels | GuardConfig, *, step: int, in_update: bool) -> Verdict:
    """Judge one step at fixed ``levels`` (a config: its absolute levels); raise ``RolloutActorMismatchError`` when a
    gated statistic is above its stop level (or NaN). Returns the verdict, whose ``warned`` names the statistics
    above their warn level. A run judges through :class:`GuardState`, which calibrates and escalates."""
    verdict = Verdict.judge(stats, levels)
    if verdict.stopped:
        raise RolloutActorMismatchError(stop_message(verdict, stats, step=step, in_update=in_update))
    return verdict


def warning_message(verdict: Verdict, *, step: int, warned_steps: int, config: GuardConfig) -> str:
    phase = (
        ""
        if verdict.levels.calibrated
        else " (the run is still calibrating: the absolute levels apply, and this step is left out of the baseline)"
    )
    escalation = (
        f"{warned_steps} of {config.escalate_after} warned steps in a row before the run is stopped"
        if config.escalate_after
        else "escalation is off"
    )
    return (
        f"rollout guard: step {step} is above the warn level{phase}: {verdict.describe(verdict.warned, 'warn')}. "
        f"Levels: {verdict.explain(verdict.warned, 'warn')}. Not stopped ({escalation}). A healthy run does not "
        f"warn (docs/rollout_guard.md): check the weight sync and the two engines' model settings if it persists."
    )
