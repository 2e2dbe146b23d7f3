"""Curves: overlong responses, rollout–actor consistency, validation, and the legibility rules of every figure."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.colors import to_hex

from r1_ascend.patches.rules import rollout_guard as guard
from r1_ascend.report.cli import main
from r1_ascend.report.figure_style import REFERENCE_COLOR, RESUME_COLOR, build_figure, colours
from r1_ascend.report.figures import FIGURES
from r1_ascend.report.run import load_run

from .conftest import GUARD_BASELINE, GUARD_STOP, GUARD_WARN, VAL_SAMPLES, VAL_SOURCES, RunWriter


def _drift(step: int) -> float:
    return 0.05 if step < 8 else 0.9  # the rollout decodes from stale weights from step 8 on


def _experts(step: int) -> dict[int, list[float]]:
    """Three MoE layers of 8 experts: layer 3 grows a hot expert from step 6 on, layer 5 loses one at step 10."""
    hot = 40.0 * max(0, step - 5)
    return {
        3: [100.0 + hot] + [100.0] * 7,
        4: [90.0, 110.0] * 4,
        5: [100.0] * 7 + [0.0 if step == 10 else 100.0],
    }


@pytest.fixture(scope="module")
def rich_run(verl_modules, tmp_path_factory):
    writer = RunWriter(verl_modules, tmp_path_factory.mktemp("figures") / "rich", seed=31)
    writer.segment(
        range(1, 9), log_name="part1.log", planned=12, death="kill", log_prob_drift=_drift, expert_tokens=_experts
    )
    writer.segment(
        range(6, 13),
        log_name="part2.log",
        planned=12,
        resumed_from=5,
        val_before_train_step=5,
        log_prob_drift=_drift,
        expert_tokens=_experts,
    )
    return writer.run


def _lines_by_axes(figure) -> list[list]:
    return [[line for line in axes.get_lines()] for axes in figure.axes]


@pytest.mark.parametrize("spec", FIGURES, ids=[spec.filename for spec in FIGURES])
def test_every_figure_is_legible(rich_run, spec) -> None:
    run = load_run(rich_run.log_files)
    panels = [p for p in spec.build(run, 2) if p.series]
    if not panels:
        pytest.skip(f"{spec.filename}: no data in this fixture")
    figure = build_figure(spec.title, panels, sorted({p.restart_step for p in run.resume_points}))
    figure.canvas.draw()
    data_colours = []
    for axes, lines in zip(figure.axes, _lines_by_axes(figure), strict=True):
        levels = [
            line for line in lines if line.get_label().startswith(("warn level", "stop level", "calibrated baseline"))
        ]
        data = [
            line
            for line in lines
            if line not in levels and to_hex(line.get_color()) not in (RESUME_COLOR, REFERENCE_COLOR)
        ]
        data_colours += [to_hex(line.get_color()) for line in data]
        # a logged level is drawn in the colour of the series it applies to, thin, warn dotted, stop dashed and the
        # calibrated baseline dash-dotted
        by_label = {line.get_label(): to_hex(line.get_color()) for line in data}
        styles_of = {"warn": ":", "stop": "--", "calibrated": "-."}
        for line in levels:
            of = line.get_label().split(" (", 1)[1][:-1]
            assert to_hex(line.get_color()) == by_label.get(of, REFERENCE_COLOR), line.get_label()
            assert line.get_linestyle() == styles_of[line.get_label().split()[0]], line.get_label()
        # the legend is outside the plotted area: its box does not overlap the axes' box
        legend_box = axes.get_legend().get_window_extent()
        axes_box = axes.get_window_extent()
        assert legend_box.x0 >= axes_box.x1, spec.filename
        # a series that equals another is drawn differently and says so in the legend
        styles = [(line.get_linestyle(), line.get_linewidth()) for line in data]
        for index, line in enumerate(data):
            if "(identical to " in line.get_label():
                twin = line.get_label().split(" (identical to ", 1)[1][:-1]
                original = next(other for other in data if other.get_label() == twin)
                assert styles[index] != styles[data.index(original)]
    assert len(data_colours) == len(set(data_colours)), f"{spec.filename} reuses a colour: {data_colours}"


def test_identical_reward_and_score_are_both_visible(rich_run) -> None:
    run = load_run(rich_run.log_files)
    panels = next(spec for spec in FIGURES if spec.filename == "reward.png").build(run, 2)
    figure = build_figure("reward", panels, [])
    labels = [line.get_label() for line in figure.axes[0].get_lines()]
    # GRPO without a KL penalty in the reward: verl's score and reward curves coincide
    assert "critic/score/mean (identical to critic/rewards/mean)" in labels


def test_colours_stay_distinct_beyond_the_palette() -> None:
    for count in (1, 9, 16, 17, 40):
        assert len(set(colours(count))) == count
        assert RESUME_COLOR not in colours(count)


def test_report_plots_clip_ratio_consistency_and_validation(rich_run, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main([*map(str, rich_run.log_files), "--out", str(out)]) == 0
    report = (out / "report.md").read_text(encoding="utf-8")
    for name in ("response_length", "rollout_consistency", "validation"):
        assert (out / f"{name}.png").stat().st_size > 10_000, name

    run = load_run(rich_run.log_files)
    length = next(spec for spec in FIGURES if spec.filename == "response_length.png").build(run, 2)
    assert "response_length/clip_ratio" in length[1].series
    steps, values = length[1].series["response_length/clip_ratio"]
    # the clip ratio is the share of responses at max length, as the fixture drew them (RESPONSE_WIDTH = 32)
    for step, value in zip(steps, values, strict=True):
        lengths = rich_run.truth[step].response_lengths
        assert value == pytest.approx(sum(n == 32 for n in lengths) / len(lengths))

    consistency = next(spec for spec in FIGURES if spec.filename == "rollout_consistency.png").build(run, 2)
    diffs, largest, kl, tail, verl_diff, pearson = consistency
    assert set(diffs.series) == {"rollout_guard/log_prob_abs_diff_mean", "rollout_guard/seq_abs_diff_median"}
    assert set(largest.series) == {"rollout_guard/seq_abs_diff_max", "rollout_guard/log_prob_abs_diff_max"}
    assert diffs.log_scale
    assert largest.log_scale
    assert kl.log_scale
    assert verl_diff.log_scale
    assert not tail.log_scale
    # levels are reference lines, never data; counts and flags are not plotted at all
    plotted = {label for panel in consistency for label in panel.series}
    assert not any(k.startswith(("rollout_guard/warn/", "rollout_guard/stop/")) for k in plotted)
    assert not plotted & {"rollout_guard/tokens", "rollout_guard/sequences", "rollout_guard/warned"}
    mean_levels = {ref.style: set(ref.values) for ref in diffs.references if ref.of == guard.METRIC_MEAN}
    assert mean_levels == {"warn": {GUARD_WARN}, "stop": {GUARD_STOP}, "baseline": {GUARD_BASELINE}}
    median = guard.METRIC_NAMES["seq_abs_diff_median"]
    assert {ref.style for ref in diffs.references if ref.of == median} == {"warn", "stop", "baseline"}
    assert {ref.style for ref in kl.references} == {"warn", "stop", "baseline"}
    assert list(kl.series) == ["rollout_guard/kl_k3"]
    assert set(verl_diff.series) == {
        "training/rollout_probs_diff_max",
        "training/rollout_probs_diff_mean",
        "training/rollout_probs_diff_std",
    }
    assert list(pearson.series) == ["training/rollout_actor_probs_pearson_corr"]
    # the table names the steps where the mean passed its warn and stop levels (stale weights from step 8 on)
    line = next(row for row in report.splitlines() if row.startswith("| `rollout_guard/log_prob_abs_diff_mean`"))
    means = {s: run.steps[s]["rollout_guard/log_prob_abs_diff_mean"] for s in range(1, 13)}
    over_warn = [s for s, v in means.items() if v > GUARD_WARN]
    over_stop = [s for s, v in means.items() if v > GUARD_STOP]
    assert over_warn == list(range(8, 13))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3:6] == [f"{GUARD_BASELINE:.4g}", f"{GUARD_WARN:g}", f"{GUARD_STOP:g}"]
    assert cells[6] == "steps " + ", ".join(map(str, over_warn))
    assert cells[7] == ("steps " + ", ".join(map(str, over_stop)) if over_stop else "none")
    # a count is not a difference: no level applies to it and it is not listed as a statistic
    assert not any(row.startswith("| `rollout_guard/tokens`") for row in report.splitlines())

    # validation: mean accuracy over the samples of each set, per validation step
    assert f"| step | {VAL_SOURCES[0]} acc mean@{VAL_SAMPLES} | {VAL_SOURCES[1]} acc mean@{VAL_SAMPLES} |" in report
    val_steps = sorted(s for s, t in rich_run.truth.items() if t.val_acc)
    assert val_steps == [5, 10]
    for step in val_steps:
        cells = " | ".join(f"{rich_run.truth[step].val_acc[source]:.4f}" for source in VAL_SOURCES)
        assert f"| {step} | {cells} |" in report


def test_expert_load_is_drawn_per_step_and_per_layer(rich_run) -> None:
    """The worst layer per step, and each MoE layer on its own x position with its last and worst value."""
    from r1_ascend.patches.rules import expert_load
    from r1_ascend.report.figures import FIGURES as specs

    run = load_run(rich_run.log_files)
    by_name = {spec.filename: spec for spec in specs}
    over_steps = by_name["expert_load.png"].build(run, 2)
    steps, values = over_steps[0].series[expert_load.WORST["max_over_mean"]]
    assert steps == list(range(1, 13))
    assert values[-1] == pytest.approx((100 + 40 * 7) * 8 / (800 + 40 * 7))
    assert over_steps[1].series[expert_load.WORST["experts_without_tokens"]][1][9] == 1.0  # step 10
    assert set(over_steps[3].series[expert_load.WORST_LAYER][1]) <= {3.0, 4.0, 5.0}
    per_layer = by_name["expert_load_by_layer.png"].build(run, 2)
    layers, last = per_layer[0].series["step 12"]
    assert layers == [3, 4, 5]
    assert last[0] == pytest.approx(values[-1])
    assert per_layer[0].series["worst step of the run"][1][0] == pytest.approx(values[-1])
