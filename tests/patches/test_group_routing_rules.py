"""DeepSeek-V3's group-limited routing rule (r1_ascend.patches.rules.group_routing) at its edges: which group scores
megatron-core can reproduce (a quotient of exactly 2, or every group selected), groups with too few experts, values
the user set that agree or disagree with config.json, a config.json that omits keys, and the messages' fix."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from r1_ascend.patches import GroupRoutingConfigError
from r1_ascend.patches.rules.group_routing import (
    ARCHITECTURE,
    GROUP_TOPK,
    HF_DEFAULTS,
    LIMITED_DEVICES,
    NUM_GROUPS,
    PATCH,
    GroupRouting,
    actor_routing,
    is_deepseek_v3,
    megatron_mismatch,
    rollout_routing,
    routing_overrides,
    routing_problem,
)


def model(**keys: Any) -> dict[str, Any]:
    """A config.json: DeepSeek-V3's routing (256 experts, 8 per token, 8 groups, 4 chosen) unless given."""
    return {"architectures": [ARCHITECTURE], "n_routed_experts": 256, "num_experts_per_tok": 8, "n_group": 8,
            "topk_group": 4, **keys}  # fmt: skip


# --- what megatron-core can reproduce ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "reproducible"),
    [
        ({}, True),  # 8 // 4 = 2: the rollout's top-2 group score
        ({"topk_group": 2}, False),  # 8 // 2 = 4
        ({"topk_group": 8}, True),  # every group chosen: the score does not matter
        ({"topk_group": 9}, True),
        ({"num_experts_per_tok": 12, "topk_group": 4}, False),  # 3
        ({"num_experts_per_tok": 9, "topk_group": 4}, True),  # 9 // 4 = 2
    ],
)
def test_megatron_reproduces_a_group_score_of_the_top_2(keys: dict[str, int], reproducible: bool) -> None:
    assert (megatron_mismatch(model(**keys)) is None) is reproducible


def test_a_group_needs_as_many_experts_as_megatron_scores_it_by() -> None:
    """16 experts in 8 groups: 2 per group, the top-2 fits; 8 groups of 1 cannot give a top-2."""
    assert megatron_mismatch(model(n_routed_experts=16)) is None
    found = megatron_mismatch(model(n_routed_experts=8))
    assert found is not None
    assert found.startswith("megatron-core scores each of the n_group=8 groups of 1 experts by its top")
    assert found.endswith("= 2 experts, more than a group has")


@pytest.mark.parametrize("keys", [{"n_group": 0}, {"topk_group": 0}, {"n_group": -8}, {"topk_group": -1}])
def test_group_settings_must_be_positive(keys: dict[str, int]) -> None:
    found = megatron_mismatch(model(**keys))
    assert found is not None
    assert found.endswith("must be positive")


def test_a_mismatch_names_the_quotient() -> None:
    found = megatron_mismatch(model(topk_group=2))
    assert found == (
        "megatron-core 0.12.1 scores a group by its top num_experts_per_tok // topk_group = 8 // 2 = 4 expert scores, "
        "the rollout engine (vLLM, transformers) by its top 2, so they select different groups"
    )


# --- what config.json says -----------------------------------------------------------------------------------------


def test_keys_config_json_omits_take_transformers_defaults() -> None:
    assert rollout_routing({}) == GroupRouting(HF_DEFAULTS["n_group"], HF_DEFAULTS["topk_group"])
    config = SimpleNamespace(n_group=4, topk_group=2)
    assert rollout_routing(config) == GroupRouting(4, 2)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (model(), True),
        (SimpleNamespace(architectures=[ARCHITECTURE]), True),
        (model(architectures=["Qwen2ForCausalLM", ARCHITECTURE]), False),  # verl dispatches on the first
        (model(architectures=[]), False),
        ({"model_type": "deepseek_v3"}, False),
    ],
)
def test_is_deepseek_v3_reads_the_first_architecture(config: Any, expected: bool) -> None:
    assert is_deepseek_v3(config) is expected


def test_grouped_means_a_group_limit_is_set() -> None:
    assert GroupRouting(8, 4).grouped
    assert not GroupRouting(8, None).grouped
    assert not GroupRouting(None, 0).grouped
    assert GroupRouting(8, 4).describe() == "within 4 of 8 expert groups"
    assert GroupRouting(None, None).describe() == f"over all experts ({NUM_GROUPS}=None, {GROUP_TOPK}=None)"


# --- the user's overrides ------------------------------------------------------------------------------------------


def test_overrides_get_the_models_groups() -> None:
    assert routing_overrides(model(), {"other": 1}) == {"other": 1, NUM_GROUPS: 8, GROUP_TOPK: 4}
    assert routing_overrides(model(), {NUM_GROUPS: "8", GROUP_TOPK: 4.0}) == {NUM_GROUPS: 8, GROUP_TOPK: 4}


@pytest.mark.parametrize(("key", "hf_key", "value"), [(NUM_GROUPS, "n_group", 4), (GROUP_TOPK, "topk_group", 2)])
def test_an_override_that_disagrees_with_the_model_is_refused(key: str, hf_key: str, value: int) -> None:
    with pytest.raises(GroupRoutingConfigError) as info:
        routing_overrides(model(), {key: value})
    wanted = model()[hf_key]
    assert str(info.value).startswith(
        f"override_transformer_config sets {key}={value}, but the model's config.json has {hf_key}={wanted}"
    )
    assert f"Remove {key} from override_transformer_config (patch {PATCH} sets it from config.json) or set it to " \
        f"{wanted}." in str(info.value)  # fmt: skip


def test_the_device_limited_routing_is_refused() -> None:
    with pytest.raises(GroupRoutingConfigError, match=rf"sets {LIMITED_DEVICES}=4, with which megatron-core groups"):
        routing_overrides(model(), {LIMITED_DEVICES: 4})
    assert routing_overrides(model(), {LIMITED_DEVICES: None})[NUM_GROUPS] == 8


def test_a_model_megatron_cannot_route_like_the_rollout_is_refused() -> None:
    with pytest.raises(GroupRoutingConfigError, match=r"No setting fixes this at megatron-core 0\.12\.1"):
        routing_overrides(model(topk_group=2), {})


def test_without_the_patch_only_the_overrides_count() -> None:
    assert actor_routing(model(), {}, patched=False) == GroupRouting(None, None)
    assert actor_routing(model(), {NUM_GROUPS: 8, GROUP_TOPK: 4}, patched=False) == GroupRouting(8, 4)
    assert actor_routing(model(), {}, patched=True) == GroupRouting(8, 4)


# --- what preflight says -------------------------------------------------------------------------------------------


def test_the_patch_makes_the_actor_route_like_the_rollout() -> None:
    assert routing_problem(model(), {}, patched=True, where="W") is None


def test_without_the_patch_the_problem_and_the_two_fixes_are_named() -> None:
    found = routing_problem(model(), {}, patched=False, where="actor.override", role="ref")
    assert found is not None
    assert found.startswith("the Megatron ref routes over all experts")
    assert "the rollout engine within 4 of 8 expert groups (config.json n_group=8, topk_group=4)" in found
    assert found.endswith(f"set {NUM_GROUPS}: 8 and {GROUP_TOPK}: 4 in actor.override")


def test_without_a_role_the_actor_is_named() -> None:
    found = routing_problem(model(), {}, patched=False, where="actor.override")
    assert found is not None
    assert found.startswith("the Megatron actor routes over all experts")


def test_refused_overrides_are_named_where_they_are() -> None:
    found = routing_problem(model(), {NUM_GROUPS: 2}, patched=True, where="ref.override")
    assert found is not None
    assert found.startswith("ref.override: override_transformer_config sets moe_router_num_groups=2")


def test_a_model_megatron_cannot_reproduce_is_named_even_when_routing_agrees() -> None:
    found = routing_problem(model(topk_group=2), {NUM_GROUPS: 8, GROUP_TOPK: 2}, patched=False, where="W")
    assert found is not None
    assert found.endswith("No setting fixes this at megatron-core 0.12.1")
    assert found.startswith("megatron-core 0.12.1 scores a group by its top")
