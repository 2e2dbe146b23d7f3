"""``r1-ascend report``: Markdown report and PNG curves from verl logs, or a baseline/candidate regression check.

Exit codes: 0 success (comparison: no regression); 1 comparison found a regression; 2 usage error, unreadable
input or a comparison metric missing from a run.
"""

from __future__ import annotations

import argparse
import csv
import logging
import sys
from pathlib import Path

from r1_ascend.patches.rules import expert_load
from r1_ascend.report import metric_names as mn
from r1_ascend.report.compare import (
    DEFAULT_STAGE_FLOOR_S,
    DEFAULT_STAGE_INCREASE,
    DEFAULT_WINDOW,
    EXIT_ERROR,
    EXIT_OK,
    STAGE_NAMES,
    Thresholds,
    compare_runs,
    exit_code,
)
from r1_ascend.report.evaluation import EvaluationInputError, find_evaluations
from r1_ascend.report.markdown import comparison_markdown, fmt, render_report, status_line
from r1_ascend.report.run import DEFAULT_SAMPLE_CHARS, DEFAULT_SAMPLES, RunData, RunInputError, load_run
from r1_ascend.report.run_config import RunConfigError
from r1_ascend.report.tensorboard_events import TensorboardUnavailableError
from r1_ascend.report.timing import COLUMNS, DIES_PER_CARD, TimingTable, Window, build_timing_table, parse_window

logger = logging.getLogger(__name__)

_OFF = ("off", "none", "disable")
#: The whole-run limits, by Thresholds field (the option is its name with dashes); defaults come from Thresholds.
_RUN_LIMITS = (
    ("max_throughput_drop", f"largest allowed relative drop of mean {mn.THROUGHPUT_PER_DIE} (0.05 = 5%%)"),
    ("max_step_time_increase", f"largest allowed relative increase of mean {mn.STEP_TIME}"),
    ("max_memory_increase_gb", f"largest allowed increase of peak {mn.MAX_MEMORY_ALLOCATED_GB} in GiB"),
    ("max_reward_diff", f"largest allowed absolute difference of mean {mn.REWARD_MEAN}, either direction"),
    (
        "max_expert_load_increase",
        f"largest allowed relative increase of mean {expert_load.WORST['max_over_mean']} (MoE runs; skipped when "
        "neither run logs it)",
    ),
)


def _threshold(text: str) -> float | None:
    if text.strip().lower() in _OFF:
        return None
    try:
        value = float(text)
    except ValueError:
        msg = f"expected a non-negative number or 'off', got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if value < 0 or value != value:
        msg = f"expected a non-negative number or 'off', got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _stage_limit(text: str) -> tuple[str | None, float | None]:
    """``0.1`` (every stage), ``gen=0.15`` or ``reshard=off``."""
    stage, sep, value = text.rpartition("=")
    if sep and stage not in STAGE_NAMES:
        msg = f"unknown stage {stage!r} in {text!r}: expected one of {', '.join(STAGE_NAMES)} (e.g. gen=0.15)"
        raise argparse.ArgumentTypeError(msg)
    return (stage or None), _threshold(value)


def _window(text: str) -> Window:
    try:
        return parse_window(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        msg = f"expected a positive integer, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def build_parser() -> argparse.ArgumentParser:
    defaults = Thresholds()
    parser = argparse.ArgumentParser(
        prog="r1-ascend report",
        description=(
            "Build a Markdown report (timing table, curves, sample answers) from verl console logs, TensorBoard "
            "files and generation dumps; or compare a candidate run against a baseline and fail on a regression."
        ),
        epilog="Exit codes: 0 ok, 1 regression found (comparison), 2 usage error or missing data.",
    )
    parser.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="RUN_DIR_OR_LOG",
        help="job log file(s) and/or run directories of ONE run, oldest first (a resumed run may span several logs)",
    )
    parser.add_argument("--out", type=Path, help="output directory (default: <first path's directory>/report)")
    parser.add_argument(
        "--window",
        type=_window,
        help=f"steps to average, FIRST:LAST inclusive (report default: all; comparison default: {DEFAULT_WINDOW})",
    )
    parser.add_argument("--name", help="run name shown in the report (default: the first path's name)")
    parser.add_argument(
        "--config",
        type=Path,
        action="append",
        metavar="YAML",
        help="the run's composed config, for trainer.total_training_steps when the log lacks verl's "
        "'Total training steps' line (default: .hydra/config.yaml files inside the run directory)",
    )
    dies = f"NPU dies per card for per-card throughput (default {DIES_PER_CARD}, Atlas A3)"
    parser.add_argument("--dies-per-card", type=_positive_int, default=DIES_PER_CARD, help=dies)
    samples = f"sample generations to show per dump (default {DEFAULT_SAMPLES})"
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help=samples)
    chars = f"characters kept per prompt/response (default {DEFAULT_SAMPLE_CHARS})"
    parser.add_argument("--sample-chars", type=_positive_int, default=DEFAULT_SAMPLE_CHARS, help=chars)
    parser.add_argument(
        "--evaluation",
        type=Path,
        action="append",
        metavar="FILE",
        help="an r1-ascend evaluate result (evaluation.json) to show beside the curves (repeatable; default: every "
        "evaluation.json inside the run directories)",
    )
    parser.add_argument("--no-figures", action="store_true", help="skip the PNG curves")
    parser.add_argument(
        "--no-dumps", action="store_true", help="do not read generation JSONL dumps (they can be large)"
    )
    compare = parser.add_argument_group("comparison (CI regression check)")
    compare.add_argument("--baseline", nargs="+", type=Path, metavar="PATH", help="baseline run (logs or directory)")
    compare.add_argument("--candidate", nargs="+", type=Path, metavar="PATH", help="candidate run (logs or directory)")
    for name, what in _RUN_LIMITS:
        default = getattr(defaults, name)
        compare.add_argument(
            f"--{name.replace('_', '-')}",
            type=_threshold,
            default=default,
            help=f"{what} (default {default:g}; 'off' disables)",
        )
    compare.add_argument(
        "--max-stage-increase",
        type=_stage_limit,
        action="append",
        default=[],
        metavar="[STAGE=]LIMIT",
        help=f"largest allowed relative increase of a stage's mean time, for every stage (e.g. 0.1) or one "
        f"(gen=0.15, reshard=off); stages: {', '.join(STAGE_NAMES)} (default {DEFAULT_STAGE_INCREASE:g} each)",
    )
    compare.add_argument(
        "--stage-noise-floor-s",
        type=_threshold,
        default=DEFAULT_STAGE_FLOOR_S,
        help=f"a stage regresses only if its mean time also grows by more than this many seconds "
        f"(default {DEFAULT_STAGE_FLOOR_S:g})",
    )
    return parser


def _stage_limits(pairs: list[tuple[str | None, float | None]]) -> dict[str, float | None]:
    limits: dict[str, float | None] = dict.fromkeys(STAGE_NAMES, DEFAULT_STAGE_INCREASE)
    for stage, value in pairs:  # in the order given: "0.2" then "gen=off" switches only gen off
        for name in STAGE_NAMES if stage is None else (stage,):
            limits[name] = value
    return limits


def main(argv: list[str]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors and 0 on --help
        return int(exc.code or 0)
    comparing = args.baseline is not None or args.candidate is not None
    try:
        if comparing:
            return _run_comparison(parser, args)
        if not args.paths:
            parser.print_usage(sys.stderr)
            print(
                "r1-ascend report: error: give a run directory or log, or --baseline and --candidate", file=sys.stderr
            )
            return EXIT_ERROR
        return _run_report(args)
    except (RunInputError, RunConfigError, TensorboardUnavailableError, EvaluationInputError, OSError) as exc:
        print(f"r1-ascend report: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _load(paths: list[Path], args: argparse.Namespace, name: str | None = None) -> RunData:
    return load_run(
        paths,
        name=name,
        samples_wanted=max(args.samples, 0),
        sample_chars=args.sample_chars,
        read_dumps=not args.no_dumps,
        config_paths=args.config,
    )


def _run_report(args: argparse.Namespace) -> int:
    from r1_ascend.report.figures import write_figures

    run = _load(args.paths, args, args.name)
    evaluations = find_evaluations(args.paths, args.evaluation)
    first = args.paths[0]
    out_dir: Path = args.out or ((first if first.is_dir() else first.parent) / "report")
    out_dir.mkdir(parents=True, exist_ok=True)
    window = args.window or Window()
    table = build_timing_table(run, window, args.dies_per_card)
    figures = [] if args.no_figures else write_figures(run, out_dir, args.dies_per_card)
    report_path = out_dir / "report.md"
    text = render_report(run, table, figures, args.dies_per_card, out_dir, evaluations)
    report_path.write_text(text, encoding="utf-8")
    _write_csv(table, out_dir / "timing.csv")
    print(f"wrote {report_path}")
    print(f"wrote {out_dir / 'timing.csv'}")
    for figure in figures:
        if figure.written:
            print(f"wrote {out_dir / figure.filename}")
    _print_summary(table)
    for item in evaluations:
        print(f"evaluation: {item.path}" + ("" if item.doc is not None else f" skipped: {item.problem}"))
    print(status_line(run).replace("**", ""))
    if run.problems:
        print(f"note: {len(run.problems)} unreadable log fragment(s) skipped; listed in {report_path}")
    return EXIT_OK


def _write_csv(table: TimingTable, path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["step", *(c.key for c in COLUMNS)])
        for step, row in table.rows.items():
            writer.writerow([step, *("" if row[c.key] is None else repr(row[c.key]) for c in COLUMNS)])


def _print_summary(table: TimingTable) -> None:
    if not table.window_steps:
        print(f"no training steps in window {table.window.describe()}")
        return
    cells = ", ".join(f"{c.header} {fmt(table.means[c.key].value, c.digits)}" for c in COLUMNS)
    print(f"mean over steps {table.window_steps[0]}–{table.window_steps[-1]}: {cells}")


def _run_comparison(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.baseline is None or args.candidate is None or args.paths:
        parser.print_usage(sys.stderr)
        print(
            "r1-ascend report: error: comparison needs both --baseline and --candidate and no positional paths",
            file=sys.stderr,
        )
        return EXIT_ERROR
    window = args.window or parse_window(DEFAULT_WINDOW)
    thresholds = Thresholds(
        args.max_throughput_drop,
        args.max_step_time_increase,
        args.max_memory_increase_gb,
        args.max_reward_diff,
        _stage_limits(args.max_stage_increase),
        args.stage_noise_floor_s or 0.0,
        max_expert_load_increase=args.max_expert_load_increase,
    )
    baseline = _load(args.baseline, args, "baseline")
    candidate = _load(args.candidate, args, "candidate")
    results = compare_runs(baseline, candidate, window, thresholds)
    names = (_label(args.baseline), _label(args.candidate))
    text = comparison_markdown(results, names[0], names[1], window.describe())
    print(text, end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "comparison.md").write_text(text, encoding="utf-8")
    code = exit_code(results)
    if not results:
        print("r1-ascend report: error: every check is switched off", file=sys.stderr)
    print({0: "PASS", 1: "FAIL: regression", 2: "ERROR: missing data"}[code])
    return code


def _label(paths: list[Path]) -> str:
    return ", ".join(str(p) for p in paths)
