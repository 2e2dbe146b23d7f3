"""verl_dpskv3_group_routing: verl's Megatron DeepSeek-V3 config routes within the model's expert groups.

Everything runs verl 0.6.1's real ``hf_to_mcore_config`` (its DeepSeek-V3 converter and megatron-core 0.12.1's
``MLATransformerConfig.__post_init__``) on transformers' ``DeepseekV3Config``, inside a one-rank gloo world with
Megatron's parallel state built (the converter reads the parallel sizes from it). The routing comparison runs
megatron-core's own top-k router function against transformers' own ``DeepseekV3TopkRouter`` on the same scores.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from r1_ascend.launch.smoke_model import DEEPSEEK_V3_DIMS, smoke_model_config
from r1_ascend.patches import (
    GroupRoutingConfigError,
    PatchError,
    Status,
    apply_all,
    apply_one,
    patched_by,
    spec_by_name,
)
from r1_ascend.patches.rules import group_routing as rule

SPEC = spec_by_name(rule.PATCH)
NUM_GROUPS, GROUP_TOPK = rule.NUM_GROUPS, rule.GROUP_TOPK

#: DeepSeek-V3 671B as its published config.json gives it (61 layers, 3 dense, 256 experts, 8 of 8 groups / 4).
DEEPSEEK_V3_671B = {**DEEPSEEK_V3_DIMS, "num_hidden_layers": 61, "first_k_dense_replace": 3, "n_routed_experts": 256}


def hf_config(**overrides: Any) -> Any:
    from transformers import DeepseekV3Config

    return DeepseekV3Config(**smoke_model_config(**overrides))


@pytest.fixture(scope="module")
def megatron_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One gloo rank with Megatron's parallel state, as verl's worker has it before building the config."""
    from megatron.core import parallel_state as mpu

    init = tmp_path_factory.mktemp("pg") / "store"
    torch.distributed.init_process_group("gloo", init_method=f"file://{init}", rank=0, world_size=1)
    mpu.initialize_model_parallel()
    yield
    mpu.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def convert(hf: Any, **overrides: Any) -> Any:
    """What verl's Megatron worker calls (``verl.models.mcore.hf_to_mcore_config``, imported at call time)."""
    from verl.models.mcore import hf_to_mcore_config

    return hf_to_mcore_config(hf, torch.float32, **overrides)


def routing(tf_config: Any) -> tuple[Any, Any]:
    return getattr(tf_config, NUM_GROUPS), getattr(tf_config, GROUP_TOPK)


# --- stock verl, the patch, the switch -----------------------------------------------------------------------------


def test_stock_verl_routes_deepseek_v3_over_all_experts(megatron_world: None) -> None:
    """The defect: verl 0.6.1's converter leaves both fields unset (megatron-core: no group limit)."""
    assert routing(convert(hf_config())) == (None, None)


@pytest.mark.parametrize(
    ("dims", "expected"),
    [({}, (2, 1)), (DEEPSEEK_V3_671B, (8, 4))],
    ids=["smoke-model", "deepseek-v3-671b"],
)
def test_patch_gives_the_hf_groups_to_every_verl_entry(
    megatron_world: None, dims: dict[str, Any], expected: tuple[int, int]
) -> None:
    import verl.models.mcore as mcore
    from verl.models.mcore import registry

    assert apply_one(SPEC) is Status.APPLIED
    hf = hf_config(**dims)
    assert (hf.n_group, hf.topk_group) == expected
    # the worker's call-time import, the registry's own name (get_mcore_weight_converter) are the same function
    assert mcore.hf_to_mcore_config is registry.hf_to_mcore_config
    assert patched_by(registry.hf_to_mcore_config) == SPEC.name
    tf_config = convert(hf)
    assert type(tf_config).__name__ == "MLATransformerConfig"
    assert routing(tf_config) == expected
    assert routing(registry.hf_to_mcore_config(hf, torch.float32)) == expected


def test_switched_off_patch_leaves_stock_verl(megatron_world: None) -> None:
    from verl.models.mcore import registry

    stock = registry.hf_to_mcore_config
    results = apply_all(disabled=[SPEC.name], specs=(SPEC,))
    assert [r.status for r in results] == [Status.DISABLED]
    assert registry.hf_to_mcore_config is stock
    assert routing(convert(hf_config())) == (None, None)


def test_megatron_core_validation_still_runs_on_the_patched_config(megatron_world: None) -> None:
    """The values go through megatron-core's __post_init__: 3 groups cannot divide 16 experts."""
    apply_one(SPEC)
    with pytest.raises(AssertionError, match=r"num_moe_experts \(16\) should be divisible by moe_router_num_groups"):
        convert(hf_config(n_group=3, topk_group=1))


@pytest.mark.parametrize(
    "overrides",
    [{NUM_GROUPS: 2, GROUP_TOPK: 1}, {NUM_GROUPS: 2}, {GROUP_TOPK: 1}, {NUM_GROUPS: None, GROUP_TOPK: None}],
    ids=["both", "groups-only", "topk-only", "explicit-null"],
)
def test_explicit_overrides_equal_to_the_model_pass(megatron_world: None, overrides: dict[str, Any]) -> None:
    apply_one(SPEC)
    assert routing(convert(hf_config(), **overrides)) == (2, 1)


@pytest.mark.parametrize(
    ("key", "value", "hf_key", "hf_value"), [(NUM_GROUPS, 4, "n_group", 2), (GROUP_TOPK, 2, "topk_group", 1)]
)
def test_conflicting_overrides_are_refused_with_the_fix(
    megatron_world: None, key: str, value: int, hf_key: str, hf_value: int
) -> None:
    apply_one(SPEC)
    with pytest.raises(GroupRoutingConfigError) as info:
        convert(hf_config(), **{key: value})
    message = str(info.value)
    assert f"sets {key}={value}, but the model's config.json has {hf_key}={hf_value}" in message
    assert "the update trains a policy that did not sample" in message
    assert f"Remove {key} from override_transformer_config" in message
    assert f"or set it to {hf_value}" in message


def test_deprecated_device_limit_is_refused(megatron_world: None) -> None:
    apply_one(SPEC)
    with pytest.raises(GroupRoutingConfigError, match="moe_router_topk_limited_devices=2"):
        convert(hf_config(), moe_router_topk_limited_devices=2)


def test_other_architectures_pass_through(megatron_world: None) -> None:
    from transformers import Qwen2Config

    apply_one(SPEC)
    qwen = Qwen2Config(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2
    )
    qwen.architectures = ["Qwen2ForCausalLM"]
    tf_config = convert(qwen, moe_router_num_groups=None)
    assert type(tf_config).__name__ == "TransformerConfig"
    assert routing(tf_config) == (None, None)


def test_converter_that_drops_the_overrides_is_stopped(megatron_world: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Drift: a DeepSeek-V3 converter that stops applying the overrides makes the patch fail, not run ungrouped."""
    from verl.models.mcore import registry

    stock = registry.MODEL_CONFIG_CONVERTER_REGISTRY[registry.SupportedModel.DEEPSEEK_V3]

    def drifted(hf: Any, dtype: Any, **kwargs: Any) -> Any:
        kwargs.pop(NUM_GROUPS, None)
        kwargs.pop(GROUP_TOPK, None)
        return stock(hf, dtype, **kwargs)

    monkeypatch.setitem(registry.MODEL_CONFIG_CONVERTER_REGISTRY, registry.SupportedModel.DEEPSEEK_V3, drifted)
    apply_one(SPEC)
    with pytest.raises(PatchError, match="no longer passes these overrides through") as info:
        convert(hf_config())
    assert f"R1_ASCEND_DISABLE={SPEC.name}" in str(info.value)


# --- the routing itself: megatron-core's router against transformers' ------------------------------------------


def _megatron_experts(tf_config: Any, logits: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Which experts megatron-core 0.12.1's router picks per token under ``tf_config`` (routing map)."""
    from megatron.core.transformer.moe.moe_utils import topk_softmax_with_capacity

    _, routing_map, _ = topk_softmax_with_capacity(
        logits,
        tf_config.moe_router_topk,
        use_pre_softmax=tf_config.moe_router_pre_softmax,
        num_groups=tf_config.moe_router_num_groups,
        group_topk=tf_config.moe_router_group_topk,
        scaling_factor=tf_config.moe_router_topk_scaling_factor,
        score_function=tf_config.moe_router_score_function,
        expert_bias=bias,
    )
    return routing_map


def _rollout_experts(hf: Any, logits: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Which experts transformers' DeepSeek-V3 router (the rollout's rule) picks per token (routing map)."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    router = DeepseekV3TopkRouter(hf)
    router.e_score_correction_bias.copy_(bias)
    indices = router.get_topk_indices(logits.sigmoid())
    return torch.zeros_like(logits, dtype=torch.bool).scatter(1, indices, True)


def _scores(experts: int, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=generator)
    bias = torch.rand(experts, generator=generator) * 0.1  # positive, as transformers masks unselected groups with 0
    return logits, bias


def test_stock_actor_picks_experts_the_rollout_never_would(megatron_world: None) -> None:
    hf = hf_config(**DEEPSEEK_V3_671B)
    logits, bias = _scores(256, 64, seed=0)
    stock = _megatron_experts(convert(hf), logits, bias)
    assert not torch.equal(stock, _rollout_experts(hf, logits, bias))
    apply_one(SPEC)
    assert torch.equal(_megatron_experts(convert(hf), logits, bias), _rollout_experts(hf, logits, bias))


@st.composite
def routed_models(draw: st.DrawFn) -> dict[str, int]:
    """Group-routed DeepSeek-V3 shapes transformers can route: groups of >= 2 experts, enough experts in the
    selected groups for num_experts_per_tok."""
    n_group = draw(st.integers(1, 8))
    group_size = draw(st.integers(2, 8))
    topk_group = draw(st.integers(1, n_group))
    topk = draw(st.integers(1, topk_group * group_size))
    return {
        "n_routed_experts": n_group * group_size,
        "n_group": n_group,
        "topk_group": topk_group,
        "num_experts_per_tok": topk,
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=routed_models(), seed=st.integers(0, 2**16))
def test_patched_actor_routes_like_the_rollout_whenever_the_rule_allows(
    megatron_world: None, model: dict[str, int], seed: int
) -> None:
    """Where the rule accepts a shape, the patched config makes megatron-core pick exactly transformers' experts;
    where it does not, the patch refuses instead of building an actor that routes differently."""
    hf = hf_config(**model)
    apply_one(SPEC)
    if rule.megatron_mismatch(hf) is not None:
        with pytest.raises(GroupRoutingConfigError, match="No setting fixes this"):
            convert(hf)
        return
    tf_config = convert(hf)
    assert routing(tf_config) == (model["n_group"], model["topk_group"])
    logits, bias = _scores(model["n_routed_experts"], 16, seed)
    assert torch.equal(_megatron_experts(tf_config, logits, bias), _rollout_experts(hf, logits, bias))


def test_group_scores_megatron_cannot_reproduce_are_real() -> None:
    """The rule's refusal is not over-cautious: 2 groups of 4, 4 experts from 1 group. transformers scores a group by
    its top 2 (group A: 0.9 + 0.9 wins), megatron-core by its top 4 // 1 = 4 (group B: 4 x 0.8 wins)."""
    from megatron.core.transformer.moe.moe_utils import group_limited_topk

    hf = hf_config(n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=4)
    assert "top 2" in (rule.megatron_mismatch(hf) or "")
    scores = torch.tensor([[0.9, 0.9, 0.1, 0.1, 0.8, 0.8, 0.8, 0.8]])
    _, megatron = group_limited_topk(scores, topk=4, num_tokens=1, num_experts=8, num_groups=2, group_topk=1)
    assert set(megatron[0].tolist()) == {4, 5, 6, 7}
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    assert set(DeepseekV3TopkRouter(hf).get_topk_indices(scores)[0].tolist()) == {0, 1, 2, 3}


# --- the pure rule ----------------------------------------------------------------------------------------------


def test_rule_names_this_patch_and_transformers_defaults() -> None:
    """Preflight reads raw config.json: keys it omits take transformers' defaults, as AutoConfig gives vLLM."""
    from transformers import DeepseekV3Config

    defaults = DeepseekV3Config()
    assert {k: getattr(defaults, k) for k in rule.HF_DEFAULTS} == dict(rule.HF_DEFAULTS)
    assert rule.rollout_routing({"architectures": [rule.ARCHITECTURE]}) == rule.GroupRouting(8, 4)
    assert SPEC.name == rule.PATCH


def test_rule_without_the_patch_follows_the_overrides_only() -> None:
    config = smoke_model_config()
    assert rule.actor_routing(config, {}, patched=False) == rule.GroupRouting(None, None)
    assert rule.actor_routing(config, {NUM_GROUPS: 2, GROUP_TOPK: 1}, patched=False) == rule.GroupRouting(2, 1)
    assert rule.actor_routing(config, {}, patched=True) == rule.GroupRouting(2, 1)
    assert rule.routing_problem(config, {NUM_GROUPS: 2, GROUP_TOPK: 1}, patched=False, where="x") is None
    assert "over all experts" in (rule.routing_problem(config, {}, patched=False, where="x") or "")


def test_is_deepseek_v3_follows_verls_dispatch(tmp_path: Path) -> None:
    assert rule.is_deepseek_v3(smoke_model_config())
    assert rule.is_deepseek_v3(hf_config())
    assert not rule.is_deepseek_v3({"architectures": ["Qwen2ForCausalLM"]})
    assert not rule.is_deepseek_v3({})
