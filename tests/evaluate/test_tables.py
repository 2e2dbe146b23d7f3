"""The JSON document, its Markdown and the sample lines: every problem's scores, and every malformed row, empty
and truncated response listed."""

from __future__ import annotations

import json

import pytest

from r1_ascend.data.template import build_prompt
from r1_ascend.evaluate import tables
from r1_ascend.evaluate.problems import Problem
from r1_ascend.evaluate.scoring import EMPTY_RESPONSE, MALFORMED_ROW, TRUNCATED, SampleResult


def sample(j: int, correct: bool, reason: str = "") -> SampleResult:
    reward = {"score": float(correct), "acc": float(correct), "fail_reason": "" if correct else "wrong_answer"}
    return SampleResult(j, "text", correct, "" if correct else reason or "wrong_answer", reward, "stop", 10)


def problem(set_name: str, index: int, malformed: str | None = None) -> Problem:
    messages = None if malformed else build_prompt(f"problem {index}")
    return Problem(set_name, index, f"val.parquet:{index}", messages, "1", {"index": 100 + index}, malformed)


@pytest.fixture
def doc() -> dict:
    """aime24: problems with 2, 0 and 3 of 3 correct (one empty, one truncated sample); amc: one good problem with
    1 of 3 and one malformed row."""
    aime = tables.SetRun(
        "aime24",
        [
            tables.ProblemRun(
                problem("aime24", 0), [sample(0, True), sample(1, False, EMPTY_RESPONSE), sample(2, True)]
            ),
            tables.ProblemRun(problem("aime24", 1), [sample(0, False), sample(1, False, TRUNCATED), sample(2, False)]),
            tables.ProblemRun(problem("aime24", 2), [sample(0, True), sample(1, True), sample(2, True)]),
        ],
    )
    bad = problem("amc", 1, malformed="no prompt")
    bad_samples = [SampleResult(j, "", False, f"{MALFORMED_ROW}: no prompt", None) for j in range(3)]
    amc = tables.SetRun(
        "amc",
        [
            tables.ProblemRun(problem("amc", 0), [sample(0, False), sample(1, True), sample(2, False)]),
            tables.ProblemRun(bad, bad_samples),
        ],
    )
    return tables.document([aime, amc], n=3, ks=(1, 2, 3), meta={"model": "/m", "backend": "scripted"})


def test_per_set_values_are_counted_from_the_samples(doc: dict) -> None:
    aime, amc = doc["sets"]
    assert (aime["name"], aime["problems"], aime["samples"]) == ("aime24", 3, 3)
    assert aime["pass@1"] == pytest.approx((2 / 3 + 0 + 1) / 3)
    # pass@2 by hand: 1 - C(1,2)/C(3,2) = 1, 0, 1
    assert aime["pass@k"] == pytest.approx({"1": (2 / 3 + 0 + 1) / 3, "2": 2 / 3, "3": 2 / 3})
    assert (aime["correct_samples"], aime["total_samples"]) == (5, 9)
    assert (aime["empty_samples"], aime["truncated_samples"], aime["malformed_rows"]) == (1, 1, 0)
    assert [p["scores"] for p in aime["per_problem"]] == [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    assert [p["index"] for p in aime["per_problem"]] == [100, 101, 102]
    assert amc["pass@1"] == pytest.approx((1 / 3 + 0) / 2)
    # problem 0 has 1 of 3 correct: pass@2 = 1 - C(2,2)/C(3,2) = 2/3, pass@3 = 1; the malformed row 0 and 0
    assert amc["pass@k"]["2"] == pytest.approx((2 / 3 + 0) / 2)
    assert amc["pass@k"]["3"] == pytest.approx(0.5)
    assert amc["malformed_rows"] == 1
    assert amc["per_problem"][1] == {
        "problem": 1,
        "source": "val.parquet:1",
        "index": 101,
        "correct": 0,
        "scores": [0.0, 0.0, 0.0],
        "malformed": "no prompt",
    }


def test_every_malformed_row_empty_and_truncated_response_is_listed(doc: dict) -> None:
    aime, amc = doc["sets"]
    assert aime["counted_wrong"] == [
        {"problem": 0, "source": "val.parquet:0", "what": EMPTY_RESPONSE, "samples": [1]},
        {"problem": 1, "source": "val.parquet:1", "what": TRUNCATED, "samples": [1]},
    ]
    assert amc["counted_wrong"] == [
        {"problem": 1, "source": "val.parquet:1", "what": f"{MALFORMED_ROW}: no prompt", "samples": [0, 1, 2]}
    ]
    text = tables.markdown(doc)
    assert "- `aime24` problem 0 (`val.parquet:0`): empty_response (samples 1)" in text
    assert "- `aime24` problem 1 (`val.parquet:1`): truncated (samples 1)" in text
    assert "- `amc` problem 1 (`val.parquet:1`): malformed_row: no prompt (all samples)" in text


def test_markdown_table_has_one_row_per_set_with_its_values(doc: dict) -> None:
    table = tables.summary_table(doc).splitlines()
    assert table[0] == (
        "| set | problems | samples per problem | pass@1 | pass@2 | pass@3 | correct samples | empty | truncated | "
        "malformed rows |"
    )
    assert table[2] == "| `aime24` | 3 | 3 | 0.5556 | 0.6667 | 0.6667 | 5/9 | 1 | 1 | 0 |"
    assert table[3] == "| `amc` | 2 | 3 | 0.1667 | 0.3333 | 0.5000 | 1/6 | 0 | 0 | 1 |"
    assert tables.summary_table(doc) in tables.markdown(doc)


def test_a_clean_evaluation_says_nothing_was_counted_wrong_unscored() -> None:
    run = tables.SetRun("math500", [tables.ProblemRun(problem("math500", 0), [sample(0, True)])])
    text = tables.markdown(tables.document([run], n=1, ks=(1,), meta={}))
    assert "None: every row was well formed" in text
    assert "| `math500` | 1 | 1 | 1.0000 | 1/1 | 0 | 0 | 0 |" in text


def test_the_json_reads_back_and_other_files_are_refused(doc: dict) -> None:
    assert tables.read_document(json.dumps(doc), "e.json") == doc
    with pytest.raises(ValueError, match="not valid JSON"):
        tables.read_document("{", "e.json")
    with pytest.raises(ValueError, match="not an r1-ascend evaluate result"):
        tables.read_document(json.dumps({"sets": []}), "e.json")


def test_a_sample_line_carries_what_scored_it() -> None:
    result = SampleResult(2, "resp", False, TRUNCATED, {"acc": 1.0, "fail_reason": ""}, "length", 16)
    record = tables.sample_record("aime24", problem("aime24", 4), result)
    assert record == {
        "set": "aime24",
        "problem": 4,
        "sample": 2,
        "source": "val.parquet:4",
        "ground_truth": "1",
        "response": "resp",
        "score": 0.0,
        "correct": False,
        "reason": TRUNCATED,
        "finish_reason": "length",
        "tokens": 16,
        "reward": {"acc": 1.0, "fail_reason": ""},
    }
