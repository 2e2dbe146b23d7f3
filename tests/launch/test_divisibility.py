"""The layout divisibility rules: fuzzed against an independent oracle (divisor sets built by multiplication, no
``%``), against the upstream code that enforces them (Megatron-core's TransformerConfig, vLLM's ModelConfig), and
pinned at the boundaries on both sides, so switching a rule off or shifting it by one fails a test."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from r1_ascend.launch.divisibility import (
    divides,
    expert_split_problems,
    head_split_problems,
    largest_head_tp,
    world_split_problems,
)
from r1_ascend.launch.upstream_checks import vllm_head_refusal

sizes = st.integers(min_value=1, max_value=300)
parallel = st.integers(min_value=0, max_value=64)


def multiples_up_to(divisor: int, limit: int) -> set[int]:
    """Oracle: every multiple of ``divisor`` up to ``limit``, by repeated addition."""
    if divisor < 1:
        return set()
    found, value = set(), divisor
    while value <= limit:
        found.add(value)
        value += divisor
    return found


def oracle_divides(divisor: int, value: int) -> bool:
    return value in multiples_up_to(divisor, value)


@given(heads=sizes, groups=st.none() | sizes, tp=parallel)
def test_head_split_matches_the_oracle(heads, groups, tp):
    expected_ok = oracle_divides(tp, heads) and (groups is None or oracle_divides(tp, groups))
    assert (head_split_problems(heads, groups, tp) == []) is expected_ok


@given(heads=sizes, groups=st.none() | sizes, tp=parallel, world=st.integers(min_value=1, max_value=512))
def test_largest_head_tp_is_the_largest_valid_size_not_above_tp(heads, groups, tp, world):
    good = largest_head_tp(heads, groups, tp, world)
    valid = [
        c
        for c in range(1, max(tp, 1) + 1)
        if oracle_divides(c, heads) and (groups is None or oracle_divides(c, groups)) and oracle_divides(c, world)
    ]
    assert good == max(valid)  # 1 is always valid


@given(experts=st.integers(min_value=1, max_value=512), ep=parallel, rollout_ep=st.none() | parallel)
def test_expert_split_matches_the_oracle(experts, ep, rollout_ep):
    expected_ok = oracle_divides(ep, experts) and (rollout_ep is None or oracle_divides(rollout_ep, experts))
    assert (expert_split_problems(experts, ep, rollout_ep) == []) is expected_ok


@given(
    world=st.integers(min_value=1, max_value=512),
    tp=st.integers(min_value=1, max_value=16),
    pp=st.integers(min_value=1, max_value=16),
    cp=st.integers(min_value=1, max_value=4),
    ep=st.integers(min_value=1, max_value=64),
    etp=st.integers(min_value=1, max_value=8),
)
def test_world_split_matches_the_oracle(world, tp, pp, cp, ep, etp):
    expected_ok = oracle_divides(tp * pp * cp, world) and oracle_divides(pp * ep * etp, world)
    assert (world_split_problems(world, tp, pp, cp, ep, etp) == []) is expected_ok


# --- boundaries on both sides (28 heads / 4 KV heads as Qwen2.5-7B, 256 experts as DeepSeek-V3) ---------------


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_qwen_heads_split_by_common_divisors(tp):
    assert head_split_problems(28, 4, tp) == []


@pytest.mark.parametrize("tp", [0, 3, 5, 7, 8, 14, 27, 28, 29])
def test_qwen_heads_refuse_non_divisors_of_the_kv_heads(tp):
    assert head_split_problems(28, 4, tp) != []


@pytest.mark.parametrize(("tp", "ok"), [(7, True), (14, True), (28, True), (27, False), (29, False), (56, False)])
def test_attention_heads_alone_at_the_boundary(tp, ok):
    assert (head_split_problems(28, None, tp) == []) is ok


@pytest.mark.parametrize(("ep", "ok"), [(1, True), (255, False), (256, True), (257, False), (128, True), (3, False)])
def test_experts_at_the_boundary(ep, ok):
    assert (expert_split_problems(256, ep, None) == []) is ok
    assert (expert_split_problems(256, 1, ep) == []) is ok


@pytest.mark.parametrize(("value", "ok"), [(16, True), (15, False), (17, False), (32, True), (33, False)])
def test_divides_at_the_boundary(value, ok):
    assert divides(16, value) is ok


def test_divides_refuses_sizes_below_one():
    assert not divides(0, 16)
    assert not divides(-2, 16)


# --- agreement with the upstream code that enforces the rules --------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(heads=st.integers(min_value=1, max_value=160), tp=st.integers(min_value=1, max_value=40))
def test_rollout_rule_agrees_with_vllms_own_check(heads, tp):
    assert (vllm_head_refusal(heads, tp) is None) is (head_split_problems(heads, None, tp) == [])


@pytest.fixture(scope="module")
def transformer_config():
    """Megatron-core's real TransformerConfig (imports torch: ~15 s on a busy login node, once)."""
    module = pytest.importorskip("megatron.core.transformer.transformer_config")
    return module.TransformerConfig


@settings(max_examples=60, deadline=None)
@given(
    heads_per_group=st.integers(min_value=1, max_value=8),
    groups=st.integers(min_value=1, max_value=16),
    tp=st.integers(min_value=1, max_value=32),
)
def test_actor_rule_agrees_with_megatrons_transformer_config(transformer_config, heads_per_group, groups, tp):
    heads = heads_per_group * groups  # Megatron requires heads to be a multiple of the query groups
    refusal = ""
    try:
        transformer_config(
            num_layers=2,
            hidden_size=heads * 8,
            num_attention_heads=heads,
            num_query_groups=groups,
            tensor_model_parallel_size=tp,
        )
        accepted = True
    except ValueError as exc:
        refusal = str(exc)
        accepted = False
    assert accepted or "tensor_model_parallel_size" in refusal
    assert accepted is (head_split_problems(heads, groups, tp) == [])
