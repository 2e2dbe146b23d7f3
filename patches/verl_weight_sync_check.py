"""Check every actor -> rollout weight sync exactly, on every rank, before anything is generated from it.

Target:
verl.utils.megatron_utils.per_tensor_generator (and its copy verl.workers.megatron_workers.per_tensor_generator) —
verl's Megatron -> HF export, called once per sync by ActorRolloutRefWorker.rollout_mode;
vllm.model_executor.models.deepseek_v2.DeepseekV2ForCausalLM.load_weights — vLLM's DeepSeek-V2/V3 weight loading,
which vllm-ascend's CustomDeepseekV2ForCausalLM.load_weights calls after filtering the names;
verl.workers.megatron_workers.ActorRolloutRefWorker.rollout_mode — the whole sync (resume weights, update_weights,
offload the actor, resume the KV cache), after which the rollout generates.

Upstream:
verl 0.6.1 (verl/utils/megatron_utils.py per_tensor_generator: PP broadcast, EP then ETP all-gather of the
experts, TP all-gather otherwise, default_tp_concat_fn, weight_converter.convert_param; verl/workers/
megatron_workers.py rollout_mode), vllm 0.9.1 (vllm/model_executor/models/deepseek_v2.py load_weights),
vllm-ascend 0.9.1 (the DeepSeek class, AscendFusedMoE, CustomParallelLMHead and AscendMLAImpl whose layout the
ownership rule describes), megatron-core 0.12.1 (GPTModel.sharded_state_dict, which gives each actor shard's
global offsets).

Process:
worker (the colocated actor and rollout; every rank of the world).

Why:
a weight sync that misplaces, skips or mis-converts tensors produces fluent text from another policy. The bugs of
this class reported for this stack in 2025-26 are all silent: expert weights transposed a second time after a wake
(vllm-ascend #11548, #12226), MoE weight loaders dropped in online updates (vllm-ascend #13337), wrong EP
rollouts (verl PR #7086), stale pipeline-parallel caches (SkyRL #1345). The rollout guard (verl_rollout_guard)
compares log-probs against a noise level, and a fault in one expert sits at the edge of that noise: on the CPU
rehearsal's tiny model the planted faults measure 0.003-0.09 nat, and at the NPU's stop level (mean 0.1 nat) none
would be stopped. megatron-core checks parameter hashes across data-parallel replicas
(check_param_hashes_across_dp_replicas), nobody checks each sync against the rollout.

How:
a linear fingerprint (a seeded projection over each HF tensor's global row and column indices plus the plain sum;
rules/weight_fingerprint.py, tolerance from the fp32 summation bound) computed three times per sync (impl/
weight_check.py): (1) the actor predicts each rollout rank's share of every HF tensor from its own Megatron shards
(sharded_state_dict offsets, main replicas, the converter's HF <-> Megatron mapping rules/mcore_mapping.py), one
float64 all-reduce over the world (a gloo group: the world's, or one made at the first sync); (2) each tensor of
verl's stream is fingerprinted on the region this rank owns as it enters vLLM's load_weights, by an ownership rule
written from vLLM 0.9.1's parameter layout (impl/weight_ownership.py: TP rows / columns, merged gate||up, the
experts of each EP rank, the vocabulary shards, the MLA matrices derived from kv_b_proj), then passed on unchanged;
(3) after rollout_mode returns (load, post-processing, MLA re-derivation done), every engine tensor against what it
received (load check), every received share against its prediction (export check), every share received once, each
expert map as the rule places the experts. One all-reduce of the mismatch count; on a mismatch every rank raises
WeightSyncError naming the rank, the sync, the HF tensor, the engine tensor and both fingerprints. A model type
other than DeepSeek-V2/V3 is logged as not checked. Listeners in weight_check.CHECK_LISTENERS receive each sync's
report (the rehearsal records them). Cost: docs/benchmarks.md ("Weight-sync check").

Upstream fix:
none — verl 0.6.1 to main as of 2026-08 compares nothing after a sync; megatron-core's
check_param_hashes_across_dp_replicas compares actor replicas, not the rollout.

Remove when:
verl's weight sync verifies the rollout's parameters against the actor's (a per-sync checksum of every synced
tensor on the rollout side) in the pinned verl; then delete this module, its registry entry, impl/weight_check.py,
impl/weight_ownership.py, rules/weight_fingerprint.py and their tests (rules/mcore_mapping.py stays: the converter
uses it).

Disable:
R1_ASCEND_DISABLE=verl_weight_sync_check — stock verl: the sync is not checked; only the rollout guard's log-prob
comparison (if on) can notice a wrong sync, after generating from it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from ._install import install_on_import
from ._registry import PatchSpec, spec_by_module

#: This patch's registry name (the R1_ASCEND_DISABLE token).
NAME = spec_by_module(__name__).name


def apply(spec: PatchSpec) -> None:
    install_on_import(spec.name, spec.target("per_tensor_generator"), _build_export)
    install_on_import(spec.name, spec.target("DeepseekV2ForCausalLM.load_weights"), _build_load_weights)
    install_on_import(spec.name, spec.target("ActorRolloutRefWorker.rollout_mode"), _build_rollout_mode)


def _build_export(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def per_tensor_generator(
        actor_module: Any,
        model_config: Any,
        weight_converter: Any,
        transformer_config: Any,
        layer_name_mapping: Any,
        convert_qkv_gate_up_by_simple_split: bool = True,
    ) -> Any:
        from .impl import weight_check

        weight_check.begin_export(actor_module, model_config)
        return original(
            actor_module,
            model_config,
            weight_converter,
            transformer_config,
            layer_name_mapping,
            convert_qkv_gate_up_by_simple_split,
        )

    return per_tensor_generator


def _build_load_weights(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load_weights(self: Any, weights: Any) -> Any:
        from .impl import weight_check

        return weight_check.load(self, weights, original)

    return load_weights


def _build_rollout_mode(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def rollout_mode(self: Any) -> Any:
        from .impl import weight_check

        start = time.perf_counter()
        result = await original(self)
        weight_check.verify(forward_context(self.rollout), sync_s=time.perf_counter() - start)
        return result

    return rollout_mode


def forward_context(rollout: Any) -> Any:
    """The rollout engine's static forward context (its attention layers and their MLA matrices)."""
    from .impl.rollout_vllm import EngineParts

    return EngineParts.locate(rollout.inference_engine).forward_context
