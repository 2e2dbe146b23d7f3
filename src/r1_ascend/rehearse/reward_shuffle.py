"""The shuffled-reward control: each training batch's rewards permuted across its responses.

A rehearsal whose reward rises might be learning from the reward or drifting at its learning rate; ``--lr 0`` only
shows that nothing moves without updates. With the rewards permuted within each batch the updates run at the same
rate on the same reward distribution, but a response's reward no longer says anything about it, so the policy must
not improve. The permutation is applied in the trainer (verl's ``RayPPOTrainer.fit`` calls ``compute_reward``
from ``verl.trainer.ppo.ray_trainer`` for each training batch; validation scores are left alone, so the curve still
measures the policy).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch


def permuted_rewards(reward_tensor: torch.Tensor, response_mask: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``reward_tensor`` [responses, tokens] with response ``i``'s score replaced by response ``order[i]``'s.

    verl's reward managers put a response's score on its last valid token; the permuted score goes there too, so
    the batch holds the same scores, each on another response."""
    if reward_tensor.shape != response_mask.shape:
        msg = f"reward tensor {tuple(reward_tensor.shape)} and response mask {tuple(response_mask.shape)} differ"
        raise ValueError(msg)
    scores = reward_tensor.sum(dim=-1)
    last = (response_mask.long().sum(dim=-1) - 1).clamp(min=0)
    permuted = torch.zeros_like(reward_tensor)
    permuted[torch.arange(len(scores)), last] = scores[order].to(reward_tensor.dtype)
    return permuted


def shuffling(compute_reward: Callable[..., Any], seed: int) -> Callable[..., Any]:
    """verl's ``compute_reward(data, reward_fn)`` returning each batch's rewards permuted (a fresh permutation per
    batch, drawn from ``seed``)."""
    generator = torch.Generator().manual_seed(seed)

    @functools.wraps(compute_reward)
    def shuffled(data: Any, reward_fn: Any) -> Any:
        reward_tensor, extra = compute_reward(data, reward_fn)
        width = reward_tensor.shape[-1]
        mask = data.batch["attention_mask"][:, -width:]
        order = torch.randperm(reward_tensor.shape[0], generator=generator)
        return permuted_rewards(reward_tensor, mask, order), extra

    return shuffled
