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


def test_a_block_is_whole_along_the_other_axis_in_integer_bounds() -> None:
    x = torch.arange(8 * 4).view(8, 4)
    assert rule.block((8, 4), 1, 1, 2) == rule.Region((0, 8), (2, 4))
    assert rule.block((8, 4), 0, 1, 2) == rule.Region((4, 8), (0, 4))
    assert torch.equal(rule.block((8, 4), 0, 1, 2).of(x), x[4:])  # integer bounds: a float one cannot slice
    assert rule.block((8,), 0, 1, 2) == rule.Region(None, (4, 8))
    assert torch.equal(rule.block((8,), 0, 1, 2).of(torch.arange(8)), torch.arange(4, 8))
    # a padded vocabulary of 128 real rows in blocks of 64: the third block is all padding, so no rank holds it
    assert rule.block((64, 16), 0, 1, 3, limit=128) == rule.Region((64, 128), (0, 16))
    assert rule.block((64, 16), 0, 2, 3, limit=128) is None


def test_a_region_describes_its_rows_columns_and_heads() -> None:
    assert rule.Region(None, (3, 9)).describe() == "cols 3:9"
    assert rule.Region((2, 7), (1, 5)).describe() == "rows 2:7, cols 1:5"
    grouped = rule.Region((12, 36), (0, 5), period=6, take=(0, 4))
    assert grouped.describe() == "rows 12:36 (of every 6, 0:4), cols 0:5"


def test_two_shares_of_one_tensor_on_a_rank_are_refused_naming_both() -> None:
    region = rule.Region((0, 4), (0, 4))
    slots = [
        rule.Slot("w", region, engine, lambda _: torch.zeros(4, 4), torch.float32)
        for engine in ("a.weight", "b.weight")
    ]
    derived = rule.Slot("w", region, "c", lambda _: torch.zeros(4, 4), torch.float32, primary=False)
    ownership = rule.Ownership([slots[0], derived], {}, {}, [])
    assert ownership.primary("w") is slots[0]
    assert ownership.primary("other") is None
    ownership.slots.append(slots[1])
    with pytest.raises(rule.OwnershipError) as refused:
        ownership.primary("w")
    assert str(refused.value) == "w: the rule gives this rank 2 shares of it (['a.weight', 'b.weight']); expected one"


def test_a_moe_layer_without_an_expert_map_holds_every_expert_in_its_own_slot() -> None:
    """vLLM sets no ``expert_map`` attribute at all on some layers (EP 1): read as the identity."""
    layer = types.SimpleNamespace(global_num_experts=3)
    assert rule.expert_map_problems("m", layer, {0: 0, 1: 1, 2: 2}) == []
    assert rule.expert_map_problems("m", layer, {0: 0, 1: 2, 2: 1}) == [
        "m routes expert 1 to slot 1, the rule to 2",
        "m routes expert 2 to slot 2, the rule to 1",
    ]
