"""Rule-based math reward for R1-Zero GRPO: protocol check, answer extraction, bounded equivalence.

Entry points for verl's ``custom_reward_function``: ``compute_score`` (naive manager) and
``compute_score_batch`` (batch manager); ``recipe/deepscaler_reward.py`` re-exports both for ``path=``.
"""

from __future__ import annotations

from r1_ascend.recipe.reward.equivalence import Verdict, is_equivalent
from r1_ascend.recipe.reward.protocol import extract_answer
from r1_ascend.recipe.reward.score import (
    FAIL_REASONS,
    SCORE_KEYS,
    RewardConfig,
    compute_score,
    compute_score_batch,
    grade_answer,
    start_in_background,
    warm_up,
)

__all__ = [
    "FAIL_REASONS",
    "SCORE_KEYS",
    "RewardConfig",
    "Verdict",
    "compute_score",
    "compute_score_batch",
    "extract_answer",
    "grade_answer",
    "is_equivalent",
    "start_in_background",
    "warm_up",
]
