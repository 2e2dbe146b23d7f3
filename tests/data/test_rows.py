"""Row validation and answer canonicalisation, including a fuzz of the whole pipeline's accounting."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from r1_ascend.data import prepare as prep
from r1_ascend.data.readers import InputFormatError
from r1_ascend.data.rows import REASONS, RowError, canonical_answer, dedup_key, validate_record


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("  \\frac{1}{2} ", "\\frac{1}{2}"),
        (7, "7"),
        (-12, "-12"),
        (142.0, "142"),
        (-0.0, "0"),
        (0.1, "0.1"),
        (1e-7, "0.0000001"),
        (123456.789, "123456.789"),
        (1e22, "10000000000000000000000"),
        ([" 5 "], "5"),
        ([3.0], "3"),
    ],
)
def test_canonical_answer(value, expected: str) -> None:
    assert canonical_answer(value) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (True, "answer_wrong_type"),
        ({"a": 1}, "answer_wrong_type"),
        ([["1"]], "answer_wrong_type"),
        (None, "missing_answer"),
        ([None], "missing_answer"),
        (math.nan, "answer_not_finite"),
        (-math.inf, "answer_not_finite"),
        ([], "empty_answer"),
        ("", "empty_answer"),
        (["1", "2"], "answer_list_several"),
    ],
)
def test_unusable_answers(value, reason: str) -> None:
    with pytest.raises(RowError) as exc:
        canonical_answer(value)
    assert exc.value.reason == reason


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_float_answers_round_trip(value: float) -> None:
    text = canonical_answer(value)
    assert float(text) == value
    assert "e" not in text.lower()
    assert not text.endswith(".0")


def test_dedup_key_normalises_whitespace_only() -> None:
    assert dedup_key(" a\n\tb  c ") == dedup_key("a b c")
    assert dedup_key("A b") != dedup_key("a b")


json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
json_values = st.recursive(
    json_scalars,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
    max_leaves=6,
)
# rows that are often valid, often nearly valid, sometimes anything at all
row_like = st.fixed_dictionaries(
    {},
    optional={
        "problem": st.sampled_from(["p", "q ", " p", "", "  "]) | json_values,
        "answer": json_values,
        "solution": st.none() | st.text(max_size=4) | st.integers(),
        "extra": json_values,
    },
)
records = st.one_of(row_like, row_like, json_values)


@given(records)
def test_validate_record_raises_only_row_error(record) -> None:
    try:
        item = validate_record(record)
    except RowError as exc:
        reason = exc.reason
    else:
        reason = None
    if reason is not None:
        assert reason in REASONS
        return
    assert item.answer == item.answer.strip() != ""
    assert item.problem.strip()
    assert isinstance(json.loads(item.extra_fields), dict)


lines = st.one_of(records.map(lambda r: json.dumps(r)), st.sampled_from(["{", '{"problem": }', "[1,", "nul"]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(lines, min_size=1, max_size=15), strict=st.booleans())
def test_pipeline_accounts_for_every_row(rows: list[str], strict: bool, tmp_path: Path) -> None:
    """written + rejected + duplicates == rows in; the only failures are the documented DataError."""
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    try:
        summary = prep.prepare([path], out, strict=strict)
    except (prep.DataError, InputFormatError) as exc:
        error = exc
    else:
        error = None
    if isinstance(error, InputFormatError):
        assert rows[0].strip() == "{"  # the one whole-file error of JSON Lines: a pretty-printed object
        return
    if error is not None:
        assert strict or "no usable rows" in str(error)
        return
    assert summary.rows_in == len(rows)
    assert summary.rows_written + summary.rows_rejected + summary.duplicates == len(rows)
    written = pq.read_table(out / "train.parquet").num_rows
    assert written == summary.rows_written
    rejects = out / "rejects.jsonl"
    assert (len(rejects.read_text().splitlines()) if rejects.exists() else 0) == summary.rows_rejected
    dups = out / "duplicates.jsonl"
    assert (len(dups.read_text().splitlines()) if dups.exists() else 0) == summary.duplicates
    if strict:
        assert summary.rows_rejected == 0
