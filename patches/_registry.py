"""The ordered registry of patches: what each one replaces, on which upstream version, in which process.

Order matters and is deliberate:
1. ``vllm_engine_kv_cache_configs`` and 2. ``vllm_dp_ep_groups`` change vLLM itself and must be in place
   before any rollout engine is built;
3. ``vllm_ascend_torchair_live_params`` makes TorchAir graphs read parameter addresses on every launch, which the
   offloading rollout needs;
4. ``vllm_rollout_offload`` swaps verl's sync vLLM rollout for ours, which relies on 1, 2 and 3;
5. ``mindspeed_torch_compile`` wraps the worker method that builds that rollout;
6. ``verl_onpolicy_logprob`` changes the actor update and depends on nothing above;
7. ``verl_rollout_guard`` wraps the trainer's loop last, so it sees the worker group after 6 changed it;
8. ``verl_dpskv3_group_routing`` changes how verl builds the Megatron model config and depends on nothing above;
9. ``verl_checkpoint_integrity`` changes when checkpoints are deleted and which one a resume takes; it depends on
   nothing above;
10. ``verl_worker_watchdog`` wraps the worker methods the trainer calls to report their stage; it depends on
    nothing above and wraps none of their targets;
11. ``verl_moe_expert_load`` wraps the actor's update and megatron-core's expert-bias update to log expert load; it
    depends on nothing above (``verl_onpolicy_logprob`` wraps forward_backward_batch, which update_policy calls);
12. ``verl_rollout_model_config`` wraps the worker's switch to trainer mode, which verl calls once the rollout
    engine is built (after 4 and 5 built it), to compare the engine's model configuration with the actor's;
13. ``verl_weight_sync_check`` wraps verl's export, vLLM's DeepSeek ``load_weights`` and the worker's
    ``rollout_mode`` to check every weight sync; it wraps no target above and reads the engine through the
    offloading rollout's ``EngineParts`` (4), whose ``update_weights`` it checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ._target import Target

#: Processes a patch must reach. verl colocates actor, reference and rollout in one Ray worker ("WorkerDict"),
#: so "worker" covers training and rollout; "driver" is the TaskRunner that builds the trainer.
PROCESSES = ("driver", "worker", "vllm-engine")


@dataclass(frozen=True)
class PatchSpec:
    name: str  # = module name = the token accepted by R1_ASCEND_DISABLE
    targets: tuple[Target, ...]
    requires: Mapping[str, str]  # distribution -> exact pinned version the patch was written against
    processes: tuple[str, ...]
    upstream_commits: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # non-PyPI upstream

    @property
    def module(self) -> str:
        return f"r1_ascend.patches.{self.name}"

    def target(self, attribute: str) -> Target:
        """The declared target whose ``attribute`` (dotted inside its module) is ``attribute``."""
        for target in self.targets:
            if target.attribute == attribute:
                return target
        msg = f"patch {self.name!r} declares no target {attribute!r} (declared: {[t.attribute for t in self.targets]})"
        raise KeyError(msg)


_SPMD = "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd"
_MEGATRON_WORKERS = "verl.workers.megatron_workers"
_TRAINER = "verl.trainer.ppo.ray_trainer"
_ACTOR = "verl.workers.actor.megatron_actor"
_MEGATRON_CKPT = "verl.utils.checkpoint.megatron_checkpoint_manager"
#: Parameters of verl 0.6.1 ``MegatronPPOActor.forward_backward_batch``.
_FORWARD_BACKWARD_PARAMS = (
    "self",
    "data",
    "forward_only",
    "post_process_fn",
    "calculate_entropy",
    "use_dynamic_bsz",
    "micro_batch_size",
    "max_token_len",
    "mini_batch_size",
)
#: The ActorRolloutRefWorker methods verl's trainer calls, with their verl 0.6.1 parameters (verl_worker_watchdog).
_WORKER_STAGE_PARAMS: dict[str, tuple[str, ...]] = {
    "init_model": ("self",),
    "load_checkpoint": ("self", "checkpoint_path", "hdfs_path", "del_local_after_load"),
    "generate_sequences": ("self", "prompts"),
    "compute_log_prob": ("self", "data"),
    "compute_ref_log_prob": ("self", "data"),
    "update_actor": ("self", "data"),
    "save_checkpoint": ("self", "checkpoint_path", "hdfs_path", "global_step", "max_ckpt_to_keep"),
}

PATCHES: tuple[PatchSpec, ...] = (
    PatchSpec(
        name="vllm_engine_kv_cache_configs",
        targets=(
            Target("vllm.v1.engine.core", "unify_kv_cache_configs", "vllm", params=("kv_cache_configs",)),
            Target("vllm.v1.engine.core", "EngineCore._initialize_kv_caches", "vllm", params=("self", "vllm_config")),
        ),
        requires=MappingProxyType({"vllm": "0.9.1"}),
        processes=("worker", "vllm-engine"),
    ),
    PatchSpec(
        name="vllm_dp_ep_groups",
        targets=(
            Target(
                _SPMD,
                "vLLMRollout.__init__",
                "verl",
                params=("self", "config", "model_config", "device_mesh"),
            ),
        ),
        requires=MappingProxyType({"verl": "0.6.1", "vllm": "0.9.1", "vllm-ascend": "0.9.1"}),
        processes=("worker",),
    ),
    PatchSpec(
        name="vllm_ascend_torchair_live_params",
        targets=(
            Target(
                "vllm_ascend.worker.model_runner_v1",
                "NPUModelRunner._get_torchair_lazy_compiled_model",
                "vllm-ascend",
                params=("self", "batch_size"),
            ),
        ),
        requires=MappingProxyType({"vllm": "0.9.1", "vllm-ascend": "0.9.1"}),
        processes=("worker",),
    ),
    PatchSpec(
        name="vllm_rollout_offload",
        targets=(
            Target(
                "verl.workers.rollout.base",
                "_ROLLOUT_REGISTRY",
                "verl",
                key=("vllm", "sync"),
            ),
        ),
        requires=MappingProxyType({"verl": "0.6.1", "vllm": "0.9.1", "vllm-ascend": "0.9.1"}),
        processes=("driver", "worker"),
    ),
    PatchSpec(
        name="mindspeed_torch_compile",
        targets=(
            Target(
                _MEGATRON_WORKERS, "ActorRolloutRefWorker._build_rollout", "verl", params=("self", "trust_remote_code")
            ),
        ),
        requires=MappingProxyType({"verl": "0.6.1"}),
        processes=("worker",),
        upstream_commits=MappingProxyType({"mindspeed": "f6688c61bcfe45243ee5eb34c6f013b1e06eca81"}),
    ),
    PatchSpec(
        name="verl_onpolicy_logprob",
        targets=(
            Target(_TRAINER, "RayPPOTrainer.init_workers", "verl", params=("self",)),
            Target(_ACTOR, "MegatronPPOActor.forward_backward_batch", "verl", params=_FORWARD_BACKWARD_PARAMS),
            Target(_ACTOR, "get_policy_loss_fn", "verl", params=("name",)),
            Target("verl.utils.tracking", "Tracking.log", "verl", params=("self", "data", "step", "backend")),
        ),
        requires=MappingProxyType({"verl": "0.6.1"}),
        processes=("driver", "worker"),
    ),
    PatchSpec(
        name="verl_rollout_guard",
        targets=(
            Target(_TRAINER, "RayPPOTrainer.fit", "verl", params=("self",)),
            Target(
                "verl.trainer.ppo.rollout_corr_helper",
                "compute_rollout_corr_metrics_from_logprobs",
                "verl",
                params=("log_prob", "rollout_log_prob", "response_mask"),
            ),
            Target("vllm.v1.sample.sampler", "Sampler.forward", "vllm", params=("self", "logits", "sampling_metadata")),
        ),
        requires=MappingProxyType({"verl": "0.6.1", "vllm": "0.9.1"}),
        processes=("driver", "worker"),
    ),
    PatchSpec(
        name="verl_dpskv3_group_routing",
        targets=(
            Target(
                "verl.models.mcore.registry",
                "hf_to_mcore_config",
                "verl",
                params=("hf_config", "dtype", "override_transformer_config_kwargs"),
                aliases=("verl.models.mcore:hf_to_mcore_config",),
            ),
        ),
        requires=MappingProxyType({"verl": "0.6.1", "megatron-core": "0.12.1"}),
        processes=("worker",),
    ),
    PatchSpec(
        name="verl_checkpoint_integrity",
        targets=(
            Target(
                _MEGATRON_CKPT,
                "MegatronCheckpointManager.save_checkpoint",
                "verl",
                params=("self", "local_path", "hdfs_path", "global_step", "max_ckpt_to_keep"),
            ),
            Target(_TRAINER, "RayPPOTrainer._save_checkpoint", "verl", params=("self",)),
            Target(_TRAINER, "RayPPOTrainer._load_checkpoint", "verl", params=("self",)),
        ),
        requires=MappingProxyType({"verl": "0.6.1", "megatron-core": "0.12.1"}),
        processes=("driver", "worker"),
    ),
    PatchSpec(
        name="verl_worker_watchdog",
        targets=tuple(
            Target(_MEGATRON_WORKERS, f"ActorRolloutRefWorker.{method}", "verl", params=params)
            for method, params in _WORKER_STAGE_PARAMS.items()
        ),
        requires=MappingProxyType({"verl": "0.6.1"}),
        processes=("worker",),
    ),
    PatchSpec(
        name="verl_moe_expert_load",
        targets=(
            Target(
                "megatron.core.distributed.finalize_model_grads",
                "get_updated_expert_bias",
                "megatron-core",
                params=("tokens_per_expert", "expert_bias", "expert_bias_update_rate"),
            ),
            Target(_ACTOR, "MegatronPPOActor.update_policy", "verl", params=("self", "dataloader")),
        ),
        requires=MappingProxyType({"verl": "0.6.1", "megatron-core": "0.12.1"}),
        processes=("worker",),
    ),
    PatchSpec(
        name="verl_rollout_model_config",
        targets=(Target(_MEGATRON_WORKERS, "ActorRolloutRefWorker.trainer_mode", "verl", params=("self",)),),
        requires=MappingProxyType({"verl": "0.6.1", "vllm": "0.9.1"}),
        processes=("worker",),
    ),
    PatchSpec(
        name="verl_weight_sync_check",
        targets=(
            Target(
                "verl.utils.megatron_utils",
                "per_tensor_generator",
                "verl",
                params=(
                    "actor_module",
                    "model_config",
                    "weight_converter",
                    "transformer_config",
                    "layer_name_mapping",
                    "convert_qkv_gate_up_by_simple_split",
                ),
                aliases=(f"{_MEGATRON_WORKERS}:per_tensor_generator",),
            ),
            Target(
                "vllm.model_executor.models.deepseek_v2",
                "DeepseekV2ForCausalLM.load_weights",
                "vllm",
                params=("self", "weights"),
            ),
            Target(_MEGATRON_WORKERS, "ActorRolloutRefWorker.rollout_mode", "verl", params=("self",)),
        ),
        requires=MappingProxyType(
            {"verl": "0.6.1", "vllm": "0.9.1", "vllm-ascend": "0.9.1", "megatron-core": "0.12.1"}
        ),
        processes=("worker",),
    ),
)


def spec_by_module(module: str) -> PatchSpec:
    """The spec of the patch implemented by ``module`` (a patch module passes its ``__name__``)."""
    return _find("module", module)


def spec_by_name(name: str) -> PatchSpec:
    return _find("name", name)


def _find(field_name: str, value: str) -> PatchSpec:
    found = [spec for spec in PATCHES if getattr(spec, field_name) == value]
    if not found:
        known = ", ".join(getattr(spec, field_name) for spec in PATCHES)
        msg = f"unknown patch {field_name} {value!r}; known: {known}"
        raise KeyError(msg)
    return found[0]
