"""The rollout's DP/EP layout rule (r1_ascend.patches.rules.dp_layout) at its edges: the smallest world, the first and
last rank, a TP size that does not divide the world, a VLLM_DP_SIZE given as text with spaces, and verl's rollout
settings that would change the layout. The layout of one rank is checked against the rule written out by hand
(rank = dp_rank * tp_size + tp_rank)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from r1_ascend.patches import DpEpConfigError
from r1_ascend.patches.rules.dp_layout import (
    check_env_dp_size,
    check_rollout_config,
    plan_dp_ep_layout,
    rollout_dp_size,
)


def test_one_rank_of_eight_with_tp_2() -> None:
    groups = plan_dp_ep_layout(8, 5, 2)
    assert (groups.world_size, groups.rank, groups.tp_size, groups.dp_size) == (8, 5, 2, 4)
    assert (groups.dp_rank, groups.tp_rank, groups.ep_size, groups.ep_rank) == (2, 1, 8, 5)
    assert groups.tp_group == (4, 5)
    assert groups.dp_group == (1, 3, 5, 7)
    assert groups.ep_group == tuple(range(8))
    assert groups.tp_groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert groups.dp_groups == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert (groups.dp_master_rank, groups.dp_master_ranks) == (1, (0, 1))


def test_the_smallest_world_is_one_rank() -> None:
    groups = plan_dp_ep_layout(1, 0, 1)
    assert (groups.dp_size, groups.tp_group, groups.dp_group, groups.ep_group) == (1, (0,), (0,), (0,))
    with pytest.raises(DpEpConfigError, match="world size must be >= 1, got 0"):
        plan_dp_ep_layout(0, 0, 1)


@pytest.mark.parametrize(("rank", "ok"), [(-1, False), (0, True), (7, True), (8, False)])
def test_the_rank_must_be_inside_the_world(rank: int, ok: bool) -> None:
    if ok:
        assert plan_dp_ep_layout(8, rank, 4).rank == rank
    else:
        with pytest.raises(DpEpConfigError, match=rf"rank {rank} is outside the world of 8 ranks"):
            plan_dp_ep_layout(8, rank, 4)


@pytest.mark.parametrize(("tp", "dp"), [(1, 8), (2, 4), (8, 1)])
def test_the_dp_size_is_the_world_over_the_rollout_tp(tp: int, dp: int) -> None:
    assert rollout_dp_size(8, tp) == dp


@pytest.mark.parametrize("tp", [0, -2])
def test_the_rollout_tp_must_be_positive(tp: int) -> None:
    with pytest.raises(DpEpConfigError, match=rf"tensor_model_parallel_size must be >= 1, got {tp}"):
        rollout_dp_size(8, tp)


def test_a_tp_that_does_not_divide_the_world_is_refused_with_the_fix() -> None:
    with pytest.raises(DpEpConfigError) as info:
        rollout_dp_size(12, 8)
    assert "the world size 12 is not divisible by the rollout tensor-parallel size 8" in str(info.value)
    assert "to a divisor of 12 (nodes x NPUs per node)" in str(info.value)


@pytest.mark.parametrize("raw", [None, "", "   ", "4", " 4 ", 4])
def test_an_unset_or_matching_vllm_dp_size_is_accepted(raw: str | int | None) -> None:
    check_env_dp_size(raw, dp_size=4, world_size=8, tp_size=2)
    assert plan_dp_ep_layout(8, 0, 2, raw).dp_size == 4


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("3", "VLLM_DP_SIZE=3 disagrees with the running job: world size 8 / rollout tensor_model_parallel_size 2 = "
         "DP 4"),
        (5, "VLLM_DP_SIZE=5 disagrees"),
        ("four", "VLLM_DP_SIZE='four' is not an integer"),
        ("4.0", "VLLM_DP_SIZE='4.0' is not an integer"),
    ],
)  # fmt: skip
def test_any_other_vllm_dp_size_is_refused_with_the_value_to_set(raw: str | int, expected: str) -> None:
    with pytest.raises(DpEpConfigError) as info:
        plan_dp_ep_layout(8, 0, 2, raw)
    assert expected in str(info.value)
    assert "Unset VLLM_DP_SIZE (r1-ascend derives it from the world size) or set it to 4" in str(info.value)


# --- verl's rollout settings -------------------------------------------------------------------------------------


@pytest.mark.parametrize("as_mapping", [True, False], ids=["mapping", "attributes"])
def test_the_rollout_tp_is_returned_from_a_valid_config(as_mapping: bool) -> None:
    values = {"tensor_model_parallel_size": "4", "data_parallel_size": 1, "pipeline_model_parallel_size": 1}
    config = values if as_mapping else SimpleNamespace(**values)
    assert check_rollout_config(config) == 4
    assert check_rollout_config({} if as_mapping else SimpleNamespace()) == 1  # verl's defaults


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("data_parallel_size", 2, "actor_rollout_ref.rollout.data_parallel_size=2, expected 1"),
        ("pipeline_model_parallel_size", 2, "actor_rollout_ref.rollout.pipeline_model_parallel_size=2, expected 1"),
        ("tensor_model_parallel_size", "two", "actor_rollout_ref.rollout.tensor_model_parallel_size='two' is not an"),
        ("data_parallel_size", None, "actor_rollout_ref.rollout.data_parallel_size=None is not an integer"),
    ],
)
def test_rollout_settings_that_change_the_layout_are_refused(key: str, value: object, expected: str) -> None:
    with pytest.raises(DpEpConfigError) as info:
        check_rollout_config({key: value})
    assert str(info.value).startswith(expected)
