"""Property tests: compute_score never raises, keeps its key set, its range and its time bound."""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from r1_ascend.recipe.reward import SCORE_KEYS, compute_score

_LATEX_BITS = st.sampled_from(
    ["\\boxed{", "\\fbox{", "}", "{", "</think>", "<think>", "\\frac", "\\sqrt", "^", "!", "(", ")", "[", "]", ",",
     "=", "\\le", "\\pm", "x", "9", "0.5", "\\%", "\\text{", "\\{", "\\}", "\\infty", "\\pi", "-", "/", " ", "\x00",
     "\\cup", "\\in", ";", "\\sum_{k=1}^{n}", "\\begin{pmatrix}", "\\\\", "$"]
)  # fmt: skip
_TEXTS = st.one_of(st.text(max_size=200), st.lists(_LATEX_BITS, max_size=40).map("".join))
_WEIGHTS = st.fixed_dictionaries(
    {"accuracy_weight": st.floats(0, 2), "format_weight": st.floats(0, 2)},
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(response=_TEXTS, truth=st.one_of(_TEXTS, st.lists(_TEXTS, max_size=3)), weights=_WEIGHTS)
def test_compute_score_total(response: str, truth: object, weights: dict[str, float]) -> None:
    start = time.monotonic()
    result = compute_score("math", response, truth, None, **weights)
    assert time.monotonic() - start < 1.5
    assert tuple(result) == SCORE_KEYS
    assert 0.0 <= result["score"] <= weights["accuracy_weight"] + weights["format_weight"] + 1e-9
    assert result["acc"] in (0.0, 1.0)
    assert result["format"] in (0.0, 1.0)
    assert result["timeout"] in (0.0, 1.0)
    assert isinstance(result["pred"], str)
    assert len(result["pred"]) <= 80
    assert isinstance(result["fail_reason"], str)
    assert (result["fail_reason"] == "") == (result["acc"] == 1.0)


@settings(max_examples=150, deadline=None)
@given(answer=st.lists(_LATEX_BITS, min_size=1, max_size=20).map("".join))
def test_an_answer_equals_itself_or_is_rejected_cleanly(answer: str) -> None:
    result = compute_score("math", f"</think>\\boxed{{{answer}}}", answer)
    assert tuple(result) == SCORE_KEYS
