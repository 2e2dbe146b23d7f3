"""The ownership rule's pieces that need no vLLM model (impl/weight_ownership.py): regions and their views, how a
tensor is shared among ranks, the expert map against the rule, the forward context's MLA layers. The rule applied to
vLLM's real DeepSeek-V3 class at TP 1, TP 2 / EP 2 and TP 2 x DP 2 / EP 4: tests/model/test_vllm_deepseek_load.py."""

from __future__ import annotations

import types

import pytest
import torch

from r1_ascend.patches.impl import weight_ownership as rule


def test_a_grouped_region_views_one_part_of_every_heads_rows() -> None:
    """MLA's W_UK_T rows of kv_b_proj: of every (nope + v) rows of a head, the first nope."""
    kv_b = torch.arange(8 * 6 * 5, dtype=torch.float32).view(8 * 6, 5)  # 8 heads of (4 nope + 2 v) rows, 5 cols
    region = rule.Region((12, 36), (0, 5), period=6, take=(0, 4))  # heads 2..5
    view = region.of(kv_b)
    assert region.shape == view.shape == (4, 4, 5)
    assert torch.equal(view[1, 2], kv_b[(2 + 1) * 6 + 2])
    weights = region.row_weights(torch.arange(48.0))
    assert weights.shape == (4, 4)
    assert float(weights[1, 2]) == (2 + 1) * 6 + 2
    assert region.numel == 80


def test_a_tensor_is_shared_in_equal_blocks_and_a_padded_vocabulary_up_to_its_real_rows() -> None:
    rows = rule.split((8, 4), 0, 2)
    assert [r.rows for r in rows] == [(0, 4), (4, 8)]
    assert [r.cols for r in rule.split((8, 4), 1, 2)] == [(0, 2), (2, 4)]
    with pytest.raises(rule.OwnershipError, match="does not split into 3 equal blocks"):
        rule.split((8, 4), 0, 3)
    # vocabulary 130 padded to 192 (64 per rank at TP 3): the last rank holds rows 128..130 only
    vocab = rule.split((64, 16), 0, 3, limit=130)
    assert [r.rows for r in vocab] == [(0, 64), (64, 128), (128, 130)]
    assert rule.block((64, 16), 0, 3, 4, limit=130) is None
    assert rule.whole((7,)) == rule.Region(None, (0, 7))
    with pytest.raises(rule.OwnershipError, match="1-D and 2-D"):
        rule.whole((2, 3, 4))


def test_the_expert_map_is_checked_against_the_rule() -> None:
    """EP rank 1 of 2 over 4 experts holds experts 2 and 3 in slots 0 and 1; a map that routes elsewhere is named."""
    expected = {2: 0, 3: 1}
    right = types.SimpleNamespace(global_num_experts=4, expert_map=torch.tensor([-1, -1, 0, 1]))
    assert rule.expert_map_problems("layers.1.mlp.experts", right, expected) == []
    shifted = types.SimpleNamespace(global_num_experts=4, expert_map=torch.tensor([-1, 0, 1, -1]))
    problems = rule.expert_map_problems("layers.1.mlp.experts", shifted, expected)
    assert problems == [
        "layers.1.mlp.experts routes expert 1 to slot 0, the rule to -1",
        "layers.1.mlp.experts routes expert 2 to slot 1, the rule to 0",
        "layers.1.mlp.experts routes expert 3 to slot -1, the rule to 1",
    ]
    whole = types.SimpleNamespace(global_num_experts=2, expert_map=None)  # EP 1: vLLM keeps no map
    assert rule.expert_map_problems("m", whole, {0: 0, 1: 1}) == []


def test_the_forward_contexts_mla_layers_are_found_by_their_layer() -> None:
    impl = types.SimpleNamespace(W_UK_T=None, W_UV=None)
    context = {
        "model.layers.3.self_attn.attn": types.SimpleNamespace(impl=impl),
        "model.layers.4.self_attn.attn": types.SimpleNamespace(impl=types.SimpleNamespace()),  # not MLA
        "lm_head": object(),
    }
    assert rule.mla_context(context) == {3: impl}
    assert rule.layer_of("model.layers.12.mlp.experts.w13_weight") == 12
    assert rule.layer_of("lm_head.weight") is None
