"""Each sample scored with the recipe's reward, called exactly as verl 0.6.1's naive reward manager calls it.

verl loads ``custom_reward_function.path`` (``r1_ascend.recipe.deepscaler_reward``) and calls
``compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)`` per response with the row's
``data_source``, ``reward_model.ground_truth`` and ``extra_info`` (to which it adds ``num_turns`` and
``rollout_reward_scores``); the recipe's configs pass no ``reward_kwargs``, so the score is plain accuracy.

A sample counts as correct when the reward's ``acc`` is 1 and the response is complete. Counted wrong, with the
reason recorded: a sample of a malformed row (never generated), an empty response, and a truncated one (it hit
``max_new_tokens``: its last ``\\boxed{}`` need not be its final answer). The reward's own verdict is kept beside
the count for every generated sample, so a truncated sample the reward would have accepted is visible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from r1_ascend.evaluate.generation import LENGTH, Completion
from r1_ascend.evaluate.problems import Problem

#: Reasons a sample is counted wrong that are not the reward's own ``fail_reason``.
MALFORMED_ROW = "malformed_row"
EMPTY_RESPONSE = "empty_response"
TRUNCATED = "truncated"


@dataclass(frozen=True)
class SampleResult:
    """One sample as counted: ``correct`` and, when not, ``reason`` (a reward fail_reason or one of the above)."""

    sample: int
    response: str
    correct: bool
    reason: str
    reward: dict[str, Any] | None  # compute_score's result; None for a malformed row's samples
    finish_reason: str | None = None
    tokens: int | None = None


def reward_fn() -> Any:
    """The function verl's ``custom_reward_function`` resolves to for the recipe's configs."""
    from r1_ascend.recipe.deepscaler_reward import compute_score

    return compute_score


def verl_extra_info(problem: Problem) -> dict[str, Any]:
    """The ``extra_info`` verl's naive reward manager passes: the row's, plus its two run-time keys."""
    return {**problem.extra_info, "num_turns": None, "rollout_reward_scores": {}}


def score_sample(problem: Problem, sample: int, completion: Completion, compute_score: Any) -> SampleResult:
    reward = compute_score(
        data_source=problem.data_source,
        solution_str=completion.text,
        ground_truth=problem.ground_truth,
        extra_info=verl_extra_info(problem),
    )
    if not isinstance(reward, dict):  # verl accepts a bare float too
        reward = {"score": float(reward), "acc": float(reward)}
    accepted = float(reward.get("acc", reward.get("score", 0.0))) == 1.0
    if not completion.text.strip():
        reason = EMPTY_RESPONSE
    elif completion.finish_reason == LENGTH:
        reason = TRUNCATED
    elif accepted:
        reason = ""
    else:
        reason = str(reward.get("fail_reason") or "wrong_answer")
    return SampleResult(
        sample, completion.text, reason == "", reason, reward, completion.finish_reason, completion.tokens
    )


def malformed_samples(problem: Problem, n: int) -> list[SampleResult]:
    """A malformed row's ``n`` samples: none generated, all wrong, the row's problem as the reason."""
    reason = f"{MALFORMED_ROW}: {problem.malformed}"
    return [SampleResult(j, "", False, reason, None) for j in range(n)]
