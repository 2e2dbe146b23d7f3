"""Table-driven regression over labelled cases taken from other graders' own test suites (see ``source``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r1_ascend.recipe.reward import compute_score, grade_answer

CASES_PATH = Path(__file__).parent / "cases" / "grader_cases.jsonl"
CASES = [json.loads(line) for line in CASES_PATH.read_text(encoding="utf-8").splitlines() if line.strip()]
CORE = [case for case in CASES if case["core"]]
THINK = [case for case in CASES if case["protocol"] == "think_boxed"]


def _case_id(case: dict) -> str:
    return case["id"]


@pytest.mark.parametrize("case", CORE, ids=_case_id)
def test_core_case(case: dict) -> None:
    # generous bound: the CI machine is shared; the default bound is exercised in test_bounds.py
    if case["kind"] == "answer_only":
        got = grade_answer(case["ground_truth"], case["response"], timeout_s=10)
    else:
        chosen = "think_boxed" if case["protocol"] == "think_boxed" else "boxed"
        got = compute_score("t", case["response"], case["ground_truth"], protocol=chosen, timeout_s=10)["acc"] == 1
    assert got == case["expected"], f"{case['source']} {case['test']}: {case['note']}"


@pytest.mark.parametrize("case", THINK, ids=_case_id)
def test_think_protocol_case(case: dict) -> None:
    result = compute_score("t", case["response"], case["ground_truth"])
    if case["id"] == "slime-0002":  # '###Response' is slime's own marker, not our protocol: no </think> -> 0
        assert result["fail_reason"] == "no_think_close"
        return
    assert (result["acc"] == 1.0) == case["expected"], case["note"]


def test_fixture_keeps_attribution() -> None:
    assert len(CORE) >= 100
    for case in CASES:
        assert case["source"], case["id"]
        assert case["test"], case["id"]
