"""Give verl's Megatron DeepSeek-V3 the model's group-limited routing, as the rollout engine has it.

Target:
verl.models.mcore.registry.hf_to_mcore_config — verl's dispatcher from an HF config to a megatron-core
TransformerConfig (it picks the converter from MODEL_CONFIG_CONVERTER_REGISTRY by architecture); alias
verl.models.mcore.hf_to_mcore_config, which MegatronWorker._init_hf_config_and_tf_config (actor, reference,
critic, reward model) and the Megatron engine's _build_tf_config import at call time; registry's own
get_mcore_weight_converter calls it by its module-global name.

Upstream:
verl 0.6.1 (verl/models/mcore/config_converter.py, hf_to_mcore_config_dpskv3), megatron-core 0.12.1
(TransformerConfig.moe_router_num_groups / moe_router_group_topk, validated in __post_init__; group scoring in
transformer/moe/moe_utils.py group_limited_topk).

Process:
worker (every Ray worker that builds a Megatron model: actor and reference, colocated with the rollout).

Why:
DeepSeek-V3 routes each token only within the topk_group best of n_group expert groups (8 and 4), and so do
vLLM and transformers, which read both from config.json. verl 0.6.1's hf_to_mcore_config_dpskv3 never sets
megatron-core's moe_router_num_groups / moe_router_group_topk, so the Megatron actor and reference route over all
experts: a different model from the one that sampled. Measured on a tiny DeepSeek-V3 in fp32 with the same
weights, Megatron against transformers: max logit gap 0.35, mean |delta log-prob| 0.05 nat, argmax agreement
66 %; with both fields set, 4e-7. None of the recipes set them.

How:
wraps the dispatcher, not the converter: verl's converter registry holds a reference to
hf_to_mcore_config_dpskv3, so rebinding that module attribute would miss every caller. For an HF config whose
architecture is DeepseekV3ForCausalLM the wrapper adds moe_router_num_groups = n_group and
moe_router_group_topk = topk_group to the override_transformer_config keyword arguments and calls the stock
dispatcher, so verl's converter applies them like any override and megatron-core's own __post_init__ validates
them (groups divide the experts, group_topk <= num_groups). Values the user set explicitly are kept when they
equal the HF config's and refused otherwise (GroupRoutingConfigError naming the key, both values and the fix);
so are moe_router_topk_limited_devices and models whose group scoring megatron-core 0.12.1 cannot reproduce
(it scores a group by its top num_experts_per_tok // topk_group experts, the rollout by its top 2). Afterwards
the wrapper checks that the returned config carries both values, so upstream dropping them (verl removes keys
the installed megatron-core does not know) fails loudly. Other architectures pass through untouched. The rule is
r1_ascend.patches.rules.group_routing, which r1-ascend preflight asks too. verl's offline model merger keeps its
own import-time copy of the dispatcher and is not reached; it only loads and saves weights, where routing plays
no part.

Upstream fix:
none — hf_to_mcore_config_dpskv3 sets neither field at verl 0.6.1, 0.7.0 or main as of b178a3cd (2026-01-29).

Remove when:
verl's hf_to_mcore_config_dpskv3 passes moe_router_num_groups=hf_config.n_group and
moe_router_group_topk=hf_config.topk_group to MLATransformerConfig; then delete this module, its registry entry
and tests/patches/test_verl_dpskv3_group_routing.py, and make rules.group_routing.actor_routing treat the stock
converter as grouped (preflight keeps comparing actor and rollout routing).

Disable:
R1_ASCEND_DISABLE=verl_dpskv3_group_routing — stock verl: the Megatron DeepSeek-V3 routes over all experts
unless override_transformer_config sets both fields; r1-ascend preflight then refuses a DeepSeek-V3 run whose
actor routing differs from the rollout's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ._errors import PatchError
from ._install import install_on_import
from ._registry import PatchSpec, spec_by_module
from .rules.group_routing import GROUP_TOPK, NUM_GROUPS, is_deepseek_v3, routing_overrides

#: This patch's registry name (the R1_ASCEND_DISABLE token).
NAME = spec_by_module(__name__).name


def apply(spec: PatchSpec) -> None:
    install_on_import(spec.name, spec.target("hf_to_mcore_config"), _build_hf_to_mcore_config)


def _build_hf_to_mcore_config(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def hf_to_mcore_config(hf_config: Any, dtype: Any, **override_transformer_config_kwargs: Any) -> Any:
        if not is_deepseek_v3(hf_config):
            return original(hf_config, dtype, **override_transformer_config_kwargs)
        kwargs = routing_overrides(hf_config, override_transformer_config_kwargs)
        tf_config = original(hf_config, dtype, **kwargs)
        _check_applied(tf_config, kwargs)
        return tf_config

    return hf_to_mcore_config


def _check_applied(tf_config: Any, kwargs: dict[str, Any]) -> None:
    found = {key: getattr(tf_config, key, None) for key in (NUM_GROUPS, GROUP_TOPK)}
    wanted = {key: kwargs[key] for key in (NUM_GROUPS, GROUP_TOPK)}
    if found != wanted:
        msg = (
            f"patch {NAME!r}: verl's DeepSeek-V3 converter returned a {type(tf_config).__name__} with {found}, "
            f"expected {wanted} from the override_transformer_config it was given; the installed verl or "
            "megatron-core no longer passes these overrides through, so the actor would not route like the rollout. "
            f"Fix the patch for the installed upstream, or disable it with R1_ASCEND_DISABLE={NAME} (preflight "
            "then refuses DeepSeek-V3 runs whose routing differs)."
        )
        raise PatchError(msg)
