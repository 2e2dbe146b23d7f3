"""Adversarial fuzzing of the time bound: every response is scored within 1 s, whatever the answer holds.

The generators build the shapes that made earlier graders hang: power towers, huge factorials and powers,
trigonometry of huge arguments, deep nesting with and without brackets, long digit strings, NUL bytes and lone
surrogates, thousands of boxes, and long lists. Each call's wall time is measured (the default bound is 0.8 s;
1 s leaves room for one evaluation step and scheduling on a loaded machine).
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from r1_ascend.recipe.reward import SCORE_KEYS, compute_score, warm_up

BOUND_S = 1.0
_BASES = st.sampled_from(["2", "9", "10", "1.5", "e", "x", "a", "\\pi", "0.5", "-3", "99999", "\\sqrt{2}"])
_BIG = st.sampled_from(["10^{10}", "10^{100}", "9^{9}", "99999999", "2^{64}", "10^{10^{10}}", "100000000"])


@st.composite
def _tower(draw: st.DrawFn) -> str:
    levels = draw(st.lists(_BASES, min_size=2, max_size=7))
    text = levels[-1]
    for base in reversed(levels[:-1]):
        text = f"{base}^{{{text}}}" if draw(st.booleans()) else f"({base})^{{{text}}}"
    return text


@st.composite
def _wrapped(draw: st.DrawFn, inner: st.SearchStrategy[str]) -> str:
    text = draw(inner)
    for _ in range(draw(st.integers(0, 3))):
        template = draw(
            st.sampled_from(
                ["\\sin({})", "\\exp({})", "{}!", "\\sqrt{{{}}}", "\\binom{{{}}}{{3}}", "\\ln({})", "\\cos({})",
                 "-{}", "\\frac{{1}}{{{}}}", "{}-{}", "\\tan({})", "\\left({}\\right)^{{2}}", "\\cosh({})"]
            )
        )  # fmt: skip
        text = template.format(text, text) if template.count("{}") == 2 else template.format(text)
    return text


_NESTED = st.builds(
    lambda op, depth: op[0] * depth + "1" + op[1] * depth,
    st.sampled_from([("(", ")"), ("{", "}"), ("\\sqrt{", "}"), ("\\frac{1}{", "}"), ("-", ""), ("\\sqrt", ""),
                     ("\\frac1", ""), ("\\left(", "\\right)"), ("2^{", "}"), ("\\{", "\\}"), ("[", "]"),
                     ("|", "|"), ("x=", ""), ("\\text{", "}")]),
    st.integers(20, 1500),
)  # fmt: skip
_LONG = st.one_of(
    st.integers(50, 3000).map(lambda n: "9" * n),
    st.integers(50, 700).map(lambda n: ",".join(["123"] * n)),
    st.integers(50, 700).map(lambda n: "1," * n + "1"),
    st.integers(50, 400).map(lambda n: "2000!\\cdot " * n + "1"),
    st.integers(50, 400).map(lambda n: "(1,2)," * n),
    st.integers(50, 500).map(lambda n: "x " * n + "\\approx 1"),
    st.integers(50, 500).map(lambda n: "ab " * n + "!"),
)
_ODD = st.text(st.characters(codec="utf-8", exclude_categories=()) | st.sampled_from(["\x00", "\ud800", "\udfff"]))
_ANSWERS = st.one_of(
    _tower(),
    _wrapped(_tower()),
    _wrapped(_BIG.map(lambda b: f"({b})!")),
    _wrapped(_BIG),
    _NESTED,
    _LONG,
    _ODD,
)
_TRUTHS = st.one_of(st.sampled_from(["1", "0", "4", "x", "\\frac{2}{3}", "9^{9^{9}}"]), _tower(), _NESTED)


@pytest.fixture(scope="module", autouse=True)
def _warm_worker() -> None:
    warm_up()


def _timed(response: str, truth: object) -> dict:
    start = time.monotonic()
    result = compute_score("math", response, truth)
    elapsed = time.monotonic() - start
    assert elapsed < BOUND_S, f"{elapsed:.2f} s for {response[:120]!r} vs {str(truth)[:60]!r}"
    assert tuple(result) == SCORE_KEYS
    return result


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(answer=_ANSWERS, truth=_TRUTHS)
def test_adversarial_answer_is_bounded(answer: str, truth: str) -> None:
    _timed(f"<think>x</think> <answer>\\boxed{{{answer}}}</answer>", truth)
    _timed(f"</think>\\boxed{{{answer}}}", answer)  # also as its own ground truth


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(count=st.integers(100, 5000), answer=_ANSWERS, distinct=st.booleans())
def test_thousands_of_boxes_are_bounded(count: int, answer: str, distinct: bool) -> None:
    boxes = " ".join(f"\\boxed{{{index if distinct else answer}}}" for index in range(count))
    _timed(f"</think>{boxes}", answer)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(count=st.integers(100, 3000), answer=_ANSWERS)
def test_long_ground_truth_lists_are_bounded(count: int, answer: str) -> None:
    _timed(f"</think>\\boxed{{{answer}}}", [f"{index}^{{{index}}}" for index in range(count)])
