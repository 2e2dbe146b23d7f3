"""Validation of one deepscaler-format record and its conversion to a verl parquet row.

A record is a JSON object with ``problem`` (non-empty string), ``answer`` (non-empty string, or a number or a
one-element list that is converted, see :func:`canonical_answer`), optional ``solution`` (string or null) and any
extra fields. Every way a record can be unusable maps to one reason code so that rejects can be counted.
"""

from __future__ import annotations

import decimal
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from r1_ascend.data.template import DEFAULT_PLACEMENT, R1_ZERO_INSTRUCTION, Placement, build_prompt

ABILITY = "math"
REWARD_STYLE = "rule"
CORE_FIELDS = ("problem", "answer", "solution")

# reason code -> what was expected (used in messages and docs)
REASONS: dict[str, str] = {
    "invalid_json": "each JSON Lines line must be one complete JSON value",
    "not_an_object": "each row must be a JSON object with 'problem' and 'answer'",
    "missing_problem": "'problem' must be present and not null",
    "problem_not_string": "'problem' must be a string",
    "empty_problem": "'problem' must contain non-whitespace text",
    "missing_answer": "'answer' must be present and not null",
    "answer_wrong_type": "'answer' must be a string, an integer, a finite float or a one-element list of those",
    "answer_not_finite": "a numeric 'answer' must be finite (not NaN or infinity)",
    "answer_list_several": "'answer' lists with several entries are ambiguous; the reward takes one ground truth",
    "empty_answer": "'answer' must contain non-whitespace text",
    "solution_wrong_type": "'solution' must be a string or null when present",
    "invalid_unicode": "text must be valid Unicode (no lone surrogates / undecodable bytes)",
}


class RowError(ValueError):
    """A record that cannot become a training row; ``reason`` is a key of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


@dataclass(frozen=True, slots=True)
class Problem:
    """A validated record: what the parquet row is built from."""

    problem: str
    answer: str
    solution: str | None
    extra_fields: str  # JSON object text of the record's other fields (sorted keys), "{}" when none


def canonical_answer(value: Any) -> str:
    """Ground-truth string for a JSON answer value.

    Strings are stripped. Integers are written in decimal. Floats are written with the shortest digits that
    round-trip (Python's ``repr``) in positional notation, and integral floats without a fractional part
    (``142.0`` -> ``"142"``, ``0.5`` -> ``"0.5"``, ``1e-07`` -> ``"0.0000001"``). A one-element list is replaced by
    its element. Booleans, objects, null and longer lists are rejected.
    """
    if isinstance(value, list):
        if len(value) == 1 and not isinstance(value[0], list):
            return canonical_answer(value[0])
        if not value:
            raise RowError("empty_answer", "'answer' is an empty list")
        if len(value) > 1:
            raise RowError("answer_list_several", f"'answer' is a list of {len(value)} entries: {_short(value)}")
        raise RowError("answer_wrong_type", f"'answer' is a nested list: {_short(value)}")
    if value is None:
        raise RowError("missing_answer", "'answer' is null")
    if isinstance(value, bool):
        raise RowError("answer_wrong_type", f"'answer' is a boolean ({json.dumps(value)})")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RowError("answer_not_finite", f"'answer' is {value!r}")
        if value.is_integer():
            return str(int(value))
        return format(decimal.Decimal(repr(value)), "f")
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise RowError("empty_answer", f"'answer' is {_short(value)}")
        return text
    raise RowError("answer_wrong_type", f"'answer' is a JSON {_json_type(value)}: {_short(value)}")


def validate_record(record: Any) -> Problem:
    """Check one parsed JSON value and return its :class:`Problem`, or raise :class:`RowError`."""
    if not isinstance(record, dict):
        raise RowError("not_an_object", f"row is a JSON {_json_type(record)}: {_short(record)}")
    problem = record.get("problem")
    if problem is None:
        state = "null" if "problem" in record else f"absent (fields: {', '.join(sorted(record)) or 'none'})"
        raise RowError("missing_problem", f"'problem' is {state}")
    if not isinstance(problem, str):
        raise RowError("problem_not_string", f"'problem' is a JSON {_json_type(problem)}: {_short(problem)}")
    if not problem.strip():
        raise RowError("empty_problem", f"'problem' is {_short(problem)}")
    if "answer" not in record:
        raise RowError("missing_answer", f"'answer' is absent (fields: {', '.join(sorted(record))})")
    answer = canonical_answer(record["answer"])
    solution = record.get("solution")
    if solution is not None and not isinstance(solution, str):
        raise RowError("solution_wrong_type", f"'solution' is a JSON {_json_type(solution)}: {_short(solution)}")
    extras = {key: value for key, value in record.items() if key not in CORE_FIELDS}
    extra_fields = json.dumps(extras, ensure_ascii=False, sort_keys=True)
    for name, text in (("problem", problem), ("answer", answer), ("solution", solution), ("extras", extra_fields)):
        if text is not None and not _is_encodable(text):
            raise RowError("invalid_unicode", f"{name!r} contains text that cannot be written as UTF-8")
    return Problem(problem=problem, answer=answer, solution=solution, extra_fields=extra_fields)


def dedup_key(problem: str) -> bytes:
    """Problems equal after collapsing every whitespace run to one space (and trimming) are duplicates.

    The key is a 128-bit BLAKE2b digest of that normalised text, so the index of seen problems costs 16 bytes per
    row instead of a second copy of every problem.
    """
    normalised = " ".join(problem.split()).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(normalised, digest_size=16).digest()


def to_verl_row(
    item: Problem,
    *,
    data_source: str,
    split: str,
    index: int,
    input_file: str,
    input_row: int,
    placement: Placement | str = DEFAULT_PLACEMENT,
    instruction: str = R1_ZERO_INSTRUCTION,
) -> dict[str, Any]:
    """The verl 0.6.1 parquet row (column layout in :mod:`r1_ascend.data.schema`)."""
    return {
        "data_source": data_source,
        "prompt": build_prompt(item.problem, placement=placement, instruction=instruction),
        "ability": ABILITY,
        "reward_model": {"style": REWARD_STYLE, "ground_truth": item.answer},
        "extra_info": {
            "index": index,
            "split": split,
            "input_file": input_file,
            "input_row": input_row,
            "problem": item.problem,
            "solution": item.solution,
            "extra_fields": item.extra_fields,
        },
    }


def _is_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=True, default=repr)
    return text if len(text) <= limit else text[: limit - 3] + "..."
