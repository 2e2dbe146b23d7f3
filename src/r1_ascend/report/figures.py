"""Training curves as PNG files of a fixed size (Agg canvas, no display, no global pyplot state)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from r1_ascend.patches.rules import expert_load
from r1_ascend.patches.rules import rollout_guard as guard
from r1_ascend.report import metric_names as mn
from r1_ascend.report.figure_style import DPI, build_figure
from r1_ascend.report.panels import Panel, Reference, Series
from r1_ascend.report.run import RunData
from r1_ascend.report.timing import DIES_PER_CARD, RESHARD_DERIVED, reshard_seconds

logger = logging.getLogger(__name__)


@dataclass
class FigureSpec:
    filename: str
    title: str
    wanted: list[str]
    build: Callable[[RunData, int], list[Panel]]
    #: the x axis when it is not the training step (the panels' "steps" are then its values; no resume lines)
    x_label: str | None = None


@dataclass
class FigureResult:
    filename: str
    title: str
    written: bool
    plotted: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def _pick(run: RunData, keys: list[str]) -> Series:
    series: Series = {}
    for key in keys:
        steps, values = run.series(key)
        if steps:
            series[key] = (steps, values)
    return series


def _reward_panels(run: RunData, _dies: int) -> list[Panel]:
    return [Panel("reward per response", _pick(run, [mn.REWARD_MEAN, mn.SCORE_MEAN]))]


def _component_panels(run: RunData, _dies: int) -> list[Panel]:
    train: Series = {
        name: (sorted(by_step), [by_step[s] for s in sorted(by_step)])
        for name, by_step in run.reward_components.items()
    }
    validation = _matching_series(run, mn.VAL_AUX_MEAN, "{source}: {var} (mean@{n})")
    return [Panel("mean per sample (generation dumps)", train), Panel("validation mean (val-aux)", validation)]


def _validation_panels(run: RunData, _dies: int) -> list[Panel]:
    return [Panel("validation accuracy", _matching_series(run, mn.VAL_CORE_MEAN, "{source} {var} (mean@{n})"))]


def _matching_series(run: RunData, pattern: re.Pattern[str], label: str) -> Series:
    """Every logged metric whose name ``pattern`` matches, labelled by ``label`` filled with the match's groups."""
    series: Series = {}
    for key in sorted(run.keys()):
        match = pattern.match(key)
        if match:
            steps, values = run.series(key)
            if steps:
                series[label.format(**match.groupdict())] = (steps, values)
    return series


def _length_panels(run: RunData, _dies: int) -> list[Panel]:
    return [
        Panel("tokens", _pick(run, [mn.RESPONSE_LENGTH_MEAN, mn.RESPONSE_LENGTH_MAX, mn.PROMPT_LENGTH_MEAN])),
        # responses cut at max_response_length: rising, it is the overlong warning sign of R1-Zero runs
        Panel("fraction at max length", _pick(run, [mn.RESPONSE_CLIP_RATIO, mn.PROMPT_CLIP_RATIO])),
    ]


#: The logged level series of a guard statistic: the warn and stop levels in force, and the baseline they were
#: calibrated from (logged from the first step after calibration).
GUARD_LEVEL_PREFIXES = {"warn": guard.WARN_PREFIX, "stop": guard.STOP_PREFIX, "baseline": guard.BASELINE_PREFIX}


def guard_level_series(run: RunData, key: str, what: str) -> tuple[list[int], list[float]]:
    """The ``what`` ("warn", "stop" or "baseline") level logged for guard statistic ``key`` at each step; for the
    mean in runs of releases before 0.5, their single ``rollout_guard/threshold`` as its stop level."""
    steps, values = run.series(GUARD_LEVEL_PREFIXES[what] + key.removeprefix(guard.PREFIX))
    if not steps and what == "stop" and key == guard.METRIC_MEAN:
        steps, values = run.series(mn.ROLLOUT_GUARD_THRESHOLD)
    return steps, values


def _guard_references(run: RunData, stat: str) -> list[Reference]:
    """The warn and stop levels the guard logged for ``stat`` (a key of ``rollout_guard.METRIC_NAMES``), and the
    calibrated baseline they were set from."""
    key = guard.METRIC_NAMES[stat]
    found = []
    for what in ("warn", "stop", "baseline"):
        steps, values = guard_level_series(run, key, what)
        if steps:
            label = "calibrated baseline" if what == "baseline" else f"{what} level"
            found.append(Reference(label, steps, values, of=key, style=what))
    return found


def _consistency_panels(run: RunData, _dies: int) -> list[Panel]:
    """Difference statistics only, each family on its own axis; counts, flags and levels are not data series."""
    names = guard.METRIC_NAMES
    keys = sorted(run.keys())
    verl_diff = [k for k in keys if k.startswith(mn.ROLLOUT_PROBS_DIFF_PREFIX) and k != mn.ROLLOUT_PROBS_DIFF_VALID]
    return [
        Panel(
            "|Δ log-prob| (nats)",
            _pick(run, [names[s] for s in ("abs_diff_mean", "seq_abs_diff_median")]),
            _guard_references(run, "abs_diff_mean") + _guard_references(run, "seq_abs_diff_median"),
            log_scale=True,
        ),
        Panel(
            "largest |Δ log-prob| (nats)",
            _pick(run, [names[s] for s in ("seq_abs_diff_max", "abs_diff_max")]),
            _guard_references(run, "seq_abs_diff_max"),
            log_scale=True,
        ),
        Panel(
            "KL(rollout‖actor) (nats)", _pick(run, [names["kl_k3"]]), _guard_references(run, "kl_k3"), log_scale=True
        ),
        Panel(
            "fraction of tokens",
            _pick(run, [names["tail_fraction"]]),
            _guard_references(run, "tail_fraction"),
        ),
        Panel("|p_actor - p_rollout|", _pick(run, verl_diff), log_scale=True),
        Panel("Pearson r of probs", _pick(run, [mn.ROLLOUT_ACTOR_PEARSON])),
    ]


def _kl_entropy_panels(run: RunData, _dies: int) -> list[Panel]:
    return [
        Panel("KL", _pick(run, [mn.KL_LOSS, mn.PPO_KL, mn.REWARD_KL_PENALTY])),
        Panel("entropy", _pick(run, [mn.ENTROPY])),
    ]


def _throughput_panels(run: RunData, dies: int) -> list[Panel]:
    steps, values = run.series(mn.THROUGHPUT_PER_DIE)
    series: Series = {}
    if steps:
        series[f"per A3 card ({dies} x {mn.THROUGHPUT_PER_DIE})"] = (steps, [v * dies for v in values])
        series[f"per die ({mn.THROUGHPUT_PER_DIE})"] = (steps, values)
    return [Panel("tokens/s", series)]


def _memory_panels(run: RunData, _dies: int) -> list[Panel]:
    return [Panel("GiB per device", _pick(run, [mn.MAX_MEMORY_ALLOCATED_GB, mn.MAX_MEMORY_RESERVED_GB]))]


def _expert_load_panels(run: RunData, _dies: int) -> list[Panel]:
    """The worst MoE layer of each step: how far its busiest expert is above the mean, experts without tokens, the
    busiest expert-parallel rank's share, and which layer it was."""
    worst = expert_load.WORST
    return [
        Panel("busiest expert / mean", _pick(run, [worst["max_over_mean"]])),
        Panel("experts without tokens", _pick(run, [worst["experts_without_tokens"]])),
        Panel("busiest EP rank's share", _pick(run, [worst["top_ep_share"]])),
        Panel("worst layer", _pick(run, [expert_load.WORST_LAYER])),
    ]


def layer_series(run: RunData, statistic: str) -> dict[int, tuple[list[int], list[float]]]:
    """Every logged ``moe/layer_NN/<statistic>`` series, by layer."""
    found = {}
    for key in sorted(run.keys()):
        parsed = expert_load.split_layer_metric(key)
        if parsed is not None and parsed[1] == statistic:
            steps, values = run.series(key)
            if steps:
                found[parsed[0]] = (steps, values)
    return dict(sorted(found.items()))


def _by_layer(series: dict[int, tuple[list[int], list[float]]], pick: Callable[[list[float]], float]) -> tuple:
    layers = list(series)
    return layers, [pick(values) for _steps, values in series.values()]


def _expert_load_layer_panels(run: RunData, _dies: int) -> list[Panel]:
    """Per MoE layer (x axis): its load at the last logged step and its worst over the run."""
    panels = []
    for statistic, label in (("max_over_mean", "busiest expert / mean"), ("top_ep_share", "busiest EP rank's share")):
        series = layer_series(run, statistic)
        if not series:
            continue
        last_step = max(steps[-1] for steps, _ in series.values())
        at_last = {layer: (s, v) for layer, (s, v) in series.items() if s[-1] == last_step}
        panels.append(
            Panel(
                label,
                {
                    f"step {last_step}": _by_layer(at_last, lambda values: values[-1]),
                    "worst step of the run": _by_layer(series, max),
                },
            )
        )
    return panels


def _stage_panels(run: RunData, _dies: int) -> list[Panel]:
    keys = [
        mn.STEP_TIME,
        mn.GEN_TIME,
        mn.GENERATE_SEQUENCES_TIME,
        mn.RESHARD_TIME,
        mn.REWARD_TIME,
        mn.OLD_LOG_PROB_TIME,
        mn.REF_TIME,
        mn.UPDATE_ACTOR_TIME,
    ]
    series = _pick(run, keys)
    if mn.RESHARD_TIME not in series:  # stock verl: the derived reshard of the timing table
        steps = [s for s in run.training_steps() if reshard_seconds(run.steps[s])[1] == RESHARD_DERIVED]
        if steps:
            label = f"reshard ({mn.GEN_TIME} - {mn.GENERATE_SEQUENCES_TIME})"
            series[label] = (steps, [reshard_seconds(run.steps[s])[0] or 0.0 for s in steps])
    return [Panel("seconds", series)]


FIGURES: tuple[FigureSpec, ...] = (
    FigureSpec("reward.png", "Reward", [mn.REWARD_MEAN, mn.SCORE_MEAN], _reward_panels),
    FigureSpec(
        "reward_components.png",
        "Reward components",
        ["numeric reward extra-info fields in generation dumps", "val-aux/<source>/<var>/mean@N"],
        _component_panels,
    ),
    FigureSpec("validation.png", "Validation accuracy", ["val-core/<source>/<var>/mean@N"], _validation_panels),
    FigureSpec(
        "response_length.png",
        "Response length",
        [mn.RESPONSE_LENGTH_MEAN, mn.RESPONSE_LENGTH_MAX, mn.PROMPT_LENGTH_MEAN, mn.RESPONSE_CLIP_RATIO],
        _length_panels,
    ),
    FigureSpec(
        "rollout_consistency.png",
        "Rollout-actor log-prob consistency",
        [f"{mn.ROLLOUT_GUARD_PREFIX}*", f"{mn.ROLLOUT_PROBS_DIFF_PREFIX}*", mn.ROLLOUT_ACTOR_PEARSON],
        _consistency_panels,
    ),
    FigureSpec("kl_entropy.png", "KL and entropy", [mn.KL_LOSS, mn.PPO_KL, mn.ENTROPY], _kl_entropy_panels),
    FigureSpec("throughput.png", "Throughput", [mn.THROUGHPUT_PER_DIE], _throughput_panels),
    FigureSpec(
        "memory.png", "Peak device memory", [mn.MAX_MEMORY_ALLOCATED_GB, mn.MAX_MEMORY_RESERVED_GB], _memory_panels
    ),
    FigureSpec("stage_times.png", "Stage times", [mn.STEP_TIME, mn.GEN_TIME, mn.UPDATE_ACTOR_TIME], _stage_panels),
    FigureSpec(
        "expert_load.png",
        "Expert load, worst MoE layer per step",
        [expert_load.WORST["max_over_mean"], expert_load.WORST_LAYER],
        _expert_load_panels,
    ),
    FigureSpec(
        "expert_load_by_layer.png",
        "Expert load per MoE layer",
        [f"{expert_load.PREFIX}layer_<NN>/<statistic>"],
        _expert_load_layer_panels,
        x_label="MoE layer (checkpoint index)",
    ),
)


def write_figures(run: RunData, out_dir: Path, dies_per_card: int = DIES_PER_CARD) -> list[FigureResult]:
    """Write every figure that has data; the result says which curves were drawn and which metrics were absent."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    resume_steps = sorted({p.restart_step for p in run.resume_points})
    for spec in FIGURES:
        panels = spec.build(run, dies_per_card)
        plotted = [label for panel in panels for label in panel.series]
        result = FigureResult(spec.filename, spec.title, written=False, plotted=plotted)
        # Descriptions such as "val-core/<source>/..." are patterns, not metric names; only names can be "missing".
        result.missing = [k for k in spec.wanted if "<" not in k and " " not in k and "*" not in k]
        result.missing = [k for k in result.missing if not run.series(k)[0]]
        if plotted:
            kept = [p for p in panels if p.series]
            if spec.x_label is None:
                figure = build_figure(f"{run.name}: {spec.title}", kept, resume_steps)
            else:
                figure = build_figure(f"{run.name}: {spec.title}", kept, [], x_label=spec.x_label)
            figure.savefig(out_dir / spec.filename, dpi=DPI, format="png")
            logger.info("wrote %s", out_dir / spec.filename)
            result.written = True
        results.append(result)
    return results
