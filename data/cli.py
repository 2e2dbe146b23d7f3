"""``r1-ascend prepare-data``: the command line of the data pipeline (``r1_ascend.data.prepare``).

Training mode reads ``--input`` files and writes train/test parquet; ``--val`` writes the validation sets. The
options map one to one onto ``prepare`` / ``prepare_val``; the only rules here are which options go together.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from r1_ascend.data.prepare import (
    DEFAULT_DATA_SOURCE,
    DEFAULT_SEED,
    DEFAULT_TEST_SIZE,
    DataError,
    prepare,
    prepare_val,
)
from r1_ascend.data.readers import InputFormatError
from r1_ascend.data.template import DEFAULT_PLACEMENT, R1_ZERO_INSTRUCTION, Placement


def parse_test_size(text: str) -> int | float:
    """CLI form: ``"500"`` is a row count, ``"0.05"`` a fraction."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        msg = f"--test-size must be a row count like 500 or a fraction like 0.05, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="r1-ascend prepare-data",
        description=(
            "Convert deepscaler-format JSON (an array of {problem, answer, [solution], ...} objects, or JSON Lines) "
            "to verl parquet with the R1-Zero template. Training mode writes train.parquet, test.parquet (if "
            "--test-size > 0), summary.json, and rejects.jsonl / duplicates.jsonl when rows were dropped. --val "
            "writes the AIME24 / AMC / MATH-500 validation sets, one data_source per set."
        ),
    )
    parser.add_argument("--input", action="append", type=Path, metavar="FILE", help="input file (repeatable)")
    parser.add_argument("--output-dir", required=True, type=Path, metavar="DIR")
    parser.add_argument("--data-source", default=DEFAULT_DATA_SOURCE, help="data_source of training rows (%(default)s)")
    parser.add_argument(
        "--test-size",
        type=parse_test_size,
        default=DEFAULT_TEST_SIZE,
        metavar="N|FRACTION",
        help="rows held out as test.parquet: a count (500) or a fraction (0.05); default %(default)s",
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="shuffle seed (default %(default)s)")
    parser.add_argument(
        "--template-placement",
        choices=[p.value for p in Placement],
        default=DEFAULT_PLACEMENT.value,
        help="instruction as the system turn (default) or prepended to the user turn",
    )
    parser.add_argument(
        "--instruction-file", type=Path, metavar="FILE", help="UTF-8 text replacing the R1-Zero instruction"
    )
    parser.add_argument("--strict", action="store_true", help="fail on the first unusable row instead of rejecting it")
    parser.add_argument("--overwrite", action="store_true", help="replace outputs of an earlier run in --output-dir")
    val = parser.add_argument_group("validation sets")
    val.add_argument("--val", action="store_true", help="build validation parquet instead of training data")
    val.add_argument(
        "--val-set",
        action="append",
        metavar="NAME[=PATH]",
        help="shipped set (aime24, amc, math500) or your own file as NAME=PATH; repeatable; default: all shipped",
    )
    val.add_argument(
        "--val-layout",
        choices=["combined", "per-set"],
        default="combined",
        help="one val.parquet (default) or val_<name>.parquet per set",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    _setup_logging()
    try:
        instruction = _read_instruction(args.instruction_file)
        common = {
            "placement": args.template_placement,
            "instruction": instruction,
            "strict": args.strict,
            "overwrite": args.overwrite,
        }
        if args.val:
            if args.input:
                parser.error("--val builds validation sets; give your own files as --val-set NAME=PATH, not --input")
            training_only = [
                flag
                for flag, given in (
                    ("--seed", args.seed != DEFAULT_SEED),
                    ("--test-size", args.test_size != DEFAULT_TEST_SIZE),
                    ("--data-source", args.data_source != DEFAULT_DATA_SOURCE),
                )
                if given
            ]
            if training_only:
                parser.error(
                    f"{', '.join(training_only)} only apply to training data; validation sets are written in file "
                    "order with one data_source per set (see --val-set)"
                )
            summary = prepare_val(args.output_dir, val_sets=args.val_set, layout=args.val_layout, **common)
        else:
            if not args.input:
                parser.error("give at least one --input FILE (or --val for the validation sets)")
            training = {"data_source": args.data_source, "seed": args.seed, "test_size": args.test_size}
            summary = prepare(args.input, args.output_dir, **training, **common)
    except (DataError, InputFormatError, OSError) as exc:
        print(f"r1-ascend prepare-data: error: {exc}", file=sys.stderr)
        return 1
    print(summary.format())
    print(f"output directory: {args.output_dir}")
    return 0


def _read_instruction(path: Path | None) -> str:
    if path is None:
        return R1_ZERO_INSTRUCTION
    try:
        return path.read_text(encoding="utf-8").rstrip("\n")
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"cannot read --instruction-file {path}: {exc}"
        raise DataError(msg) from None


def _setup_logging() -> None:
    """Progress and write notices go to stderr; the summary goes to stdout."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("r1-ascend prepare-data: %(message)s"))
        root.addHandler(handler)
    logging.getLogger("r1_ascend.data").setLevel(logging.INFO)


if __name__ == "__main__":
    raise SystemExit(main())
