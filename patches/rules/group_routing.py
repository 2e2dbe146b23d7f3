"""DeepSeek-V3's group-limited expert routing: what the rollout routes with, what the Megatron actor gets, and
whether the two agree (patch ``verl_dpskv3_group_routing``).

DeepSeek-V3 splits its routed experts into ``n_group`` groups and lets each token choose experts only within the
``topk_group`` best groups; vLLM and transformers read both from the HF config. megatron-core calls them
``moe_router_num_groups`` and ``moe_router_group_topk`` and routes over all experts when they are unset, which is
what verl 0.6.1's DeepSeek-V3 converter leaves them. The patch, ``r1-ascend preflight`` and the tests ask these
functions, so the rule has one definition. Pure: no torch, verl or transformers import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import GroupRoutingConfigError

__all__ = [
    "ARCHITECTURE",
    "GROUP_TOPK",
    "NUM_GROUPS",
    "PATCH",
    "GroupRouting",
    "actor_routing",
    "is_deepseek_v3",
    "megatron_mismatch",
    "rollout_routing",
    "routing_overrides",
    "routing_problem",
]

#: The patch that makes verl's converter set the two fields (the ``R1_ASCEND_DISABLE`` token).
PATCH = "verl_dpskv3_group_routing"
#: ``architectures[0]`` with which verl dispatches to ``hf_to_mcore_config_dpskv3``.
ARCHITECTURE = "DeepseekV3ForCausalLM"
NUM_GROUPS = "moe_router_num_groups"
GROUP_TOPK = "moe_router_group_topk"
#: megatron-core's older spelling (groups = EP size); with it set, the actor's groups are not the model's.
LIMITED_DEVICES = "moe_router_topk_limited_devices"
#: transformers 4.52.4 ``DeepseekV3Config`` defaults: ``AutoConfig`` (and so vLLM and verl) uses them for keys a
#: ``config.json`` omits.
HF_DEFAULTS: Mapping[str, int] = {"n_routed_experts": 256, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4}
#: transformers' and vLLM's DeepSeek-V3 routers score a group by the sum of its top-2 expert scores.
ROLLOUT_GROUP_SCORE_TOPK = 2
CONSEQUENCE = "actor and rollout log-probs of the same tokens differ, so the update trains a policy that did not sample"


@dataclass(frozen=True)
class GroupRouting:
    """Group-limited routing settings; ``group_topk`` None means routing over all experts (megatron-core)."""

    num_groups: int | None
    group_topk: int | None

    @property
    def grouped(self) -> bool:
        return bool(self.group_topk)

    def describe(self) -> str:
        if not self.grouped:
            return f"over all experts ({NUM_GROUPS}={self.num_groups}, {GROUP_TOPK}={self.group_topk})"
        return f"within {self.group_topk} of {self.num_groups} expert groups"


def _value(hf_config: Any, key: str) -> Any:
    """A key of an HF config given as ``config.json`` contents or as a ``PretrainedConfig``."""
    if isinstance(hf_config, Mapping):
        return hf_config.get(key, HF_DEFAULTS.get(key))
    return getattr(hf_config, key, HF_DEFAULTS.get(key))


def is_deepseek_v3(hf_config: Any) -> bool:
    """Whether verl 0.6.1 builds this model's Megatron config with its DeepSeek-V3 converter."""
    architectures = _value(hf_config, "architectures") or []
    return bool(architectures) and architectures[0] == ARCHITECTURE


def rollout_routing(hf_config: Any) -> GroupRouting:
    """How the rollout engine routes: ``n_group`` / ``topk_group`` of the HF config."""
    return GroupRouting(int(_value(hf_config, "n_group")), int(_value(hf_config, "topk_group")))


def _explicit(overrides: Mapping[str, Any], key: str) -> int | None:
    value = overrides.get(key)
    return None if value is None else int(value)


def routing_overrides(hf_config: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``overrides`` plus the HF config's group routing, as the patch passes them to verl's converter.

    Values the user set explicitly stay; a value that differs from the HF config, or the deprecated
    ``moe_router_topk_limited_devices``, is a ``GroupRoutingConfigError`` saying what to change; so is a model whose
    routing megatron-core cannot reproduce (``megatron_mismatch``).
    """
    expected = rollout_routing(hf_config)
    if overrides.get(LIMITED_DEVICES) is not None:
        msg = (
            f"override_transformer_config sets {LIMITED_DEVICES}={overrides[LIMITED_DEVICES]}, with which "
            f"megatron-core groups the experts by expert-parallel rank instead of by the model's n_group="
            f"{expected.num_groups} / topk_group={expected.group_topk}; the actor would route differently from the "
            f"rollout engine. Remove {LIMITED_DEVICES} (patch {PATCH} sets {NUM_GROUPS} and {GROUP_TOPK} from "
            "config.json)."
        )
        raise GroupRoutingConfigError(msg)
    wanted = {NUM_GROUPS: expected.num_groups, GROUP_TOPK: expected.group_topk}
    for key, hf_key in ((NUM_GROUPS, "n_group"), (GROUP_TOPK, "topk_group")):
        given = _explicit(overrides, key)
        if given is not None and given != wanted[key]:
            msg = (
                f"override_transformer_config sets {key}={given}, but the model's config.json has {hf_key}="
                f"{wanted[key]}, which the rollout engine routes with: {CONSEQUENCE}. Remove {key} from "
                f"override_transformer_config (patch {PATCH} sets it from config.json) or set it to {wanted[key]}."
            )
            raise GroupRoutingConfigError(msg)
    mismatch = megatron_mismatch(hf_config)
    if mismatch is not None:
        msg = f"{mismatch}: {CONSEQUENCE}. No setting fixes this at megatron-core 0.12.1."
        raise GroupRoutingConfigError(msg)
    return {**overrides, **wanted}


def actor_routing(hf_config: Any, overrides: Mapping[str, Any], *, patched: bool) -> GroupRouting:
    """How verl's Megatron actor routes this DeepSeek-V3 model given its ``override_transformer_config``.

    ``patched``: whether ``verl_dpskv3_group_routing`` is enabled. Without it verl 0.6.1 sets neither field, so only
    the overrides count (by default: unset, routing over all experts). Raises ``GroupRoutingConfigError`` where
    the patch would refuse the overrides.
    """
    if patched:
        chosen = routing_overrides(hf_config, overrides)
        return GroupRouting(chosen[NUM_GROUPS], chosen[GROUP_TOPK])
    return GroupRouting(_explicit(overrides, NUM_GROUPS), _explicit(overrides, GROUP_TOPK))


def megatron_mismatch(hf_config: Any) -> str | None:
    """Why megatron-core 0.12.1 cannot route like the rollout even with the HF group settings, or None.

    megatron-core scores a group by the sum of its top ``num_experts_per_tok // topk_group`` expert scores,
    transformers and vLLM by its top 2: the selected groups agree when that quotient is 2, or when every group is
    selected anyway (``topk_group >= n_group``). megatron-core also needs that many experts in each group.
    """
    routing = rollout_routing(hf_config)
    experts, topk = int(_value(hf_config, "n_routed_experts")), int(_value(hf_config, "num_experts_per_tok"))
    if not (routing.num_groups and routing.group_topk and routing.num_groups > 0 and routing.group_topk > 0):
        return f"config.json n_group={routing.num_groups} and topk_group={routing.group_topk} must be positive"
    per_group_topk = topk // routing.group_topk
    group_size = experts // routing.num_groups
    if per_group_topk > group_size:
        return (
            f"megatron-core scores each of the n_group={routing.num_groups} groups of {group_size} experts by its top "
            f"num_experts_per_tok // topk_group = {topk} // {routing.group_topk} = {per_group_topk} experts, more "
            "than a group has"
        )
    if routing.group_topk < routing.num_groups and per_group_topk != ROLLOUT_GROUP_SCORE_TOPK:
        return (
            f"megatron-core 0.12.1 scores a group by its top num_experts_per_tok // topk_group = {topk} // "
            f"{routing.group_topk} = {per_group_topk} expert scores, the rollout engine (vLLM, transformers) by its "
            f"top {ROLLOUT_GROUP_SCORE_TOPK}, so they select different groups"
        )
    return None


def routing_problem(
    hf_config: Any, overrides: Mapping[str, Any], *, patched: bool, where: str, role: str = "actor"
) -> str | None:
    """Why the Megatron ``role`` (actor, ref) of this DeepSeek-V3 model routes differently from the rollout engine,
    or None. ``where`` names its ``override_transformer_config`` in the run config (for the message).
    """
    try:
        actor = actor_routing(hf_config, overrides, patched=patched)
    except GroupRoutingConfigError as exc:
        return f"{where}: {exc}"
    rollout = rollout_routing(hf_config)
    if actor != rollout:  # only without the patch: with it, the overrides either agree or raised above
        return (
            f"the Megatron {role} routes {actor.describe()}, the rollout engine {rollout.describe()} (config.json "
            f"n_group={rollout.num_groups}, topk_group={rollout.group_topk}): {CONSEQUENCE}. Patch {PATCH} is "
            f"disabled and {where} does not set both to the model's values. Fix: enable the patch (remove {PATCH} "
            f"from R1_ASCEND_DISABLE, unset R1_ASCEND_DISABLE_ALL) or set {NUM_GROUPS}: {rollout.num_groups} and "
            f"{GROUP_TOPK}: {rollout.group_topk} in {where}"
        )
    mismatch = megatron_mismatch(hf_config)
    return None if mismatch is None else f"{mismatch}: {CONSEQUENCE}. No setting fixes this at megatron-core 0.12.1"
