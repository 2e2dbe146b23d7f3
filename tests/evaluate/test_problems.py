"""Rows become problems grouped by data_source; a malformed row stays (with its reason); a bad file is an error."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from r1_ascend.data.schema import write_parquet
from r1_ascend.evaluate.problems import NO_DATA_SOURCE, EvalDataError, read_problems

from .conftest import row


def test_rows_are_grouped_by_data_source_in_order_across_files(tmp_path: Path) -> None:
    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    write_parquet(first, [row("aime24", "p0"), row("amc", "p1"), row("aime24", "p2")])
    write_parquet(second, [row("math500", "p3"), row("amc", "p4")])
    sets = read_problems([first, second])
    assert list(sets) == ["aime24", "amc", "math500"]
    assert [(p.index, p.source) for p in sets["aime24"]] == [(0, "a.parquet:0"), (1, "a.parquet:2")]
    assert [(p.index, p.source) for p in sets["amc"]] == [(0, "a.parquet:1"), (1, "b.parquet:1")]
    assert [p.messages[-1]["content"] for p in sets["amc"]] == ["p1", "p4"]
    assert all(p.malformed is None and p.ground_truth == "2" for s in sets.values() for p in s)


def test_limit_keeps_each_sets_first_rows(tmp_path: Path) -> None:
    path = tmp_path / "v.parquet"
    write_parquet(path, [row("aime24", f"a{i}") for i in range(4)] + [row("amc", f"b{i}") for i in range(3)])
    sets = read_problems([path], limit=2)
    assert {name: [p.messages[-1]["content"] for p in ps] for name, ps in sets.items()} == {
        "aime24": ["a0", "a1"],
        "amc": ["b0", "b1"],
    }


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"prompt": None}, "no prompt"),
        ({"prompt": []}, "not a non-empty list"),
        ({"prompt": [{"role": "system", "content": "only a system turn"}]}, "no user message"),
        ({"prompt": [{"role": None, "content": "hi"}]}, "no role"),
        ({"reward_model": None}, "no ground truth"),
        ({"reward_model": {"style": "rule", "ground_truth": None}}, "no ground truth"),
        ({"reward_model": {"style": "rule", "ground_truth": "  "}}, "no ground truth"),
        ({"data_source": None}, "no data_source"),
    ],
)
def test_a_malformed_row_is_kept_with_its_reason(tmp_path: Path, changes: dict, reason: str) -> None:
    path = tmp_path / "v.parquet"
    write_parquet(path, [row("aime24", "good"), row("aime24", "bad", **changes)])
    sets = read_problems([path])
    problems = [p for s in sets.values() for p in s]
    assert len(problems) == 2
    bad = next(p for p in problems if p.source == "v.parquet:1")
    assert bad.malformed is not None
    assert reason in bad.malformed
    assert bad.set_name == (NO_DATA_SOURCE if "data_source" in changes else "aime24")


def test_a_prompt_stored_as_text_is_malformed_not_parsed(tmp_path: Path) -> None:
    path = tmp_path / "text.parquet"
    table = pa.table({"data_source": ["aime24"], "prompt": ["What is 1 + 1?"], "reward_model": [{"ground_truth": "2"}]})
    pq.write_table(table, path)
    (problem,) = read_problems([path])["aime24"]
    assert "prompt is a string" in problem.malformed


def test_unreadable_files_name_the_path_and_the_fix(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"question": ["q"], "label": [1]}), other)
    cases = [
        (tmp_path / "absent.parquet", "does not exist"),
        (tmp_path, "is a directory"),
        (garbage, "is not readable parquet"),
        (other, "has none of the columns"),
    ]
    for path, what in cases:
        with pytest.raises(EvalDataError) as caught:
            read_problems([path])
        assert str(path) in str(caught.value)
        assert what in str(caught.value)
        assert "prepare-data --val" in str(caught.value) or "val.parquet" in str(caught.value)
