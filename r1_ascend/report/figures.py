"""Training curves as PNG files of a fixed size (Agg canvas, no display, no global pyplot state)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from r1_ascend.report import metric_names as mn
from r1_ascend.report.run import RunData

logger = logging.getLogger(__name__)

FIGURE_WIDTH_PX = 1200
FIGURE_HEIGHT_PX = 700
_DPI = 100

Series = dict[str, tuple[list[int], list[float]]]


@dataclass
class Panel:
    ylabel: str
    series: Series


@dataclass
class FigureSpec:
    filename: str
    title: str
    wanted: list[str]
    build: Callable[[RunData, int], list[Panel]]


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
    validation: Series = {}
    for key in sorted(run.keys()):
        match = mn.VAL_AUX_MEAN.match(key)
        if match:
            steps, values = run.series(key)
            if steps:
                validation[f"{match['source']}: {match['var']} (mean@{match['n']})"] = (steps, values)
    return [Panel("mean per sample (generation dumps)", train), Panel("validation mean (val-aux)", validation)]


def _validation_panels(run: RunData, _dies: int) -> list[Panel]:
    series: Series = {}
    for key in sorted(run.keys()):
        match = mn.VAL_CORE_MEAN.match(key)
        if match:
            steps, values = run.series(key)
            if steps:
                series[f"{match['source']} {match['var']} (mean@{match['n']})"] = (steps, values)
    return [Panel("validation accuracy", series)]


def _length_panels(run: RunData, _dies: int) -> list[Panel]:
    return [Panel("tokens", _pick(run, [mn.RESPONSE_LENGTH_MEAN, mn.RESPONSE_LENGTH_MAX, mn.PROMPT_LENGTH_MEAN]))]


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
    return [Panel("seconds", _pick(run, keys))]


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
        [mn.RESPONSE_LENGTH_MEAN, mn.RESPONSE_LENGTH_MAX, mn.PROMPT_LENGTH_MEAN],
        _length_panels,
    ),
    FigureSpec("kl_entropy.png", "KL and entropy", [mn.KL_LOSS, mn.PPO_KL, mn.ENTROPY], _kl_entropy_panels),
    FigureSpec("throughput.png", "Throughput", [mn.THROUGHPUT_PER_DIE], _throughput_panels),
    FigureSpec(
        "memory.png", "Peak device memory", [mn.MAX_MEMORY_ALLOCATED_GB, mn.MAX_MEMORY_RESERVED_GB], _memory_panels
    ),
    FigureSpec("stage_times.png", "Stage times", [mn.STEP_TIME, mn.GEN_TIME, mn.UPDATE_ACTOR_TIME], _stage_panels),
)


def write_figures(run: RunData, out_dir: Path, dies_per_card: int = 2) -> list[FigureResult]:
    """Write every figure that has data; the result says which curves were drawn and which metrics were absent."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    resume_steps = sorted({p.restart_step for p in run.resume_points})
    for spec in FIGURES:
        panels = spec.build(run, dies_per_card)
        plotted = [label for panel in panels for label in panel.series]
        result = FigureResult(spec.filename, spec.title, written=False, plotted=plotted)
        # Descriptions such as "val-core/<source>/..." are patterns, not metric names; only names can be "missing".
        result.missing = [k for k in spec.wanted if "<" not in k and " " not in k and not run.series(k)[0]]
        if plotted:
            _render(out_dir / spec.filename, f"{run.name}: {spec.title}", [p for p in panels if p.series], resume_steps)
            result.written = True
        results.append(result)
    return results


def _render(path: Path, title: str, panels: list[Panel], resume_steps: list[int]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(FIGURE_WIDTH_PX / _DPI, FIGURE_HEIGHT_PX / _DPI), dpi=_DPI)
    FigureCanvasAgg(figure)
    axes_list = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for axes, panel in zip(axes_list, panels, strict=True):
        for label, (steps, values) in panel.series.items():
            axes.plot(steps, values, marker="." if len(steps) < 60 else None, label=label)
        for index, step in enumerate(resume_steps):
            axes.axvline(step, color="grey", linestyle="--", linewidth=0.8, label="resume" if index == 0 else None)
        axes.set_ylabel(panel.ylabel)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small", loc="best")
    axes_list[-1].set_xlabel("training step")
    figure.suptitle(title)
    figure.savefig(path, dpi=_DPI, format="png")
    logger.info("wrote %s", path)
