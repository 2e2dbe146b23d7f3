"""The streaming readers: a JSON array decoded element by element, JSON Lines line by line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from r1_ascend.data import readers
from r1_ascend.data.readers import InputFormatError, detect_format, read_records

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(json_values, max_size=12), indent=st.sampled_from([None, 0, 2]), chunk=st.integers(1, 40))
def test_array_stream_matches_json_loads_for_any_chunking(
    values, indent, chunk: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tiny chunks split numbers, literals, strings and escapes across reads; the result must not change."""
    monkeypatch.setattr(readers, "CHUNK_CHARS", chunk)
    text = json.dumps(values, indent=indent, ensure_ascii=False)
    path = tmp_path / "rows.json"
    path.write_text(text, encoding="utf-8")
    records = list(read_records(path))
    assert [r.value for r in records] == json.loads(text)
    assert [r.input_row for r in records] == list(range(len(values)))
    for record in records:  # each reported position is where that element's text starts
        assert json.JSONDecoder().raw_decode(text, record.offset)[0] == record.value
        assert record.line == text.count("\n", 0, record.offset) + 1
        assert record.column == record.offset - (text.rfind("\n", 0, record.offset) + 1) + 1


def test_long_array_trims_its_buffer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers, "CHUNK_CHARS", 64)
    rows = [{"problem": f"p{i}\nline", "answer": i} for i in range(500)]
    text = json.dumps(rows, indent=2)
    path = tmp_path / "rows.json"
    path.write_text(text, encoding="utf-8")
    records = list(read_records(path))
    assert [r.value for r in records] == rows
    last = records[-1]
    assert text[last.offset] == "{"
    assert last.line == text.count("\n", 0, last.offset) + 1


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[{"a": 1}, {"a": 2}', "not closed"),
        ('[{"a": 1} {"a": 2}]', "expected ',' or ']' after element 0"),
        ('[{"a": 1},]', "no trailing comma"),
        ('[{"a": 1}] [2]', "after the closing ']'"),
        ('[{"a": "unterminated}]', "element 0 is not valid JSON: Unterminated string"),
    ],
)
def test_broken_array_structure_is_fatal_with_position(text: str, needle: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(InputFormatError, match="line 1, column") as exc:
        list(read_records(path))
    assert needle in str(exc.value)
    assert str(path) in str(exc.value)


def test_jsonl_positions_blank_lines_crlf_and_bom(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n\r\n  {"a": 2}\r\n{"a": \r\n')
    records = list(read_records(path))
    assert [r.value for r in records[:2]] == [{"a": 1}, {"a": 2}]
    assert [(r.input_row, r.line, r.column) for r in records] == [(0, 1, 1), (1, 3, 3), (2, 4, 7)]
    assert records[2].error == "Expecting value"
    assert records[2].raw_text == '{"a": '


def test_undecodable_bytes_survive_as_surrogates(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"problem": "caf\xe9", "answer": "1"}\n')
    (record,) = read_records(path)
    assert record.value["problem"] == "caf\udce9"


def test_format_detection_and_pretty_printed_object(tmp_path: Path) -> None:
    array = tmp_path / "a.json"
    array.write_text("  \n [1]", encoding="utf-8")
    assert detect_format(array) == "json"
    obj = tmp_path / "o.json"
    obj.write_text('{\n  "data": []\n}\n', encoding="utf-8")
    assert detect_format(obj) == "jsonl"
    with pytest.raises(InputFormatError, match="pretty-printed JSON object"):
        list(read_records(obj))
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    assert list(read_records(empty)) == []
