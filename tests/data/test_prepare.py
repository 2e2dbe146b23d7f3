"""End-to-end behaviour of ``r1-ascend prepare-data`` (run in-process through ``main``) and ``prepare()``."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from r1_ascend.data import cli as data_cli
from r1_ascend.data import prepare as prep
from r1_ascend.data.readers import InputFormatError
from r1_ascend.data.rows import REASONS
from r1_ascend.data.schema import SCHEMA
from r1_ascend.data.template import R1_ZERO_INSTRUCTION, render_deepseek_v3

GOOD = [
    {"problem": "What is 1+1?", "answer": "2", "solution": "1+1=2", "year": 2020},
    {"problem": "What is 2+2?", "answer": 4},
    {"problem": "Half of one?", "answer": 0.5, "type": "Algebra"},
]


def _bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_shipped_sample_round_trip_through_cli(
    sample_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "out"
    rc = data_cli.main(["--input", str(sample_path), "--output-dir", str(out), "--test-size", "32"])
    assert rc == 0
    source = json.loads(sample_path.read_text(encoding="utf-8"))
    train = pq.read_table(out / "train.parquet")
    test = pq.read_table(out / "test.parquet")
    assert train.schema.equals(SCHEMA)
    assert (train.num_rows, test.num_rows) == (len(source) - 32, 32)
    assert sorted(p.name for p in out.iterdir()) == ["summary.json", "test.parquet", "train.parquet"]

    rows = train.to_pylist() + test.to_pylist()
    assert sorted(r["extra_info"]["index"] for r in rows) == list(range(len(source)))
    for row in rows:
        original = source[row["extra_info"]["input_row"]]
        assert row["data_source"] == "deepscaler"
        assert row["ability"] == "math"
        assert row["reward_model"] == {"style": "rule", "ground_truth": original["answer"].strip()}
        assert row["prompt"] == [
            {"role": "system", "content": R1_ZERO_INSTRUCTION},
            {"role": "user", "content": original["problem"].strip()},
        ]
        info = row["extra_info"]
        assert info["problem"] == original["problem"]
        assert info["solution"] == original.get("solution")
        extras = {k: v for k, v in original.items() if k not in ("problem", "answer", "solution")}
        assert json.loads(info["extra_fields"]) == extras
    assert {r["extra_info"]["split"] for r in test.to_pylist()} == {"test"}

    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["rows_in"] == len(source)
    assert summary["written"] == {"train.parquet": len(source) - 32, "test.parquet": 32}
    assert summary["rejected"] == {}
    assert summary["duplicates"] == 0
    first_train = train.slice(0, 1).to_pylist()[0]
    assert summary["example_rendered_prompt"] == render_deepseek_v3(first_train["prompt"])
    printed = capsys.readouterr().out
    assert f"rows in: {len(source)}" in printed
    assert "train.parquet: 288" in printed


def test_same_seed_gives_identical_bytes_and_other_seed_differs(sample_path: Path, tmp_path: Path) -> None:
    def run(name: str, seed: int) -> dict[str, bytes]:
        out = tmp_path / name
        argv = ["--input", str(sample_path), "--output-dir", str(out), "--seed", str(seed), "--test-size", "0.1"]
        assert data_cli.main(argv) == 0
        return _bytes(out)

    first, again, other = run("a", 7), run("b", 7), run("c", 8)
    assert first == again
    assert first["train.parquet"] != other["train.parquet"]
    # a different seed only reorders and re-splits: the same rows overall
    assert _rows_ignoring_split(tmp_path / "a") == _rows_ignoring_split(tmp_path / "c")


def _rows_ignoring_split(directory: Path) -> list[str]:
    rows = []
    for split in ("train", "test"):
        for row in pq.read_table(directory / f"{split}.parquet").to_pylist():
            row["extra_info"]["split"] = None
            rows.append(json.dumps(row, sort_keys=True))
    return sorted(rows)


def test_default_writes_good_rows_and_rejects_each_bad_kind(write_json, read_jsonl, tmp_path: Path) -> None:
    bad = [
        ["not", "an", "object"],
        {"answer": "1"},
        {"problem": None, "answer": "1"},
        {"problem": 5, "answer": "1"},
        {"problem": "   ", "answer": "1"},
        {"problem": "p1"},
        {"problem": "p2", "answer": None},
        {"problem": "p3", "answer": True},
        {"problem": "p4", "answer": {"x": 1}},
        {"problem": "p5", "answer": ["1", "2"]},
        {"problem": "p6", "answer": " \n"},
        {"problem": "p7", "answer": "1", "solution": 3},
        {"problem": "p8 \ud800", "answer": "1"},
    ]
    expected_reasons = [
        "not_an_object",
        "missing_problem",
        "missing_problem",
        "problem_not_string",
        "empty_problem",
        "missing_answer",
        "missing_answer",
        "answer_wrong_type",
        "answer_wrong_type",
        "answer_list_several",
        "empty_answer",
        "solution_wrong_type",
        "invalid_unicode",
    ]
    path = write_json(GOOD[:1] + bad + GOOD[1:])
    out = tmp_path / "out"
    summary = prep.prepare([path], out)
    assert summary.rows_written == 3
    assert summary.rows_rejected == len(bad)
    rejects = read_jsonl(out / "rejects.jsonl")
    assert [r["reason"] for r in rejects] == expected_reasons
    assert [r["index"] for r in rejects] == list(range(1, 1 + len(bad)))
    assert [r["raw"] for r in rejects] == bad  # nothing lost: the raw row is kept verbatim
    for entry in rejects:
        assert REASONS[entry["reason"]] in entry["message"]
        assert entry["input_file"] == path.name
    assert set(summary.outputs) == {"train.parquet", "rejects.jsonl", "summary.json"}


def test_invalid_json_line_is_rejected_with_its_position(write_json, read_jsonl, tmp_path: Path) -> None:
    text = '{"problem": "a", "answer": "1"}\n\n{"problem": "b", "answer": 2,}\n{"problem": "c", "answer": "3"}\n'
    path = write_json(text, fmt="jsonl")
    summary = prep.prepare([path], tmp_path / "out")
    assert summary.rows_in == 3
    assert summary.rejected == {"invalid_json": 1}
    (reject,) = read_jsonl(tmp_path / "out" / "rejects.jsonl")
    assert reject["line"] == 3
    assert reject["input_row"] == 1
    bad_line = '{"problem": "b", "answer": 2,}'
    assert reject["column"] == bad_line.index("}") + 1
    assert reject["offset"] == text.index(bad_line) + bad_line.index("}")
    assert reject["raw_text"] == bad_line


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"problem": "q"}, "'answer' is absent"),
        ({"problem": "q", "answer": ["1", "2"]}, "list of 2 entries"),
        ([1, 2], "row is a JSON array"),
    ],
)
def test_strict_fails_on_first_bad_row_naming_it(
    row, needle: str, write_json, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = write_json([*GOOD, row, {"problem": 1}], fmt="jsonl")
    out = tmp_path / "out"
    rc = data_cli.main(["--input", str(path), "--output-dir", str(out), "--strict"])
    assert rc == 1
    err = capsys.readouterr().err
    assert f"{path}: row 3 (line 4, column 1" in err
    assert needle in err
    assert "Expected:" in err
    assert "without --strict" in err
    assert not list(out.glob("*.parquet"))
    assert not list(out.glob("*.jsonl"))


def test_strict_reports_invalid_json_position(write_json, tmp_path: Path) -> None:
    path = write_json('{"problem": "a", "answer": "1"}\n{"problem": "b" "answer": "2"}\n', fmt="jsonl")
    with pytest.raises(prep.DataError, match=r"row 1 \(line 2, column 17, character offset 48\).*Expecting ','"):
        prep.prepare([path], tmp_path / "out", strict=True)


def test_broken_json_array_fails_with_position_in_both_modes(write_json, tmp_path: Path) -> None:
    text = '[\n  {"problem": "a", "answer": "1"},\n  {"problem": "b", "answer": }\n]\n'
    path = write_json(text, fmt="json")
    with pytest.raises(json.JSONDecodeError) as oracle:  # the standard library's own position for the error
        json.loads(text)
    where = rf"line {oracle.value.lineno}, column {oracle.value.colno} \(character offset {oracle.value.pos}\)"
    for strict in (False, True):
        with pytest.raises(InputFormatError, match=rf"{where}: element 1 is not valid JSON") as exc:
            prep.prepare([path], tmp_path / f"out{strict}", strict=strict)
        assert "no rows were written" in str(exc.value)
        assert not (tmp_path / f"out{strict}" / "train.parquet").exists()


def test_duplicates_dropped_first_kept_and_listed(write_json, read_jsonl, tmp_path: Path) -> None:
    rows = [
        {"problem": "Find  x.\n", "answer": "1"},
        {"problem": "Other", "answer": "5"},
        {"problem": " Find x. ", "answer": "2"},
        {"problem": "Find\tx.", "answer": "1"},
        {"problem": "find x.", "answer": "1"},  # case differs: not a duplicate
    ]
    first = write_json(rows[:2])
    second = write_json(rows[2:], fmt="jsonl")
    out = tmp_path / "out"
    summary = prep.prepare([first, second], out)
    assert (summary.rows_in, summary.rows_written, summary.duplicates) == (5, 3, 2)
    assert summary.duplicates_with_other_answer == 1
    dups = read_jsonl(out / "duplicates.jsonl")
    assert [(d["index"], d["duplicate_of"], d["different_answer"]) for d in dups] == [(2, 0, True), (3, 0, False)]
    assert dups[0]["input_file"] == second.name
    kept = pq.read_table(out / "train.parquet").to_pylist()
    assert sorted(r["extra_info"]["index"] for r in kept) == [0, 1, 4]
    assert "duplicates dropped (first kept): 2" in summary.format()


def test_refuses_to_overwrite_and_overwrite_removes_stale_outputs(write_json, tmp_path: Path) -> None:
    out = tmp_path / "out"
    prep.prepare([write_json([*GOOD, {"problem": "x"}])], out, test_size=1)
    assert (out / "rejects.jsonl").exists()
    with pytest.raises(prep.DataError, match=r"already holds train\.parquet, test\.parquet, rejects\.jsonl"):
        prep.prepare([write_json(GOOD)], out)
    summary = prep.prepare([write_json(GOOD)], out, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["summary.json", "train.parquet"]
    assert summary.written == {"train.parquet": 3}


@pytest.mark.parametrize(("test_size", "n_test"), [(0, 0), (2, 2), (0.34, 1), (0.5, 2), (0.0, 0)])
def test_test_size_counts_and_fractions(write_json, tmp_path: Path, test_size, n_test: int) -> None:
    summary = prep.prepare([write_json([*GOOD, {"problem": "4?", "answer": "4"}])], tmp_path / "o", test_size=test_size)
    assert summary.written.get("test.parquet", 0) == n_test
    assert summary.written["train.parquet"] == 4 - n_test


@pytest.mark.parametrize(
    ("test_size", "needle"), [(4, "leaves none"), (1.0, r"\[0, 1\)"), (-1, "negative"), (True, "row count")]
)
def test_bad_test_size_is_a_clear_error(write_json, tmp_path: Path, test_size, needle: str) -> None:
    with pytest.raises(prep.DataError, match=needle):
        prep.prepare([write_json([*GOOD, {"problem": "4?", "answer": "4"}])], tmp_path / "o", test_size=test_size)


def test_cli_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        data_cli.main(["--output-dir", str(tmp_path)])
    assert exc.value.code == 2
    assert "--input" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        data_cli.main(["--input", "x.json", "--output-dir", str(tmp_path), "--test-size", "ten"])
    assert "--test-size must be a row count" in capsys.readouterr().err
    assert data_cli.main(["--input", str(tmp_path / "missing.json"), "--output-dir", str(tmp_path / "o")]) == 1
    assert "input file not found" in capsys.readouterr().err


def test_no_usable_rows_is_an_error_that_keeps_the_rejects(write_json, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(prep.DataError, match=r"no usable rows.*missing_answer.*rejects\.jsonl"):
        prep.prepare([write_json([{"problem": "a"}, {"problem": "b"}])], out)
    assert len((out / "rejects.jsonl").read_text().splitlines()) == 2


def test_user_placement_and_custom_instruction(write_json, tmp_path: Path) -> None:
    instruction_file = tmp_path / "instruction.txt"
    instruction_file.write_text("Answer briefly.\n", encoding="utf-8")
    out = tmp_path / "out"
    argv = ["--input", str(write_json(GOOD[:1])), "--output-dir", str(out), "--template-placement", "user"]
    assert data_cli.main([*argv, "--instruction-file", str(instruction_file)]) == 0
    (row,) = pq.read_table(out / "train.parquet").to_pylist()
    assert row["prompt"] == [{"role": "user", "content": "Answer briefly.\n\nWhat is 1+1?"}]
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["options"]["template_placement"] == "user"
    assert summary["options"]["instruction_is_default"] is False
    assert any("never mentions <think>" in w for w in summary["warnings"])


def test_numeric_answers_become_canonical_strings(write_json, tmp_path: Path) -> None:
    rows = [
        {"problem": "a", "answer": 142.0},
        {"problem": "b", "answer": -3},
        {"problem": "c", "answer": 1e-7},
        {"problem": "d", "answer": ["\\frac{1}{2}"]},
        {"problem": "e", "answer": 2.5e20},
    ]
    prep.prepare([write_json(rows)], tmp_path / "out")
    table = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    got = {r["extra_info"]["problem"]: r["reward_model"]["ground_truth"] for r in table}
    assert got == {"a": "142", "b": "-3", "c": "0.0000001", "d": "\\frac{1}{2}", "e": "250000000000000000000"}


SHARED_MATH = Path(__file__).resolve().parents[3] / "shared" / "data" / "deepscaler_component_math.json"


@pytest.mark.skipif(not SHARED_MATH.is_file(), reason="shared deepscaler components not present")
def test_full_math_component_when_available(tmp_path: Path) -> None:
    """The real MATH component (7474 rows) has null and empty answers and a repeated problem: all accounted for."""
    source = json.loads(SHARED_MATH.read_text(encoding="utf-8"))
    null_answers = sum(row.get("answer") is None for row in source)
    empty_answers = sum(isinstance(row.get("answer"), str) and not row["answer"].strip() for row in source)
    usable = [row for row in source if isinstance(row.get("answer"), str) and row["answer"].strip()]
    repeats = len(usable) - len({" ".join(row["problem"].split()) for row in usable})
    assert (null_answers, empty_answers, repeats) != (0, 0, 0)  # the file really exercises these paths

    summary = prep.prepare([SHARED_MATH], tmp_path / "out", test_size=500)
    assert summary.rows_in == len(source)
    assert summary.rejected == {"missing_answer": null_answers, "empty_answer": empty_answers}
    assert summary.duplicates == repeats
    assert summary.written == {"train.parquet": len(usable) - repeats - 500, "test.parquet": 500}


def test_progress_lines_on_long_inputs(
    write_json, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(prep, "PROGRESS_SECONDS", 0.0)
    path = write_json([{"problem": f"p{i}", "answer": i} for i in range(2100)], fmt="jsonl")
    with caplog.at_level("INFO", logger="r1_ascend.data"):
        prep.prepare([path], tmp_path / "out")
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("read ")]
    assert [m.split(" rows")[0] for m in progress] == ["read 1024", "read 2048"]
    assert all(path.name in m for m in progress)


def test_cli_reports_broken_array_and_exits_1(write_json, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = write_json('[{"problem": "a", "answer": "1"} {"problem": "b"}]', fmt="json")
    assert data_cli.main(["--input", str(path), "--output-dir", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "line 1, column 34 (character offset 33): expected ',' or ']' after element 0" in err


@pytest.mark.parametrize("flag", [["--seed", "7"], ["--test-size", "10"], ["--data-source", "mine"]])
def test_val_mode_rejects_training_only_options(
    tmp_path: Path, flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Options that --val would ignore are an error, not silently dropped."""
    from r1_ascend.data.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--val", "--output-dir", str(tmp_path / "val"), *flag])
    assert info.value.code == 2
    assert f"{flag[0]} only apply to training data" in capsys.readouterr().err
    assert not (tmp_path / "val").exists()
