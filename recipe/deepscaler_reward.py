"""File for verl's ``custom_reward_function.path``: the project's math reward under verl's expected names.

verl imports this file by path (as module ``custom_module``), so it only re-exports functions from the installed
``r1_ascend.recipe.reward`` package; worker processes import that package by name.

    custom_reward_function.path=recipe/deepscaler_reward.py custom_reward_function.name=compute_score
    # or, with reward_model.reward_manager=batch: custom_reward_function.name=compute_score_batch
"""

from __future__ import annotations

from r1_ascend.recipe.reward import compute_score, compute_score_batch, start_in_background

# verl loads this file while building the trainer, minutes before the first rollout is scored: start the symbolic
# stage's template process now (non-blocking) so that no response ever waits for its one-off start.
start_in_background()

__all__ = ["compute_score", "compute_score_batch"]
