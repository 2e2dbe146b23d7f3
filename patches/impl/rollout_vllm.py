"""The offloading vLLM rollout: stock verl ``vLLMRollout`` with vLLM sleep mode replaced by explicit memory handling.

Imported only when verl resolves ``_ROLLOUT_REGISTRY[("vllm", "sync")]`` (see ``vllm_rollout_offload``), i.e. in the
Ray worker that builds the rollout; it imports verl and vLLM at top level for that reason.

Engine objects reached (vLLM 0.9.1 V1 with ``distributed_executor_backend="external_launcher"``, which forces
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` so the engine core lives in this process):

- engine core: ``LLM.llm_engine.engine_core`` (``InprocClient``) ``.engine_core`` (``EngineCore``);
- model runner: ``LLM.llm_engine.model_executor.driver_worker.worker.model_runner`` (vllm-ascend ``NPUModelRunner``);
- attention layers: ``model_runner.vllm_config.compilation_config.static_forward_context``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.device import is_cuda_available, is_npu_available
from verl.utils.memory_utils import aggressive_empty_cache
from verl.workers.rollout.vllm_rollout.vllm_rollout_spmd import vLLMRollout

from .._apply import applied_names
from .._errors import RolloutMemoryError, WeightSyncError
from .._rng import accelerator_module, preserved_rng_state
from ..rules.dp_layout import rollout_dp_size
from ..rules.rollout_config import (
    RolloutConfigError,
    check_batched_tokens,
    check_engine_options,
    check_free_cache_engine,
    stock_length_check_would_fail,
)
from ..vllm_engine_kv_cache_configs import check_block_counts, saved_kv_cache_configs
from . import rollout_memory as memory

logger = logging.getLogger(__name__)

RESUME_TAGS = ("weights", "kv_cache")
_GiB = 1024**3


def empty_device_cache() -> None:
    """Return freed blocks to the device (``torch.npu.empty_cache()`` on NPU); no-op without an accelerator.

    verl's ``aggressive_empty_cache`` alone is not enough: on a machine without accelerator it picks ``torch.cpu``,
    which has no ``memory_reserved`` and raises.
    """
    if is_npu_available or is_cuda_available:
        aggressive_empty_cache(force_sync=True)


@dataclass(frozen=True)
class EngineParts:
    """The vLLM objects the rollout manipulates (see the module docstring for the attribute paths)."""

    engine_core: Any
    model_runner: Any

    @classmethod
    def locate(cls, llm: Any) -> EngineParts:
        llm_engine = llm.llm_engine
        engine_core = getattr(getattr(llm_engine, "engine_core", None), "engine_core", None)
        if engine_core is None:
            msg = (
                f"the vLLM engine core is not in this process (llm_engine is {type(llm_engine).__module__}."
                f"{type(llm_engine).__name__}); the offloading rollout needs vLLM V1 with "
                f"distributed_executor_backend='external_launcher' (no engine-core subprocess)."
            )
            raise RolloutMemoryError(msg)
        return cls(engine_core, llm_engine.model_executor.driver_worker.worker.model_runner)

    @property
    def model(self) -> torch.nn.Module:
        return self.model_runner.get_model()

    @property
    def forward_context(self) -> dict[str, Any]:
        return self.model_runner.vllm_config.compilation_config.static_forward_context

    @property
    def act_dtype(self) -> torch.dtype:
        return self.model_runner.vllm_config.model_config.dtype


class NPUOffloadVLLMRollout(vLLMRollout):
    """Sync vLLM rollout whose ``release``/``resume`` free and rebuild weights and KV cache without vLLM sleep mode.

    Lifecycle driven by verl 0.6.1 ``ActorRolloutRefWorker``: ``release()`` (trainer_mode, also right after build),
    then ``resume(["weights"])`` -> ``update_weights(...)`` -> ``resume(["kv_cache"])`` (rollout_mode).
    """

    def __init__(self, config: Any, model_config: Any, device_mesh: Any) -> None:
        rollout_config = omega_conf_to_dataclass(config)
        check_free_cache_engine(rollout_config)
        check_batched_tokens(rollout_config)
        check_engine_options_for(rollout_config, model_config)
        # Stock __init__ passes enable_sleep_mode=config.free_cache_engine to LLM(); hand it a copy with sleep mode off
        # (and, when needed, past its inverted chunked-prefill check: V1 forces chunked prefill on regardless).
        overrides: dict[str, Any] = {"free_cache_engine": False}
        if stock_length_check_would_fail(rollout_config):
            overrides["enable_chunked_prefill"] = False
        super().__init__(dataclasses.replace(rollout_config, **overrides), model_config, device_mesh)
        self.config = rollout_config
        self._init_memory_state(EngineParts.locate(self.inference_engine))

    def _init_memory_state(self, parts: EngineParts) -> None:
        """Validate the engine and start in the 'everything resident' state (also used by tests on fakes)."""
        self._parts = parts
        configs = saved_kv_cache_configs(parts.engine_core)
        blocks = check_block_counts(configs)
        scheduler_blocks = parts.engine_core.vllm_config.cache_config.num_gpu_blocks
        if blocks != scheduler_blocks:
            msg = (
                f"saved KV-cache configs have {blocks} blocks but the scheduler was sized for {scheduler_blocks}; "
                f"rebuilding caches from them would corrupt memory. The engine was initialised twice or by a "
                f"different code path than vllm_engine_kv_cache_configs expects."
            )
            raise RolloutMemoryError(msg)
        self._held_weights: list[memory.HeldStorage] = []
        self._weights_resident = True
        self._kv_resident = True
        self._loaded_names: set[str] | None = None

    @property
    def weights_resident(self) -> bool:
        return self._weights_resident

    @property
    def kv_cache_resident(self) -> bool:
        return self._kv_resident

    def _kv_layers(self) -> list[tuple[str, Any]]:
        configs = saved_kv_cache_configs(self._parts.engine_core)
        names = [name for group in configs[0].kv_cache_groups for name in group.layer_names]
        return memory.attention_layers(self._parts.forward_context, names)

    async def release(self) -> None:
        """Free the KV cache, the weights and the derived MLA matrices; keep no host copy."""
        self.inference_engine.reset_prefix_cache()
        freed_kv = freed_weights = freed_mla = 0
        if self._kv_resident:
            freed_kv = memory.free_kv_caches(self._parts.model_runner, self._kv_layers())
            self._kv_resident = False
        if self._weights_resident:
            freed_mla = memory.drop_mla_matrices(memory.mla_impls(self._parts.forward_context))
            self._held_weights = memory.release_parameter_storage(self._parts.model)
            freed_weights = sum(item.nbytes for item in self._held_weights)
            self._weights_resident = False
            self._loaded_names = None
        empty_device_cache()
        logger.info(
            "rollout released: weights %.2f GiB, KV cache %.2f GiB, MLA matrices %.2f GiB",
            freed_weights / _GiB,
            freed_kv / _GiB,
            freed_mla / _GiB,
        )

    async def resume(self, tags: list[str]) -> None:
        """Re-allocate what ``tags`` name; each tag is handled on its own, weights before KV cache."""
        unknown = sorted(set(tags) - set(RESUME_TAGS))
        if unknown or isinstance(tags, str):
            msg = f"resume(tags={tags!r}): expected a list drawn from {list(RESUME_TAGS)}, got unknown {unknown}"
            raise ValueError(msg)
        if "weights" in tags:
            self._onload_weights()
        if "kv_cache" in tags:
            self._rebuild_kv_cache()

    def _onload_weights(self) -> None:
        if self._weights_resident:
            return
        allocated = memory.restore_parameter_storage(self._held_weights)
        self._held_weights = []
        self._weights_resident = True
        self._loaded_names = set()
        logger.info("rollout weights re-allocated (%.2f GiB, uninitialised until update_weights)", allocated / _GiB)

    def _rebuild_kv_cache(self) -> None:
        if self._kv_resident:
            return
        if not self._weights_resident:
            msg = (
                "resume(['kv_cache']) while the rollout weights are released: rebuilding the KV cache runs vLLM's "
                "warm-up forward passes, which need the weights. Call resume(['weights']) first."
            )
            raise RolloutMemoryError(msg)
        configs = saved_kv_cache_configs(self._parts.engine_core)
        # initialize_from_config re-runs compile_or_warm_up_model, which reseeds every generator (see _rng).
        with preserved_rng_state(accelerator_module()):
            self._parts.engine_core.model_executor.initialize_from_config(configs)
        self.inference_engine.reset_prefix_cache()
        self._kv_resident = True
        logger.info("rollout KV cache rebuilt with the start-up configs (%d blocks)", configs[0].num_blocks)

    async def update_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None], **kwargs: Any) -> None:
        """Load the synced weights, record which parameters were written, then re-derive the MLA matrices."""
        if kwargs.get("peft_config") is not None and kwargs.get("base_sync_done", False):
            await super().update_weights(weights, **kwargs)
            return
        if not self._weights_resident:
            msg = "update_weights called while the rollout weights are released; call resume(['weights']) first"
            raise RolloutMemoryError(msg)
        from verl.utils.vllm.patch import patch_vllm_moe_model_weight_loader

        model = self._parts.model
        patch_vllm_moe_model_weight_loader(model)
        loaded = model.load_weights(weights)
        self._record_loaded(loaded)
        impls = memory.mla_impls(self._parts.forward_context)
        memory.recompute_mla_matrices(impls, self._parts.act_dtype)
        logger.debug("recomputed MLA matrices of %d attention layers after the weight load", len(impls))

    def _record_loaded(self, loaded: Iterable[str] | None) -> None:
        if self._loaded_names is None:
            return
        if loaded is None:
            logger.warning(
                "%s.load_weights returned no loaded-parameter names; cannot verify that the weight sync wrote every "
                "rollout parameter",
                type(self._parts.model).__name__,
            )
            self._loaded_names = None
            return
        self._loaded_names.update(loaded)

    def verify_weights_loaded(self) -> None:
        """Raise ``WeightSyncError`` if a parameter re-allocated since the last release was never written."""
        if not self._weights_resident:
            msg = "the rollout weights are released; the trainer must call resume(['weights']) before generating"
            raise RolloutMemoryError(msg)
        if self._loaded_names is None:
            return
        expected = [name for name, _ in self._parts.model.named_parameters()]
        missing = [name for name in expected if name not in self._loaded_names]
        if missing:
            shown = ", ".join(missing[:10]) + (f", ... ({len(missing)} in total)" if len(missing) > 10 else "")
            msg = (
                f"{len(missing)} of {len(expected)} rollout parameters were not written by update_weights since they "
                f"were re-allocated, so they hold uninitialised memory: {shown}. The actor->rollout weight export "
                f"(verl per_tensor_generator / weight converter or mbridge) must emit every vLLM parameter."
            )
            raise WeightSyncError(msg)
        self._loaded_names = None

    def generate_sequences(self, prompts: Any, **kwargs: Any) -> Any:
        self.verify_weights_loaded()
        return super().generate_sequences(prompts, **kwargs)


def check_engine_options_for(rollout_config: Any, model_config: Any) -> None:
    """Refuse engine options vllm-ascend would reject (or silently ignore) for this model and DP layout."""
    import torch.distributed as dist

    hf_config = model_config.hf_config
    experts = getattr(hf_config, "n_routed_experts", None) or getattr(hf_config, "num_experts", None) or 0
    applied = applied_names()
    dp_groups = "vllm_dp_ep_groups" in applied
    # vLLM DP exists only over torch.distributed and with the DP/EP patch (whose own check of the layout this is).
    tp_size = int(rollout_config.tensor_model_parallel_size)
    dp_size = rollout_dp_size(dist.get_world_size(), tp_size) if dp_groups and dist.is_initialized() else 1
    problems = check_engine_options(
        rollout_config,
        model_type=str(getattr(hf_config, "model_type", "")),
        is_moe=experts > 0,
        dp_size=dp_size,
        dp_groups=dp_groups,
        live_params="vllm_ascend_torchair_live_params" in applied,
    )
    if problems:
        msg = "rollout engine options cannot work on vllm-ascend 0.9.1: " + "; ".join(problems)
        raise RolloutConfigError(msg)
