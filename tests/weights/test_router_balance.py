"""Synthetic DeepSeek-V3 checkpoints route like a trained MoE: by the token, over every expert and both EP ranks.

The slow test generates the quickstart's checkpoint (``make_checkpoint(..., "tiny")``: FP8, routers balanced on the
shipped prompts), converts it as the quickstart does, and measures the routing of the converted BF16 model with
transformers alone (no megatron-core, no project model code): on the shipped sample's prompts (the first 64; all 320
in ``benchmarks/routing_bench.py``, docs/rehearsal.md) and on every prompt of the rehearsal, every MoE layer sends
tokens to at least 7/8 of its experts and each of the rehearsal's two expert-parallel ranks receives at least 30 % of
the routed tokens. The fast tests check the balancing itself on a small random model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from r1_ascend.weights import router_balance as rb
from r1_ascend.weights.tiny import bf16_state_dict, deepseek_v3_config, make_tiny

#: Expert-parallel ranks of the rehearsal's actor.
EP = 2


#: A small DeepSeek-V3 (3 layers, the first dense; 8 experts in 2 groups, top-2 within 1 group).
SMALL = {
    "vocab_size": 64,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "num_nextn_predict_layers": 0,
}


def small_config() -> dict:
    return deepseek_v3_config(**SMALL)


def random_prompts(count: int, length: int, seed: int, vocab: int = 64) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(2, vocab, (count, length), generator=generator).tolist()


def test_router_weights_give_logits_of_about_unit_spread() -> None:
    assert rb.router_init_std(7168) == pytest.approx(7168**-0.5)
    config = small_config()
    state = bf16_state_dict(config, seed=0)
    router = state["model.layers.1.mlp.gate.weight"].float()
    assert router.std().item() == pytest.approx(rb.router_init_std(64), rel=0.15)
    assert torch.count_nonzero(state["model.layers.1.mlp.gate.e_score_correction_bias"]) == 0


def test_balancing_spreads_a_skewed_layer_over_every_expert_and_both_groups() -> None:
    """A bias that starts skewed towards one group is brought back by the sign update: the load after balancing is
    far closer to uniform on the calibration prompts and on prompts it never saw."""
    config = small_config()
    state = bf16_state_dict(config, seed=0)
    for layer in (1, 2):
        state[rb.bias_name(layer)] = torch.tensor([0.4] * 4 + [0.0] * 4)  # group 0 preferred whatever the token
    model = rb.reference_model(config, state)
    calibration = random_prompts(16, 24, seed=1)
    unseen = random_prompts(12, 24, seed=2)
    before = rb.routed_tokens(model, unseen)
    biases = rb.balance_expert_bias(model, [calibration])
    after = rb.routed_tokens(model, unseen)
    for layer in (1, 2):
        assert min(before[layer].rank_shares(EP)) < 0.1
        assert after[layer].experts_used == 8
        assert min(after[layer].rank_shares(EP)) >= 0.3
        assert after[layer].max_over_mean < before[layer].max_over_mean
        assert float(biases[layer].min()) == 0.0  # shifted: every biased score stays positive


def test_every_prompt_set_weighs_the_same() -> None:
    """A small set is balanced as much as a large one: per-token weights are 1 / the set's token count."""
    config = small_config()
    model = rb.reference_model(config, bf16_state_dict(config, seed=3))
    short = random_prompts(4, 8, seed=4)
    long = random_prompts(16, 32, seed=5)
    rb.balance_expert_bias(model, [short, long])
    for prompts in (short, long):
        for load in rb.routed_tokens(model, prompts).values():
            assert min(load.rank_shares(EP)) >= 0.25


def test_balancing_without_prompts_is_refused() -> None:
    config = small_config()
    model = rb.reference_model(config, bf16_state_dict(config, seed=0))
    with pytest.raises(ValueError, match="at least one calibration prompt"):
        rb.balance_expert_bias(model, [[]])


def test_fast_checkpoints_are_no_model_to_balance(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fast=True"):
        make_tiny(tmp_path, fast=True, routing_prompts=[[[1, 2, 3]]])


def test_make_tiny_writes_the_balanced_biases(tmp_path: Path) -> None:
    from safetensors import safe_open

    made = make_tiny(tmp_path, config_overrides=SMALL, routing_prompts=[random_prompts(8, 16, seed=6)])
    name = rb.bias_name(1)
    with safe_open(str(tmp_path / made.weight_map[name]), framework="pt") as f:
        bias = f.get_tensor(name)
    assert bias.dtype == torch.float32
    assert torch.count_nonzero(bias) > 0
    assert float(bias.min()) == 0.0


@pytest.mark.slow
def test_the_quickstart_checkpoint_routes_every_token_set_over_every_expert_and_rank(tmp_path: Path) -> None:
    from transformers import DeepseekV3ForCausalLM

    from r1_ascend.launch.quickstart import convert, make_checkpoint
    from r1_ascend.launch.routing_prompts import prompt_sets

    make_checkpoint(tmp_path / "fp8", "tiny")
    convert(tmp_path / "fp8", tmp_path / "weights")
    model = DeepseekV3ForCausalLM.from_pretrained(str(tmp_path / "weights" / "hf-bf16"), torch_dtype=torch.float32)
    sets = prompt_sets()
    for name, prompts in (("sample", sets["sample"][:64]), ("toy", sets["toy"])):
        for layer, load in rb.routed_tokens(model.eval(), prompts).items():
            shares = load.rank_shares(EP)
            assert load.experts_used >= load.experts * 7 // 8, (name, layer, load.tokens)
            assert min(shares) >= 0.3, (name, layer, shares)
