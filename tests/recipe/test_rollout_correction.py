"""verl 0.6.1's rollout correction (truncated importance sampling) as the opt-in switch of the shipped configs.

Off by default. Switched on (``algorithm.rollout_correction.rollout_is=token``), verl's driver weights each
token's policy loss by ``min(p_actor / p_rollout, rollout_is_threshold)`` computed from the old-log-prob pass, so
the on-policy shortcut (which skips that pass) turns itself off. Real: the composed overlay, verl's
``compute_rollout_correction_and_add_to_batch`` and its registered ``vanilla`` policy loss.
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from r1_ascend.launch.overlays import compose
from r1_ascend.patches.verl_onpolicy_logprob import shortcut_decision

CONFIGS = ("grpo_deepseekv3_671b", "grpo_deepseekv3_smoke", "grpo_qwen25_7b")
ON = ("algorithm.rollout_correction.rollout_is=token",)


@pytest.mark.parametrize("name", CONFIGS)
def test_off_by_default_with_the_switch_written_out(name: str) -> None:
    correction = compose(name).algorithm.rollout_correction
    assert correction.rollout_is is None
    assert correction.rollout_is_threshold == 2.0
    assert compose(name, ON).algorithm.rollout_correction.rollout_is == "token"


def test_switching_it_on_switches_the_onpolicy_shortcut_off() -> None:
    assert shortcut_decision(compose("grpo_deepseekv3_671b"))[0], "on-policy as shipped"
    active, reasons = shortcut_decision(compose("grpo_deepseekv3_671b", ON))
    assert not active
    assert any("rollout_is=token" in reason for reason in reasons)


@functools.cache
def _composed(*overrides: str) -> object:
    """The 671B config with ``overrides``, composed once per set (Hydra takes about a second per compose; the
    property below reads it for each of its examples)."""
    return compose("grpo_deepseekv3_671b", list(overrides))


def _batch(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> object:
    from verl import DataProto

    return DataProto.from_dict(
        tensors={"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask.clone()}
    )


def _loss(config: object, old: torch.Tensor, new: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, w=None):
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    actor = config.actor_rollout_ref.actor
    loss_fn = get_policy_loss_fn(actor.policy_loss.get("loss_mode", "vanilla"))
    loss, *_ = loss_fn(old, new, adv, mask, actor.loss_agg_mode, actor, rollout_is_weights=w)
    return loss


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), threshold=st.sampled_from([1.5, 2.0, 5.0]))
def test_the_loss_changes_as_documented(seed: int, threshold: float) -> None:
    """Weights = min(exp(old - rollout), threshold), detached; the token losses are multiplied by them; with the
    switch off the batch gets no weights and the loss is verl's unweighted one."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch

    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(4, 6, generator=g) * 3
    rollout = old + torch.randn(4, 6, generator=g)  # a rollout that disagrees by up to a few nats
    new = old + torch.randn(4, 6, generator=g) * 0.05
    adv = torch.randn(4, 1, generator=g).expand(4, 6)
    mask = (torch.rand(4, 6, generator=g) > 0.2).long()
    mask[:, 0] = 1

    off = _composed()
    batch, _ = compute_rollout_correction_and_add_to_batch(_batch(old, rollout, mask), off.algorithm.rollout_correction)
    assert "rollout_is_weights" not in batch.batch

    on = _composed(*ON, f"algorithm.rollout_correction.rollout_is_threshold={threshold}")
    batch, _ = compute_rollout_correction_and_add_to_batch(_batch(old, rollout, mask), on.algorithm.rollout_correction)
    weights = batch.batch["rollout_is_weights"]
    expected = torch.clamp(torch.exp(old - rollout), max=threshold) * mask
    torch.testing.assert_close(weights * mask, expected)
    assert not weights.requires_grad
    assert torch.equal(batch.batch["response_mask"], mask), "no rejection sampling or veto is switched on"

    weighted = _loss(on, old, new, adv, mask, weights)
    plain = _loss(off, old, new, adv, mask)
    per_token = _loss(off, old, new, adv, mask, torch.ones_like(old))
    torch.testing.assert_close(per_token, plain)

    # the weighted loss is linear in the weights: the sum over tokens of w_t x (verl's loss with weight 1 at t only)
    def one_hot(i: int, j: int) -> torch.Tensor:
        hot = torch.zeros_like(old)
        hot[i, j] = 1.0
        return hot

    valid = [(i, j) for i in range(4) for j in range(6) if mask[i, j]]
    manual = sum(weights[i, j] * _loss(off, old, new, adv, mask, one_hot(i, j)) for i, j in valid)
    torch.testing.assert_close(weighted, manual)
    if not torch.allclose(weights[mask.bool()], torch.ones(int(mask.sum()))):
        assert not torch.isclose(weighted, plain)
