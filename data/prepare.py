"""The data pipeline: deepscaler-format JSON / JSON Lines -> verl parquet with the R1-Zero template.

Training mode reads one or more inputs, rejects unusable rows (listed in ``rejects.jsonl``), drops repeated
problems (listed in ``duplicates.jsonl``), shuffles with a seed, splits off a test set and writes
``train.parquet`` / ``test.parquet`` and ``summary.json``. Validation mode (``--val``) writes the shipped
AIME24 / AMC / MATH-500 sets (or your own) with one ``data_source`` per set, in source order.

Same inputs + same options + same pyarrow version -> byte-identical files. The command line
(``r1-ascend prepare-data``) is ``r1_ascend.data.cli``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from r1_ascend.atomic import atomic_path, atomic_write_text
from r1_ascend.data.readers import read_records
from r1_ascend.data.rows import REASONS, Problem, RowError, dedup_key, to_verl_row, validate_record
from r1_ascend.data.schema import write_parquet
from r1_ascend.data.template import (
    DEFAULT_PLACEMENT,
    R1_ZERO_INSTRUCTION,
    Placement,
    build_prompt,
    missing_markers,
    render_deepseek_v3,
)
from r1_ascend.data.valsets import resolve_val_sets

logger = logging.getLogger(__name__)

DEFAULT_DATA_SOURCE = "deepscaler"
DEFAULT_SEED = 42
DEFAULT_TEST_SIZE = 0
PROGRESS_SECONDS = 5.0

TRAIN_OUTPUTS = ("train.parquet", "test.parquet", "rejects.jsonl", "duplicates.jsonl", "summary.json")
VAL_COMBINED = "val.parquet"
VAL_AUX = ("val_rejects.jsonl", "val_duplicates.jsonl", "val_summary.json")


class DataError(ValueError):
    """The inputs or options cannot produce a dataset (message says what, what was expected and how to fix)."""


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One input file and the ``data_source`` its rows get."""

    path: Path
    data_source: str = DEFAULT_DATA_SOURCE


@dataclass
class PrepareSummary:
    """What a run read, wrote and dropped; ``rows_in == sum(written) + sum(rejected) + duplicates``."""

    mode: str
    rows_in: int = 0
    written: dict[str, int] = field(default_factory=dict)  # output file name -> rows
    per_data_source: dict[str, int] = field(default_factory=dict)  # rows written per data_source
    rejected: dict[str, int] = field(default_factory=dict)  # reason -> rows
    duplicates: int = 0
    duplicates_with_other_answer: int = 0
    inputs: list[dict[str, Any]] = field(default_factory=list)  # file, data_source, rows
    outputs: list[str] = field(default_factory=list)  # file names written in the output directory
    options: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    example_rendered_prompt: str | None = None  # first written row after DeepSeek-V3's chat template

    @property
    def rows_rejected(self) -> int:
        return sum(self.rejected.values())

    @property
    def rows_written(self) -> int:
        return sum(self.written.values())

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, indent=2, sort_keys=True) + "\n"

    def format(self) -> str:
        """Human-readable report printed by the CLI."""
        lines = [f"rows in: {self.rows_in}"]
        lines += [f"  {item['file']} ({item['data_source']}): {item['rows']}" for item in self.inputs]
        lines.append(f"written: {self.rows_written}")
        lines += [f"  {name}: {count}" for name, count in self.written.items()]
        lines.append(f"rejected: {self.rows_rejected}")
        lines += [f"  {reason}: {count}" for reason, count in sorted(self.rejected.items())]
        lines.append(f"duplicates dropped (first kept): {self.duplicates}")
        if self.duplicates_with_other_answer:
            lines.append(f"  of which with a different answer: {self.duplicates_with_other_answer}")
        lines += [f"warning: {text}" for text in self.warnings]
        lines.append(f"outputs: {', '.join(self.outputs)}")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class _Kept:
    index: int
    input_file: str
    input_row: int
    data_source: str
    item: Problem


def prepare(
    inputs: Sequence[str | Path | InputSpec],
    output_dir: str | Path,
    *,
    data_source: str = DEFAULT_DATA_SOURCE,
    seed: int = DEFAULT_SEED,
    test_size: int | float = DEFAULT_TEST_SIZE,
    placement: Placement | str = DEFAULT_PLACEMENT,
    instruction: str = R1_ZERO_INSTRUCTION,
    strict: bool = False,
    overwrite: bool = False,
) -> PrepareSummary:
    """Build ``train.parquet`` (and ``test.parquet`` when ``test_size`` > 0) from deepscaler-format inputs.

    ``test_size``: an ``int`` is a row count, a ``float`` in ``[0, 1)`` a fraction of the kept rows (rounded half
    up). Rows are shuffled with ``random.Random(seed)`` before the split; the test rows are the first of the
    shuffled order. Duplicates are detected across all inputs.
    """
    specs = [_as_spec(item, data_source) for item in inputs]
    if not specs:
        msg = "no input files given; pass at least one --input FILE (deepscaler JSON array or JSON Lines)"
        raise DataError(msg)
    placement = _placement(placement)
    out = Path(output_dir)
    _check_outputs(out, TRAIN_OUTPUTS, overwrite)
    summary = PrepareSummary(mode="train", options=_options(seed, test_size, placement, instruction, strict))
    summary.warnings += _instruction_warnings(instruction)
    kept = _collect(specs, out, summary, strict=strict, dedup_per_source=False, prefix="")
    n_test = _test_rows(test_size, len(kept))
    order = list(range(len(kept)))
    random.Random(seed).shuffle(order)
    splits = {"test": order[:n_test], "train": order[n_test:]}
    if not splits["train"]:
        msg = f"test size {test_size!r} takes all {len(kept)} usable rows and leaves none for training"
        raise DataError(msg)
    for split in ("train", "test"):
        if splits[split]:
            rows = (_row(kept[i], split, placement, instruction) for i in splits[split])
            _write(out / f"{split}.parquet", rows, summary, [kept[i].data_source for i in splits[split]])
    _finish(out, summary, kept[order[n_test]], placement, instruction, "summary.json")
    return summary


def prepare_val(
    output_dir: str | Path,
    *,
    val_sets: Sequence[str] | None = None,
    layout: str = "combined",
    placement: Placement | str = DEFAULT_PLACEMENT,
    instruction: str = R1_ZERO_INSTRUCTION,
    strict: bool = False,
    overwrite: bool = False,
) -> PrepareSummary:
    """Build validation parquet: ``val.parquet`` (``layout="combined"``) or ``val_<name>.parquet`` per set.

    ``val_sets`` items are shipped set names (``aime24``, ``amc``, ``math500``) or ``NAME=PATH``; default: all
    shipped sets. Each set's name is its ``data_source``. Rows keep source order; duplicates are dropped only
    within a set, so a problem shared by two sets counts in both.
    """
    if layout not in ("combined", "per-set"):
        msg = f"unknown validation layout {layout!r}; use 'combined' (one val.parquet) or 'per-set'"
        raise DataError(msg)
    try:
        sets = resolve_val_sets(list(val_sets) if val_sets else None)
    except ValueError as exc:
        raise DataError(str(exc)) from None
    placement = _placement(placement)
    out = Path(output_dir)
    per_set_names = tuple(f"val_{name}.parquet" for name, _ in sets)
    _check_outputs(out, (VAL_COMBINED, *per_set_names, *VAL_AUX), overwrite)
    options = _options(None, None, placement, instruction, strict) | {"layout": layout}
    summary = PrepareSummary(mode="val", options=options)
    summary.warnings += _instruction_warnings(instruction)
    specs = [InputSpec(path, name) for name, path in sets]
    kept = _collect(specs, out, summary, strict=strict, dedup_per_source=True, prefix="val_")
    if layout == "combined":
        rows = (_row(k, "test", placement, instruction) for k in kept)
        _write(out / VAL_COMBINED, rows, summary, [k.data_source for k in kept])
    else:
        for name, _ in sets:
            chosen = [k for k in kept if k.data_source == name]
            if chosen:
                rows = (_row(k, "test", placement, instruction) for k in chosen)
                _write(out / f"val_{name}.parquet", rows, summary, [name] * len(chosen))
    _finish(out, summary, kept[0], placement, instruction, "val_summary.json")
    return summary


# --- pipeline steps -------------------------------------------------------------------------------------------


def _collect(
    specs: Sequence[InputSpec], out: Path, summary: PrepareSummary, *, strict: bool, dedup_per_source: bool, prefix: str
) -> list[_Kept]:
    """Read and validate every input once; stream rejects and duplicates to their files as they are found."""
    kept: list[_Kept] = []
    first_seen: dict[Any, _Kept] = {}
    rejected: Counter[str] = Counter()
    index = 0
    progress = _Progress()
    with _JsonlSink(out / f"{prefix}rejects.jsonl") as rejects, _JsonlSink(out / f"{prefix}duplicates.jsonl") as dups:
        for spec in specs:
            if not spec.path.is_file():
                msg = f"input file not found: {spec.path} (expected a deepscaler JSON array or JSON Lines file)"
                raise DataError(msg)
            name = spec.path.name
            rows_in_file = 0
            for record in read_records(spec.path):
                rows_in_file += 1
                progress.tick(name, index + 1)
                try:
                    if record.error is not None:
                        raise RowError("invalid_json", f"{record.error} (line {record.line}, column {record.column})")
                    item = validate_record(record.value)
                except RowError as exc:
                    if strict:
                        raise DataError(_strict_message(spec.path, record, exc)) from None
                    rejected[exc.reason] += 1
                    rejects.write(_reject_entry(index, name, record, exc))
                    index += 1
                    continue
                key = (spec.data_source, dedup_key(item.problem)) if dedup_per_source else dedup_key(item.problem)
                this = _Kept(index, name, record.input_row, spec.data_source, item)
                earlier = first_seen.get(key)
                if earlier is None:
                    first_seen[key] = this
                    kept.append(this)
                else:
                    summary.duplicates += 1
                    other_answer = earlier.item.answer != item.answer
                    summary.duplicates_with_other_answer += other_answer
                    dups.write(_duplicate_entry(this, earlier, other_answer))
                index += 1
            summary.inputs.append({"file": name, "data_source": spec.data_source, "rows": rows_in_file})
    summary.rows_in = index
    summary.rejected = dict(sorted(rejected.items()))
    summary.outputs += [path.name for path in (rejects.path, dups.path) if path.exists()]
    if not kept:
        msg = f"no usable rows in {', '.join(s.path.name for s in specs)}: {summary.rows_in} rows read, " + (
            f"rejected {summary.rejected}; see {prefix}rejects.jsonl for each row and its reason"
            if summary.rejected
            else "the inputs are empty"
        )
        raise DataError(msg)
    return kept


def _row(kept: _Kept, split: str, placement: Placement, instruction: str) -> dict[str, Any]:
    return to_verl_row(
        kept.item,
        data_source=kept.data_source,
        split=split,
        index=kept.index,
        input_file=kept.input_file,
        input_row=kept.input_row,
        placement=placement,
        instruction=instruction,
    )


def _write(path: Path, rows: Iterator[dict[str, Any]], summary: PrepareSummary, sources: list[str]) -> None:
    logger.info("writing %s (%d rows)", path.name, len(sources))
    summary.written[path.name] = write_parquet(path, rows)
    summary.outputs.append(path.name)
    for source, count in Counter(sources).items():
        summary.per_data_source[source] = summary.per_data_source.get(source, 0) + count


def _finish(
    out: Path, summary: PrepareSummary, example: _Kept, placement: Placement, instruction: str, name: str
) -> None:
    prompt = build_prompt(example.item.problem, placement=placement, instruction=instruction)
    summary.example_rendered_prompt = render_deepseek_v3(prompt)
    summary.per_data_source = dict(sorted(summary.per_data_source.items()))
    summary.outputs.append(name)
    atomic_write_text(out / name, summary.to_json())


def _test_rows(test_size: int | float, n_rows: int) -> int:
    if isinstance(test_size, bool) or not isinstance(test_size, int | float):
        msg = f"test size must be a row count (int) or a fraction (float in [0, 1)), got {test_size!r}"
        raise DataError(msg)
    if isinstance(test_size, int):
        if test_size < 0:
            msg = f"test size must not be negative, got {test_size}"
            raise DataError(msg)
        return test_size
    if not 0.0 <= test_size < 1.0:
        msg = f"a fractional test size must be in [0, 1), got {test_size}; give a whole number for a row count"
        raise DataError(msg)
    return math.floor(n_rows * test_size + 0.5)


# --- outputs --------------------------------------------------------------------------------------------------


def _check_outputs(out: Path, names: Sequence[str], overwrite: bool) -> None:
    """Refuse to replace earlier outputs unless asked; with ``overwrite`` remove them all (no stale leftovers)."""
    if out.exists() and not out.is_dir():
        msg = f"--output-dir {out} exists and is not a directory"
        raise DataError(msg)
    existing = [name for name in names if (out / name).exists()]
    if existing and not overwrite:
        msg = (
            f"{out} already holds {', '.join(existing)}; pass --overwrite to replace them (earlier rejects/duplicates "
            "files are removed too) or choose another --output-dir"
        )
        raise DataError(msg)
    for name in existing:
        (out / name).unlink()
    out.mkdir(parents=True, exist_ok=True)


class _JsonlSink:
    """A JSON Lines file that only appears if something was written to it (and only if the run gets that far)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._atomic: AbstractContextManager[Path] | None = None
        self._fh: TextIO | None = None
        self.count = 0

    def __enter__(self) -> _JsonlSink:
        return self

    def write(self, entry: dict[str, Any]) -> None:
        if self._fh is None:
            self._atomic = atomic_path(self.path)
            self._fh = self._atomic.__enter__().open("w", encoding="utf-8", newline="\n")
        self._fh.write(json.dumps(entry, ensure_ascii=True, sort_keys=True, default=repr) + "\n")
        self.count += 1

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._fh is None or self._atomic is None:
            return
        self._fh.close()
        self._atomic.__exit__(exc_type, exc, tb)


def _reject_entry(index: int, name: str, record: Any, exc: RowError) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "index": index,
        "input_file": name,
        "input_row": record.input_row,
        "line": record.line,
        "column": record.column,
        "offset": record.offset,
        "reason": exc.reason,
        "message": f"{exc.detail}; expected: {REASONS[exc.reason]}",
    }
    if record.error is not None:
        entry["raw_text"] = record.raw_text
    else:
        entry["raw"] = record.value
    return entry


def _duplicate_entry(this: _Kept, earlier: _Kept, other_answer: bool) -> dict[str, Any]:
    return {
        "index": this.index,
        "input_file": this.input_file,
        "input_row": this.input_row,
        "duplicate_of": earlier.index,
        "duplicate_of_input_file": earlier.input_file,
        "duplicate_of_input_row": earlier.input_row,
        "different_answer": other_answer,
        "answer": this.item.answer,
        "kept_answer": earlier.item.answer,
    }


def _strict_message(path: Path, record: Any, exc: RowError) -> str:
    return (
        f"{path}: row {record.input_row} (line {record.line}, column {record.column}, character offset "
        f"{record.offset}) is unusable: {exc.detail}. Expected: {REASONS[exc.reason]}. Fix or remove that row, or "
        "run without --strict to write the good rows and list every bad one in rejects.jsonl."
    )


# --- options ----------------------------------------------------------------------------------------------------


def _as_spec(item: str | Path | InputSpec, data_source: str) -> InputSpec:
    return item if isinstance(item, InputSpec) else InputSpec(Path(item), data_source)


def _placement(value: Placement | str) -> Placement:
    try:
        return Placement(value)
    except ValueError:
        msg = f"unknown template placement {value!r}; use one of {', '.join(p.value for p in Placement)}"
        raise DataError(msg) from None


def _options(
    seed: int | None, test_size: int | float | None, placement: Placement, instruction: str, strict: bool
) -> dict[str, Any]:
    return {
        "seed": seed,
        "test_size": test_size,
        "template_placement": placement.value,
        "instruction_is_default": instruction == R1_ZERO_INSTRUCTION,
        "instruction_sha256": hashlib.sha256(instruction.encode("utf-8")).hexdigest(),
        "strict": strict,
    }


def _instruction_warnings(instruction: str) -> list[str]:
    if not instruction:
        return ["no instruction: prompts are the bare problems, nothing asks for <think>/<answer>/\\boxed{}"]
    missing = missing_markers(instruction)
    if missing:
        return [f"the instruction never mentions {', '.join(missing)}; a reward that checks them will score 0"]
    return []


class _Progress:
    """A progress line through logging at most every few seconds (only shows on long inputs)."""

    def __init__(self) -> None:
        self._start = time.monotonic()
        self._last = self._start

    def tick(self, name: str, rows: int) -> None:
        if rows % 1024:
            return
        now = time.monotonic()
        if now - self._last >= PROGRESS_SECONDS:
            self._last = now
            logger.info("read %d rows (now in %s, %.0f rows/s)", rows, name, rows / (now - self._start))
