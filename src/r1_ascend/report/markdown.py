"""Markdown rendering of the run report and of a comparison."""

from __future__ import annotations

import math
import os
from pathlib import Path

from r1_ascend.patches.rules import expert_load
from r1_ascend.patches.rules import rollout_guard as guard
from r1_ascend.report import metric_names as mn
from r1_ascend.report.attempts import COMPLETED, DIED, Attempt
from r1_ascend.report.compare import CheckResult, regressed_stages
from r1_ascend.report.evaluation import EvaluationFile, evaluation_section
from r1_ascend.report.figures import FigureResult, guard_level_series, layer_series
from r1_ascend.report.run import RunData, problems_summary
from r1_ascend.report.timing import COLUMNS, RESHARD_DERIVED, RESHARD_FROM_TIMER, TimingTable

NOT_LOGGED = "n/a"


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return NOT_LOGGED
    if math.isnan(value):
        return "nan"
    return f"{value:.{digits}f}"


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def timing_table_markdown(table: TimingTable) -> str:
    header = "| step | " + " | ".join(c.header for c in COLUMNS) + " |"
    rule = "|---:|" + "---:|" * len(COLUMNS)
    lines = [header, rule]
    for step, row in table.rows.items():
        mark = "" if table.window.contains(step) else " (outside window)"
        cells = " | ".join(fmt(row[c.key], c.digits) for c in COLUMNS)
        lines.append(f"| {step}{mark} | {cells} |")
    first, last = (table.window_steps[0], table.window_steps[-1]) if table.window_steps else (None, None)
    label = f"**mean {first}–{last}**" if table.window_steps else "**mean (no steps in window)**"
    means = " | ".join(_mean_cell(table, c.key, c.digits) for c in COLUMNS)
    lines.append(f"| {label} | {means} |")
    return "\n".join(lines)


def _mean_cell(table: TimingTable, key: str, digits: int) -> str:
    mean = table.means[key]
    text = f"**{fmt(mean.value, digits)}**"
    if mean.value is not None and mean.count < len(table.window_steps):
        text += f" (n={mean.count}/{len(table.window_steps)})"
    return text


def _reshard_note(table: TimingTable) -> str:
    timer = table.reshard_sources.get(RESHARD_FROM_TIMER, 0)
    derived = table.reshard_sources.get(RESHARD_DERIVED, 0)
    parts = []
    if timer:
        parts.append(f"{timer} step(s) from the dedicated timer `{mn.RESHARD_TIME}`")
    if derived:
        parts.append(
            f"{derived} step(s) derived as `{mn.GEN_TIME}` − `{mn.GENERATE_SEQUENCES_TIME}` (weight sync, "
            "rollout onload/offload and dispatch around generation; stock verl 0.6.1 has no reshard timer)"
        )
    if not parts:
        return f"Reshard: {NOT_LOGGED} (not logged: neither `{mn.RESHARD_TIME}` nor both `{mn.GEN_TIME}` and " + (
            f"`{mn.GENERATE_SEQUENCES_TIME}` were found)."
        )
    return "Reshard: " + "; ".join(parts) + "."


def render_report(
    run: RunData,
    table: TimingTable,
    figures: list[FigureResult],
    dies_per_card: int,
    base_dir: Path,
    evaluations: list[EvaluationFile] | None = None,
) -> str:
    out = [f"# Run report: {run.name}", ""]
    out += _sources_section(run, base_dir)
    training = run.training_steps()
    if training:
        out.append(f"Training steps logged: {len(training)} (steps {training[0]}–{training[-1]}).")
    else:
        out.append("Training steps logged: none (only validation lines were found).")
    chosen = table.window.describe()
    if table.window_steps:
        actual = f"{min(table.window_steps)}–{max(table.window_steps)}"
        chosen = actual if chosen == actual else f"{chosen}, i.e. {actual}"
    out.append(f"Averaging window: steps {chosen} (inclusive); {len(table.window_steps)} step(s).")
    out.append("")
    out += status_section(run)
    out += _resume_section(run)
    out += ["## Timing per step", ""]
    out.append(
        f"Throughput per A3 card = {dies_per_card} × `{mn.THROUGHPUT_PER_DIE}` (verl divides tokens by step time and "
        "by the number of devices; one device is one NPU die). "
        f"`{NOT_LOGGED}` = the metric is absent from the logs."
    )
    out += ["", timing_table_markdown(table), "", _reshard_note(table), ""]
    if table.missing:
        out.append("Missing timing metrics:")
        for column in COLUMNS:
            steps = table.missing.get(column.key)
            if steps:
                out.append(f"- {column.header} (`{column.source}`): {_step_list(steps)}")
        out.append("")
    out += _validation_section(run)
    out += evaluation_section(evaluations or [], base_dir)
    out += _consistency_section(run)
    out += _expert_load_section(run)
    out += _figures_section(figures)
    out += _samples_section(run)
    if run.problems:
        out += [
            f"## Log problems ({len(run.problems)})",
            "",
            "Lines or values that could not be read were skipped:",
            "",
        ]
        out += [f"- {_escape(p)}" for p in problems_summary(run.problems)]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _rel(path: Path, base_dir: Path) -> str:
    try:
        return os.path.relpath(path.resolve(), base_dir.resolve())
    except ValueError:  # another drive on Windows
        return str(path)


def _sources_section(run: RunData, base_dir: Path) -> list[str]:
    lines = []
    if run.console_files:
        lines.append("Console logs: " + ", ".join(f"`{_rel(p, base_dir)}`" for p in run.console_files))
    if run.event_files:
        lines.append("TensorBoard files: " + ", ".join(f"`{_rel(p, base_dir)}`" for p in run.event_files))
        if run.filled_from_tensorboard:
            lines.append(
                f"({run.filled_from_tensorboard} value(s) taken from TensorBoard where the console lacked them)"
            )
    if run.dump_dirs:
        lines.append("Generation dumps: " + ", ".join(f"`{_rel(p, base_dir)}`" for p in run.dump_dirs))
    return [*lines, ""] if lines else []


def _resume_section(run: RunData) -> list[str]:
    if not run.resume_points:
        return ["Resume points: none (one continuous run).", ""]
    lines = ["## Resume points", "", "Later values replace earlier ones for the same step and metric.", ""]
    for point in run.resume_points:
        where = point.source if point.line_no is None else f"{point.source}:{point.line_no}"
        rerun = ""
        if 0 <= point.restart_step < point.previous_max:
            rerun = f"; steps {point.restart_step + 1}–{point.previous_max} were run again"
        lines.append(f"- restart at step {point.restart_step}: {point.reason}{rerun} ({_escape(where)})")
    if run.overwritten_values:
        lines.append(f"- {run.overwritten_values} value(s) were replaced by a later log line of the same step")
    return [*lines, ""]


def status_line(run: RunData) -> str:
    """One sentence on how the run (its last attempt) ended."""
    if not run.attempts:
        return "Status: no training step was logged."
    last = run.attempts[-1]
    planned = last.planned.total if last.planned else None
    if last.outcome == COMPLETED:
        return f"Status: completed: reached the planned last step {planned}."
    if last.outcome == DIED:
        done = "no step completed" if last.last_step is None else f"last completed step {last.last_step}"
        of = f"planned last step {planned}" if planned is not None else "planned last step unknown"
        return f"Status: **DIED during step {last.died_during}** ({done}; {of}). {_error_text(last)}"
    ended = "no training step was logged" if last.last_step is None else f"ended after step {last.last_step}"
    return (
        f"Status: {ended} with no error in the log; the planned last step is unknown "
        "(no 'Total training steps' line in the log and no config with `trainer.total_training_steps`; "
        "pass `--config`)."
    )


def _error_text(attempt: Attempt) -> str:
    if attempt.error is None:
        after = "the start" if attempt.last_step is None else f"step {attempt.last_step}"
        return (
            f"No error line after {after}: the process was stopped from outside (SIGKILL, the OOM killer, a lost "
            "node, a job time limit) or the log is still being written."
        )
    text = f"Error: `{_escape(_clip(attempt.error.text))}` ({_escape(attempt.error.where)})"
    if attempt.error_wrapper is not None:
        text += f", reported as `{_escape(_clip(attempt.error_wrapper.text))}`"
    return text + "."


def _clip(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def status_section(run: RunData) -> list[str]:
    lines = ["## Run status", ""]
    planned = run.attempts[-1].planned if run.attempts else None
    if planned is not None:
        lines.append(f"Planned last step: {planned.total}, from {_escape(planned.origin)}.")
    lines += [status_line(run), ""]
    if len(run.attempts) > 1 or any(a.outcome == DIED for a in run.attempts):
        lines += [
            "| attempt | started | resumed from | steps logged | ended | error line |",
            "|---:|---|---:|---|---|---|",
        ]
        for attempt in run.attempts:
            steps = NOT_LOGGED if attempt.last_step is None else f"{attempt.first_step}–{attempt.last_step}"
            resumed = "" if attempt.resumed_from is None else str(attempt.resumed_from)
            ended = f"died during step {attempt.died_during}" if attempt.outcome == DIED else attempt.outcome
            error = ""
            if attempt.error is not None:
                error = f"`{_escape(_clip(attempt.error.text, 160))}` ({_escape(attempt.error.where)})"
            started = f"{attempt.start} ({_escape(attempt.source)}:{attempt.line_no})"
            lines.append(f"| {attempt.index} | {started} | {resumed} | {steps} | {ended} | {error} |")
        lines.append("")
    return lines


def _validation_section(run: RunData) -> list[str]:
    sets: list[tuple[str, str]] = []  # (metric key, column header)
    rows = []
    for key in sorted(run.keys()):
        match = mn.VAL_CORE_MEAN.match(key)
        if not match:
            continue
        steps, values = run.series(key)
        if steps:
            sets.append((key, f"{_escape(match['source'])} {match['var']} mean@{match['n']}"))
            best = max(range(len(values)), key=values.__getitem__)
            rows.append(
                f"| {_escape(match['source'])} | {match['var']} mean@{match['n']} | {match['n']} | "
                f"{fmt(values[0], 4)} (step {steps[0]}) | {fmt(values[-1], 4)} (step {steps[-1]}) | "
                f"{fmt(values[best], 4)} (step {steps[best]}) |"
            )
    if not rows:
        return ["## Validation", "", f"{NOT_LOGGED}: no `val-core/<source>/<var>/mean@N` metrics were logged.", ""]
    lines = [
        "## Validation",
        "",
        "Mean accuracy over the N samples drawn per problem (`actor_rollout_ref.rollout.val_kwargs.n`), averaged "
        "over the set's problems (verl's `val-core/<set>/<var>/mean@N`).",
        "",
        "| set | metric | samples per problem | first | last | best |",
        "|---|---|---:|---:|---:|---:|",
        *rows,
        "",
        "Per validation step:",
        "",
        "| step | " + " | ".join(header for _, header in sets) + " |",
        "|---:|" + "---:|" * len(sets),
    ]
    val_steps = sorted({s for key, _ in sets for s in run.series(key)[0]})
    for step in val_steps:
        cells = " | ".join(fmt(run.steps[step].get(key), 4) for key, _ in sets)
        lines.append(f"| {step} | {cells} |")
    return [*lines, ""]


def _consistency_section(run: RunData) -> list[str]:
    """The guard's difference statistics against the levels logged with them, then verl's own comparison metrics.

    Levels apply to the gated difference statistics only; counts and flags are never "above" anything."""
    guard_keys = [k for k in guard.METRIC_NAMES.values() if run.series(k)[0]]
    verl_prefixes = (mn.ROLLOUT_PROBS_DIFF_PREFIX, mn.ROLLOUT_ACTOR_PEARSON)
    verl_keys = [
        k
        for k in sorted(run.keys())
        if k.startswith(verl_prefixes) and k != mn.ROLLOUT_PROBS_DIFF_VALID and run.series(k)[0]
    ]
    if not guard_keys and not verl_keys:
        return []
    lines = ["## Rollout–actor consistency", ""]
    if guard_keys:
        lines += [
            "The guard warns above a statistic's warn level and stops the run above its stop level; after its first "
            "steps it calibrates both from the run's own baseline, the largest value over those steps (capped by "
            "the configured levels; docs/rollout_guard.md). Levels and baseline: the last logged.",
            "",
            "| statistic | last | max (step) | baseline | warn | stop | steps above warn | steps above stop |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for key in guard_keys:
            steps, values = run.series(key)
            top = max(range(len(values)), key=lambda i: -math.inf if math.isnan(values[i]) else values[i])
            # every logged value, NaN included (series() keeps the finite ones): a NaN statistic is never healthy
            logged = {s: m[key] for s, m in sorted(run.steps.items()) if key in m}
            cells = []
            for what in ("warn", "stop"):
                levels = dict(zip(*guard_level_series(run, key, what), strict=True))
                above = [s for s, v in logged.items() if s in levels and not v <= levels[s]]
                cells.append((f"{levels[max(levels)]:g}" if levels else "–", _step_list(above) or "none"))
            (warn, over_warn), (stop, over_stop) = cells
            if warn == "–":
                over_warn = "–"
            if stop == "–":
                over_stop = "–"
            _, baselines = guard_level_series(run, key, "baseline")
            baseline = f"{baselines[-1]:.4g}" if baselines else "–"
            lines.append(
                f"| `{key}` | {values[-1]:.4g} | {values[top]:.4g} ({steps[top]}) | {baseline} | {warn} | {stop} | "
                f"{over_warn} | {over_stop} |"
            )
        lines.append("")
    if verl_keys:
        lines += [
            "verl's own comparison (logged, never acted on):",
            "",
            "| metric | last | max (step) |",
            "|---|---:|---:|",
        ]
        for key in verl_keys:
            steps, values = run.series(key)
            top = max(range(len(values)), key=values.__getitem__)
            lines.append(f"| `{key}` | {values[-1]:.4g} | {values[top]:.4g} ({steps[top]}) |")
        lines.append("")
    return lines


def _expert_load_section(run: RunData) -> list[str]:
    """Per MoE layer (patch verl_moe_expert_load): its load at the last step and its worst step of the run."""
    by_statistic = {name: layer_series(run, name) for name in expert_load.LAYER_STATISTICS}
    layers = sorted(set().union(*(series.keys() for series in by_statistic.values())))
    if not layers:
        return []
    lines = [
        "## Expert load",
        "",
        "Per MoE layer (numbered as in the checkpoint): the busiest expert's tokens over the mean (1 is perfect "
        "balance), experts that received no token, and the busiest expert-parallel rank's share of the routed "
        "tokens (balanced: 1 / EP); docs/report.md says what a healthy run shows.",
        "",
        "| layer | busiest / mean: last | worst (step) | experts without tokens: last | worst (step) "
        "| busiest EP rank's share: last | worst (step) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for layer in layers:
        cells = []
        for name in expert_load.LAYER_STATISTICS:
            steps, values = by_statistic[name].get(layer, ([], []))
            if not steps:
                cells += [NOT_LOGGED, NOT_LOGGED]
                continue
            top = max(range(len(values)), key=lambda i: math.inf if math.isnan(values[i]) else values[i])
            cells += [f"{values[-1]:.3g}", f"{values[top]:.3g} ({steps[top]})"]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def _figures_section(figures: list[FigureResult]) -> list[str]:
    if not figures:  # --no-figures
        return []
    lines = ["## Curves", ""]
    for figure in figures:
        if figure.written:
            lines.append(f"### {figure.title}")
            lines.append("")
            lines.append(f"![{figure.title}]({figure.filename})")
            if figure.missing:
                lines.append("")
                lines.append("Not logged: " + ", ".join(f"`{k}`" for k in figure.missing))
            lines.append("")
        else:
            lines.append(f"### {figure.title}")
            lines.append("")
            lines.append(f"{NOT_LOGGED}: none of the needed metrics were logged.")
            lines.append("")
    return lines


def _samples_section(run: RunData) -> list[str]:
    if not run.samples:
        return [
            "## Sample generations",
            "",
            f"{NOT_LOGGED}: the run logged no generations (set `trainer.rollout_data_dir`, "
            "`trainer.validation_data_dir` or `trainer.log_val_generations` with the tensorboard logger).",
            "",
        ]
    lines = ["## Sample generations", ""]
    for index, sample in enumerate(run.samples, start=1):
        score = "" if sample.score is None else f", score {sample.score:g}"
        lines.append(f"### Sample {index} ({_escape(sample.origin)}, step {sample.step}{score})")
        lines.append("")
        if sample.ground_truth is not None:
            lines.append(f"Ground truth: `{sample.ground_truth}`")
            lines.append("")
        if sample.extras:
            lines.append("Reward details: " + ", ".join(f"{k}={v}" for k, v in sample.extras.items()))
            lines.append("")
        lines += ["Prompt:", "", _fenced(sample.prompt), "", "Response:", "", _fenced(sample.response), ""]
    return lines


def _fenced(text: str) -> str:
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}text\n{text}\n{fence}"


def _step_list(steps: list[int]) -> str:
    if not steps:
        return ""
    if len(steps) <= 12:
        return "steps " + ", ".join(str(s) for s in steps)
    return f"{len(steps)} steps ({steps[0]}–{steps[-1]})"


def comparison_markdown(results: list[CheckResult], baseline_name: str, candidate_name: str, window: str) -> str:
    lines = [
        f"Comparison: baseline `{baseline_name}` vs candidate `{candidate_name}`, steps {window} (inclusive)",
        "",
        "| metric | verl key | baseline | candidate | change | threshold | verdict |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in results:
        verdict = r.verdict if not r.note else f"{r.verdict} ({r.note})"
        lines.append(
            f"| {r.metric} | `{r.source}` | {_value_with_n(r.baseline, r.baseline_steps)} | "
            f"{_value_with_n(r.candidate, r.candidate_steps)} | {r.change} | {r.threshold} | {verdict} |"
        )
    stages = regressed_stages(results)
    if stages:
        named = ", ".join(f"{r.metric.split(' time')[0]} ({r.change})" for r in stages)
        lines += ["", f"Regressed stage(s): {named}."]
    return "\n".join(lines) + "\n"


def _value_with_n(value: float | None, count: int) -> str:
    if value is None:
        return NOT_LOGGED
    return f"{value:.4g} (n={count})"
