"""The response protocol and the policy decisions documented in docs/reward.md."""

from __future__ import annotations

import pytest

from r1_ascend.data.template import THINK_CLOSE, THINK_OPEN
from r1_ascend.recipe.reward import SCORE_KEYS, compute_score, extract_answer, grade_answer


@pytest.mark.parametrize(
    ("response", "truth", "acc", "reason"),
    [
        ("<think>2+2</think> <answer>The final answer is \\boxed{4}.</answer>", "4", 1.0, ""),
        ("2+2</think>\\boxed{4}", "4", 1.0, ""),  # prompt already opened <think>
        ("<think>\\boxed{4}</think> so 4", "4", 0.0, "no_box"),  # boxes in the reasoning never count
        ("<think>x</think>\\boxed{}", "4", 0.0, "empty_box"),
        ("\\boxed{4}", "4", 0.0, "no_think_close"),
        ("<think>a</think>b</think>\\boxed{4}", "4", 0.0, "multiple_think_close"),
        ("</think><think>\\boxed{4}", "4", 0.0, "bad_think_open"),
        ("<think>a</think>\\boxed 4.", "4", 1.0, ""),  # \boxed without braces
        ("<think>a</think>\\fbox{4}", "4", 1.0, ""),
        ("<think>a</think>\\boxed{3} no wait \\boxed{4}", "4", 1.0, ""),  # the last box is the answer
        ("<think>a</think>\\boxed{4} no wait \\boxed{3}", "4", 0.0, "conflicting_boxes"),
        ("<think>a</think>\\boxed{5}", "4", 0.0, "wrong_answer"),
        ("<think>a</think>\\boxed{4", "4", 0.0, "unbalanced_box"),
        ("<think>a</think>\\boxed{" + "1" * 2100 + "}", "4", 0.0, "box_too_long"),
        ("<think>a</think>\\boxed{4}", "", 0.0, "no_ground_truth"),
    ],
)
def test_protocol_decisions(response: str, truth: str, acc: float, reason: str) -> None:
    result = compute_score("math", response, truth)
    assert (result["acc"], result["fail_reason"]) == (acc, reason)
    assert tuple(result) == SCORE_KEYS


def test_separate_boxes_form_a_multi_part_answer_but_never_a_hedge() -> None:
    both = "<think>a</think>\\boxed{(3, 3)} for part (a) and \\boxed{(1, 1)}"
    assert compute_score("m", both, "(3, 3), (1, 1)")["acc"] == 1.0
    hedge = "<think>a</think>\\boxed{2} or \\boxed{3}"
    assert compute_score("m", hedge, "2")["acc"] == 0.0


def test_format_component_and_weights() -> None:
    strict = f"{THINK_OPEN}r{THINK_CLOSE} <answer>\\boxed{{7}}</answer>"
    loose = f"{THINK_OPEN}r{THINK_CLOSE} \\boxed{{7}}"
    seed = {"accuracy_weight": 0.67, "format_weight": 0.33}
    assert compute_score("m", strict, "7", **seed)["score"] == pytest.approx(1.0)
    assert compute_score("m", loose, "7", **seed)["score"] == pytest.approx(0.67)
    assert compute_score("m", strict, "8", **seed)["score"] == pytest.approx(0.33)
    assert compute_score("m", strict, "7")["score"] == 1.0  # default: plain accuracy


def test_boxed_protocol_grades_the_whole_response() -> None:
    assert compute_score("m", "so \\boxed{7}", "7", protocol="boxed")["acc"] == 1.0
    assert extract_answer("no box here", "boxed").fail_reason == "no_box"


def test_bad_configuration_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="unknown reward option"):
        compute_score("m", "</think>\\boxed{1}", "1", fromat_weight=0.3)
    with pytest.raises(ValueError, match="protocol"):
        compute_score("m", "</think>\\boxed{1}", "1", protocol="xml")


@pytest.mark.parametrize(
    ("truth", "answer", "equal"),
    [
        ("10{,}000", "10000", True),
        ("50", "0.5", False),
        ("50\\%", "50", True),
        ("50\\%", "0.5", False),
        ("10000", "9999", False),
        ("12", "12.0001", False),
        ("\\pi", "3.14", False),
        ("\\frac{1}{2}", "\\frac{2}{4}", True),
        ("\\frac12", "0.5", True),
        ("2\\sqrt{2}", "\\sqrt{8}", True),
        ("10^{10}", "10000000000", True),
        ("\\{1,2\\}", "\\{2,1\\}", True),
        ("(1,2)", "(2,1)", False),
        ("(0,9)", "[0,9)", False),
        ("\\text{(A)}", "A", True),
        ("900,000,000", "900000000", True),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\dfrac{\\pi}{2})", True),
        ("45^\\circ", "45", True),
        ("5 \\text{ cm}", "5", True),
        ("25", "25\\text{ cm}^2", True),
        ("25", "5\\text{ cm}^{2}", False),
        ("8", "2\\text{ m}^3", False),
        ("2", "2 \\text{ (or 3)}", False),
        ("20", "2\\text{ dozen}0", False),
        ("2", "2 \\text{ or } 3", False),  # hedges inside one box are lists, never a single value
        ("2", "x = 2 \\text{ or } x = 3", False),
        ("2", "\\pm 2", False),
        ("2", "2, 3", False),
        ("\\text{even}", "\\text{even or odd}", False),
        ("x \\le 5", "5 \\geq x", True),
        ("x < 1", "x > -1", False),
        ("1 \\pm \\sqrt{19}", "1+\\sqrt{19}, 1-\\sqrt{19}", True),
        ("\\frac{1}{3}", "0.3333", True),
        ("\\frac{1}{3}", "0.33", False),
        ("x^2+2x+1", "(x+1)^2", True),
        ("x^2+2x+1", "(x+1)^3", False),
        ("\\sqrt{17}", "4.123105625617661", True),
        ("2\\frac{1}{2}", "2.5", True),
    ],
)
def test_equivalence_rules(truth: str, answer: str, equal: bool) -> None:
    assert grade_answer(truth, answer) is equal


def test_list_ground_truth_means_any_of() -> None:
    assert compute_score("m", "</think>\\boxed{1/2}", ["0.5", "one half"])["acc"] == 1.0
