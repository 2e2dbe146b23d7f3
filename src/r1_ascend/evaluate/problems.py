"""The problems to evaluate: rows of prepared validation parquet, grouped into sets by ``data_source``.

A row that cannot be evaluated (no chat messages, no ground truth, no ``data_source``) is kept as a problem with a
``malformed`` reason: it counts in its set's denominator and is scored wrong, so a broken file lowers the score
visibly instead of shrinking the set. A file that cannot be read at all is an error naming the file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Set name of rows whose ``data_source`` is missing or empty.
NO_DATA_SOURCE = "(no data_source)"
#: The columns of a prepared validation file this command reads (r1_ascend.data.schema).
COLUMNS = ("data_source", "prompt", "reward_model", "extra_info")
PREPARE_HINT = "make one with `r1-ascend prepare-data --val --output-dir DIR` (DIR/val.parquet)"


class EvalDataError(ValueError):
    """A data file cannot be read as prepared validation parquet (the message names the file and the fix)."""


@dataclass(frozen=True)
class Problem:
    """One row of a set; ``index`` is its position in the set (file order across the files given)."""

    set_name: str
    index: int
    source: str  # "<file name>:<row>" (0-based row in that file)
    messages: list[dict[str, str]] | None
    ground_truth: str | None
    extra_info: dict[str, Any] = field(default_factory=dict)
    malformed: str | None = None  # why the row cannot be evaluated; None for a usable row

    @property
    def data_source(self) -> str | None:
        return None if self.set_name == NO_DATA_SOURCE else self.set_name


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of one parquet file as dicts; a clear error if it is missing, unreadable or not ours."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.is_dir():
        msg = f"--data {path} is a directory; give the parquet file in it (e.g. {path / 'val.parquet'})"
        raise EvalDataError(msg)
    if not path.is_file():
        msg = f"--data {path} does not exist; {PREPARE_HINT}"
        raise EvalDataError(msg)
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        msg = f"--data {path} is not readable parquet ({exc}); {PREPARE_HINT}"
        raise EvalDataError(msg) from None
    present = [name for name in COLUMNS if name in table.column_names]
    if "prompt" not in present and "reward_model" not in present:
        msg = (
            f"--data {path} has none of the columns of prepared validation data (prompt, reward_model; found "
            f"{', '.join(table.column_names) or 'none'}); {PREPARE_HINT}"
        )
        raise EvalDataError(msg)
    return table.select(present).to_pylist()


def read_problems(paths: Sequence[Path], limit: int | None = None) -> dict[str, list[Problem]]:
    """Every row of ``paths`` in order, grouped by ``data_source`` (sets in order of first appearance); with
    ``limit`` only each set's first ``limit`` rows."""
    sets: dict[str, list[Problem]] = {}
    for path in paths:
        for row_number, row in enumerate(read_rows(path)):
            name = _set_name(row.get("data_source"))
            problems = sets.setdefault(name, [])
            if limit is not None and len(problems) >= limit:
                continue
            problems.append(to_problem(row, name, len(problems), f"{path.name}:{row_number}"))
    return sets


def to_problem(row: dict[str, Any], set_name: str, index: int, source: str) -> Problem:
    """A parquet row as a problem; what makes it unusable goes into ``malformed`` (the first problem found)."""
    messages, message_problem = _messages(row.get("prompt"))
    ground_truth = _ground_truth(row.get("reward_model"))
    extra_info = row.get("extra_info")
    extra = dict(extra_info) if isinstance(extra_info, dict) else {}
    reasons = []
    if set_name == NO_DATA_SOURCE:
        reasons.append("no data_source")
    if message_problem:
        reasons.append(message_problem)
    if ground_truth is None:
        reasons.append("no ground truth (reward_model.ground_truth missing or empty)")
    return Problem(set_name, index, source, messages, ground_truth, extra, "; ".join(reasons) or None)


def _set_name(value: Any) -> str:
    return value.strip() if isinstance(value, str) and value.strip() else NO_DATA_SOURCE


def _messages(value: Any) -> tuple[list[dict[str, str]] | None, str | None]:
    """The chat list verl's RLHFDataset passes to the chat template, or why there is none."""
    if value is None:
        return None, "no prompt"
    if isinstance(value, str):
        return None, "prompt is a string, not a list of chat messages (prepare the file with r1-ascend prepare-data)"
    if not isinstance(value, list | tuple) or not value:
        return None, "prompt is not a non-empty list of chat messages"
    messages = []
    for position, message in enumerate(value):
        if not isinstance(message, dict):
            return None, f"prompt message {position} is not a {{role, content}} object"
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role or not isinstance(content, str):
            return None, f"prompt message {position} has no role or no text content: {json.dumps(message)[:120]}"
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "user" and m["content"].strip() for m in messages):
        return None, "prompt has no user message with text"
    return messages, None


def _ground_truth(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    truth = value.get("ground_truth")
    if truth is None:
        return None
    text = str(truth)
    return text if text.strip() else None
