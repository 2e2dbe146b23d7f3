"""Drawing rules that keep the report's curves legible.

- One colour per series in a whole figure (all panels together), never grey (grey marks resume points) nor black
  (black marks a logged level that belongs to no drawn series). A logged level is a thin step line in the colour of
  the series it applies to: warn dotted, stop dashed, the calibrated baseline they were set from dash-dotted.
- Steps are integers on the x-axis; differences that span decades are drawn on a log axis.
- The legend sits to the right of each panel, outside the plotted area, so it never covers data.
- A series identical to one already drawn in the same panel (e.g. ``critic/score/mean`` and ``critic/rewards/mean``
  when the KL penalty is not in the reward, as in GRPO) is drawn dashed with hollow markers on top of a wider line,
  and its legend entry says which series it equals.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from r1_ascend.report.panels import Panel

FIGURE_WIDTH_PX = 1200
FIGURE_HEIGHT_PX = 700
DPI = 100
RESUME_COLOR = "#7f7f7f"
REFERENCE_COLOR = "#000000"
#: Line styles of logged levels.
REFERENCE_STYLES = {"warn": ":", "stop": "--", "baseline": "-."}
# matplotlib's tab10 without its grey, then Dark2 and Set1 tones that differ from them.
_PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
    "#1b9e77",
    "#7570b3",
    "#e6ab02",
    "#a6761d",
    "#66a61e",
    "#f781bf",
    "#4daf4a",
)


def colours(count: int) -> list[str]:
    """``count`` distinct colours; beyond the palette, evenly spaced hues of the turbo map (all distinct)."""
    if count <= len(_PALETTE):
        return list(_PALETTE[:count])
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    cmap = colormaps["turbo"]
    return [to_hex(cmap(0.05 + 0.9 * i / (count - 1))) for i in range(count)]


def identical_to(series: dict[str, tuple[list[int], list[float]]]) -> dict[str, str]:
    """For each series equal (same steps, values within 1e-12 relative) to an earlier one: the earlier one's name."""
    names = list(series)
    found: dict[str, str] = {}
    for index, name in enumerate(names):
        steps, values = series[name]
        for earlier in names[:index]:
            if earlier in found:
                continue
            other_steps, other_values = series[earlier]
            if steps == other_steps and all(
                math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0) for a, b in zip(values, other_values, strict=True)
            ):
                found[name] = earlier
                break
    return found


def build_figure(title: str, panels: list[Panel], resume_steps: list[int], x_label: str = "training step") -> Figure:
    """A figure of stacked panels sharing the x axis (training steps, or ``x_label``: another integer axis such as
    the layer, where no resume line is drawn); see the module docstring for the rules."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(FIGURE_WIDTH_PX / DPI, FIGURE_HEIGHT_PX / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes_list = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    palette = iter(colours(sum(len(p.series) for p in panels)))
    for axes, panel in zip(axes_list, panels, strict=True):
        duplicates = identical_to(panel.series)
        drawn: dict[str, str] = {}
        for label, (steps, values) in panel.series.items():
            colour = next(palette)
            drawn[label] = colour
            marker = "." if len(steps) < 60 else None
            if label in duplicates:
                axes.plot(
                    steps,
                    values,
                    color=colour,
                    linestyle=(0, (4, 3)),
                    linewidth=1.6,
                    marker="o" if marker else None,
                    markerfacecolor="none",
                    zorder=3,
                    label=f"{label} (identical to {duplicates[label]})",
                )
            else:
                wide = label in duplicates.values()
                axes.plot(
                    steps,
                    values,
                    color=colour,
                    linewidth=4.0 if wide else 1.5,
                    alpha=0.55 if wide else 1.0,
                    marker=marker,
                    zorder=2,
                    label=label,
                )
        for ref in panel.references:
            colour = drawn.get(ref.of, REFERENCE_COLOR) if ref.of else REFERENCE_COLOR
            label = f"{ref.label} ({ref.of})" if ref.of else ref.label
            axes.plot(
                ref.steps,
                ref.values,
                color=colour,
                linestyle=REFERENCE_STYLES[ref.style],
                linewidth=1.0,
                drawstyle="steps-post",
                label=label,
            )
        if panel.log_scale:
            axes.set_yscale("log", nonpositive="mask")  # a zero difference has no place on it; it is not drawn
        for index, step in enumerate(resume_steps):
            axes.axvline(
                step, color=RESUME_COLOR, linestyle="--", linewidth=0.8, label="resume" if index == 0 else None
            )
        axes.set_ylabel(panel.ylabel)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    axes_list[-1].set_xlabel(x_label)
    axes_list[-1].xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are integers
    figure.suptitle(title)
    return figure
