"""rules.expert_load: the per-layer expert-load statistics and their metric names, at their boundaries."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from r1_ascend.patches.rules import expert_load as rule

counts = st.lists(st.integers(min_value=0, max_value=10_000).map(float), min_size=2, max_size=64)


def test_balanced_load_is_one_and_a_hot_expert_is_its_share_times_the_experts() -> None:
    assert rule.max_over_mean([5.0] * 8) == 1.0
    assert rule.max_over_mean([8.0, 0.0, 0.0, 0.0]) == 4.0
    assert rule.max_over_mean([3.0, 1.0]) == 1.5


def test_a_layer_without_tokens_is_infinitely_imbalanced_not_balanced() -> None:
    assert math.isinf(rule.max_over_mean([0.0, 0.0]))


@given(counts)
def test_max_over_mean_is_at_least_one_and_one_only_when_equal(tokens: list[float]) -> None:
    value = rule.max_over_mean(tokens)
    if sum(tokens) == 0:
        assert math.isinf(value)
        return
    assert value >= 1.0 - 1e-12
    assert (abs(value - 1.0) < 1e-12) == (len(set(tokens)) == 1)


def test_experts_without_tokens_counts_zeros_only() -> None:
    assert rule.experts_without_tokens([0.0, 1.0, 0.0, 2.0]) == 2
    assert rule.experts_without_tokens([1.0, 1.0]) == 0


def test_rank_shares_split_the_experts_in_order() -> None:
    """Rank r holds experts r*E/EP .. (r+1)*E/EP - 1, as megatron-core and vLLM place them."""
    assert rule.rank_shares([1.0, 1.0, 0.0, 2.0], 2) == [0.5, 0.5]
    assert rule.rank_shares([3.0, 1.0, 0.0, 0.0], 2) == [1.0, 0.0]
    assert rule.rank_shares([1.0, 2.0, 3.0, 4.0], 4) == [0.1, 0.2, 0.3, 0.4]
    assert rule.rank_shares([0.0, 0.0], 2) == [0.0, 0.0]


@given(counts, st.sampled_from([1, 2]))
def test_rank_shares_sum_to_one(tokens: list[float], ranks: int) -> None:
    tokens = tokens[: len(tokens) - len(tokens) % ranks] or [1.0] * ranks
    shares = rule.rank_shares(tokens, ranks)
    assert len(shares) == ranks
    assert sum(shares) == pytest.approx(1.0 if sum(tokens) else 0.0)


def test_experts_that_do_not_divide_over_the_ranks_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot be split evenly over 3"):
        rule.rank_shares([1.0] * 16, 3)
    with pytest.raises(ValueError, match="over 0"):
        rule.rank_shares([1.0] * 16, 0)


def test_step_metrics_name_every_layer_and_the_worst_of_each() -> None:
    tokens = {1: [4.0, 4.0, 4.0, 4.0], 3: [16.0, 0.0, 0.0, 0.0], 2: [6.0, 2.0, 4.0, 4.0]}
    metrics = rule.step_metrics(tokens, ep_size=2)
    assert metrics[rule.layer_key(1, "max_over_mean")] == 1.0
    assert metrics[rule.layer_key(2, "max_over_mean")] == 1.5
    assert metrics[rule.layer_key(3, "experts_without_tokens")] == 3.0
    assert metrics[rule.layer_key(2, "top_ep_share")] == 0.5
    assert metrics[rule.WORST["max_over_mean"]] == 4.0
    assert metrics[rule.WORST["experts_without_tokens"]] == 3.0
    assert metrics[rule.WORST["top_ep_share"]] == 1.0
    assert metrics[rule.WORST_LAYER] == 3.0
    assert len(metrics) == 3 * len(rule.LAYER_STATISTICS) + len(rule.WORST) + 1


def test_the_worst_layer_is_the_first_of_equally_bad_ones() -> None:
    metrics = rule.step_metrics({5: [2.0, 0.0], 4: [2.0, 0.0]}, ep_size=1)
    assert metrics[rule.WORST_LAYER] == 4.0


def test_no_moe_layer_no_metric() -> None:
    assert rule.step_metrics({}, ep_size=8) == {}


@given(st.integers(min_value=0, max_value=999), st.sampled_from(rule.LAYER_STATISTICS))
def test_layer_keys_parse_back(layer: int, statistic: str) -> None:
    key = rule.layer_key(layer, statistic)
    assert rule.split_layer_metric(key) == (layer, statistic)


@pytest.mark.parametrize("key", ["moe/max_over_mean", "moe/layer_x/max_over_mean", "moe/layer_03/other", "actor/x"])
def test_other_names_are_not_layer_metrics(key: str) -> None:
    assert rule.split_layer_metric(key) is None


def test_layer_keys_sort_in_layer_order_up_to_99() -> None:
    keys = [rule.layer_key(layer, "max_over_mean") for layer in (3, 10, 58)]
    assert sorted(keys) == keys
