"""Preflight's group_routing check: a DeepSeek-V3 actor and reference must route like the rollout engine."""

from __future__ import annotations

import pytest

from r1_ascend.launch.checks import ERROR, OK, SKIPPED
from r1_ascend.launch.model_info import known_model
from r1_ascend.launch.overlays import DEFAULT_OVERLAY, QWEN_OVERLAY, SMOKE_OVERLAY
from r1_ascend.launch.preflight import run_checks
from r1_ascend.launch.quickstart import SMOKE_ENV
from r1_ascend.launch.smoke_model import DEEPSEEK_V3_DIMS
from r1_ascend.patches.rules.group_routing import PATCH

OTC = "actor_rollout_ref.actor.megatron.override_transformer_config"
OFF = {"R1_ASCEND_DISABLE": PATCH}


def _group_routing(config: str, overrides: list[str], env: dict[str, str]) -> list[tuple[str, str]]:
    findings = run_checks(config, overrides, env=env, check_patches=False)[1]
    return [(f.level, f.message) for f in findings if f.check == "group_routing"]


@pytest.mark.parametrize(("config", "groups"), [(DEFAULT_OVERLAY, (8, 4)), (SMOKE_OVERLAY, (2, 1))])
def test_shipped_deepseek_configs_pass_with_the_patch_and_fail_without(config: str, groups: tuple[int, int]) -> None:
    """Without MODEL_PATH the known model's config.json values are used."""
    passed = _group_routing(config, [], {})
    assert [level for level, _ in passed] == [OK]
    assert f"within {groups[1]} of {groups[0]} expert groups" in passed[0][1]
    for env in (OFF, {"R1_ASCEND_DISABLE_ALL": "1"}):
        failed = _group_routing(config, [], env)
        assert [level for level, _ in failed] == [ERROR, ERROR]  # actor and reference (use_kl_loss)
        actor, ref = (message for _, message in failed)
        for role, message in (("actor", actor), ("ref", ref)):
            assert f"the Megatron {role} routes over all experts" in message
            assert f"config.json n_group={groups[0]}, topk_group={groups[1]}" in message
            assert "the update trains a policy that did not sample" in message
            assert f"remove {PATCH} from R1_ASCEND_DISABLE" in message
            assert f"set moe_router_num_groups: {groups[0]} and moe_router_group_topk: {groups[1]}" in message
            assert f"actor_rollout_ref.{role}.megatron.override_transformer_config" in message


def test_real_model_dir_is_read(smoke_inputs) -> None:
    assert [level for level, _ in _group_routing(SMOKE_OVERLAY, smoke_inputs.overrides(), SMOKE_ENV)] == [OK]
    failed = _group_routing(SMOKE_OVERLAY, smoke_inputs.overrides(), {**SMOKE_ENV, **OFF})
    assert {level for level, _ in failed} == {ERROR}
    assert f"({smoke_inputs.model}/config.json)" in failed[0][1]


def test_explicit_overrides_stand_in_for_the_disabled_patch() -> None:
    overrides = [f"+{OTC}.moe_router_num_groups=2", f"+{OTC}.moe_router_group_topk=1"]
    assert [level for level, _ in _group_routing(SMOKE_OVERLAY, overrides, OFF)] == [OK]
    half = _group_routing(SMOKE_OVERLAY, overrides[:1], OFF)
    assert {level for level, _ in half} == {ERROR}
    assert "moe_router_num_groups=2, moe_router_group_topk=None" in half[0][1]


def test_overrides_that_contradict_the_model_are_refused_with_the_patch() -> None:
    failed = _group_routing(SMOKE_OVERLAY, [f"+{OTC}.moe_router_group_topk=2"], {})
    assert {level for level, _ in failed} == {ERROR}
    assert "sets moe_router_group_topk=2, but the model's config.json has topk_group=1" in failed[0][1]


def test_reference_is_not_checked_without_a_kl_term() -> None:
    overrides = ["actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=false"]
    failed = _group_routing(SMOKE_OVERLAY, overrides, OFF)
    assert len(failed) == 1
    assert "the Megatron actor" in failed[0][1]


def test_mbridge_is_refused() -> None:
    failed = _group_routing(SMOKE_OVERLAY, ["actor_rollout_ref.actor.megatron.use_mbridge=true"], {})
    assert any("use_mbridge=true" in message for level, message in failed if level == ERROR)


def test_dense_model_has_no_routing_finding() -> None:
    assert _group_routing(QWEN_OVERLAY, [], OFF) == []


def test_unknown_model_without_config_is_skipped() -> None:
    """A run configuration with no known model and no MODEL_PATH cannot be checked: it says so."""
    from r1_ascend.launch.checks import Run
    from r1_ascend.launch.group_routing import check_group_routing
    from r1_ascend.launch.overlays import compose

    run = Run(compose(SMOKE_OVERLAY, []), {}, 1.0, config_name="not_a_shipped_config")
    assert [f.level for f in check_group_routing(run)] == [SKIPPED]


def test_known_671b_routing_is_deepseek_v3s() -> None:
    _, config = known_model(DEFAULT_OVERLAY)
    assert (config["n_group"], config["topk_group"]) == (DEEPSEEK_V3_DIMS["n_group"], DEEPSEEK_V3_DIMS["topk_group"])
    assert config["num_experts_per_tok"] == DEEPSEEK_V3_DIMS["num_experts_per_tok"]
