"""``r1-ascend evaluate`` results beside the training curves: the ``evaluation.json`` files of a run.

They are found under the run directories given to the report (any ``evaluation.json`` there) or named with
``--evaluation FILE``. A named file that cannot be read is an error; a found one that cannot be read, or that another
tool wrote, is listed in the section instead of being skipped silently.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r1_ascend.evaluate import tables


class EvaluationInputError(ValueError):
    """A file named with ``--evaluation`` is missing or is not an ``r1-ascend evaluate`` result."""


@dataclass(frozen=True)
class EvaluationFile:
    path: Path
    doc: dict[str, Any] | None  # None: not readable as an evaluation (``problem`` says why)
    problem: str | None = None


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"cannot read {path}: {exc}"
        raise ValueError(msg) from None
    return tables.read_document(text, str(path))


def find_evaluations(paths: list[Path], named: list[Path] | None = None) -> list[EvaluationFile]:
    """The named files (each must be an evaluation), then every ``evaluation.json`` under the directories."""
    found: list[EvaluationFile] = []
    seen: set[Path] = set()
    for path in named or []:
        try:
            found.append(EvaluationFile(path, _read(path)))
        except ValueError as exc:
            msg = f"--evaluation {exc}; give the evaluation.json that r1-ascend evaluate wrote"
            raise EvaluationInputError(msg) from None
        seen.add(path.resolve())
    for directory in (p for p in paths if p.is_dir()):
        for path in sorted(directory.rglob(tables.JSON_NAME)):
            if path.resolve() in seen or not path.is_file():
                continue
            seen.add(path.resolve())
            try:
                found.append(EvaluationFile(path, _read(path)))
            except ValueError as exc:
                found.append(EvaluationFile(path, None, str(exc)))
    return found


def evaluation_section(files: list[EvaluationFile], base_dir: Path) -> list[str]:
    """``## Evaluation``: one table per result (pass@1, pass@k per set), with the settings it was made with."""
    if not files:
        return []
    lines = ["## Evaluation", ""]
    for item in files:
        where = _rel(item.path, base_dir)
        if item.doc is None:
            lines += [f"`{where}`: skipped, {item.problem}", ""]
            continue
        lines += [f"### `{item.doc.get('model')}`", "", f"From `{where}`.", "", tables.summary_table(item.doc), ""]
        lines += [tables.settings_line(item.doc), ""]
        wrong = tables.counted_wrong_lines(item.doc)
        if wrong:
            lines += [
                f"Counted wrong whatever the reward said (malformed rows, empty and truncated responses): "
                f"{len(wrong)} problem(s), listed in its evaluation.md.",
                "",
            ]
    return lines


def _rel(path: Path, base_dir: Path) -> str:
    try:
        return os.path.relpath(path.resolve(), base_dir.resolve())
    except ValueError:
        return str(path)
