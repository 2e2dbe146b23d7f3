"""Keep the per-worker KV-cache configs the vLLM engine was initialised with, so caches can be rebuilt identically.

Target:
vllm.v1.engine.core.EngineCore._initialize_kv_caches(self, vllm_config) and
vllm.v1.engine.core.unify_kv_cache_configs(kv_cache_configs) (the name ``core`` imported from
``vllm.v1.core.kv_cache_utils``; vllm 0.9.1).

Upstream:
vllm 0.9.1 profiles device memory once in ``_initialize_kv_caches``, sizes the scheduler's ``KVCacheManager`` from
``num_gpu_blocks`` and hands the per-worker ``KVCacheConfig`` list to ``model_executor.initialize_from_config``; the
list itself is then dropped (only worker 0's config reaches the scheduler).

Process:
Every process that builds a vLLM V1 engine: the Ray worker that owns the colocated rollout (verl's
``external_launcher`` keeps the engine core in-process) and, for completeness, any vLLM engine process.

Why:
The rollout frees the KV cache for training and rebuilds it every step (see ``vllm_rollout_offload``). Re-profiling
memory at that point (with training state resident) could yield a different block count than the one the scheduler
was sized for, so the scheduler would hand out block ids beyond the new tensors: silent memory corruption. Rebuilding
with the exact configs from start-up avoids that.

How:
Two thin wrappers, no copy of upstream code (predecessors copied the whole method). ``_initialize_kv_caches`` opens
a capture (a context variable) for the duration of the original call; ``unify_kv_cache_configs``, which vLLM calls
on the per-worker list right before handing that same list to ``model_executor.initialize_from_config``, records
the list while a capture is open and checks every worker's config has the same ``num_blocks``
(``KVCacheConfigError`` otherwise). After the call the wrapper checks that the scheduler's config is the first of
the recorded list (so the recorded list is the one the workers got) and stores it on the engine as
``r1_ascend_kv_cache_configs``; ``saved_kv_cache_configs(engine_core)`` reads it back with a clear error when the
patch did not run. Outside ``_initialize_kv_caches`` the ``unify_kv_cache_configs`` wrapper only forwards.

Upstream fix:
None: vLLM frees and restores KV caches only through its sleep mode (CuMemAllocator / vllm-ascend CaMemAllocator),
which keeps the original allocation geometry but is unusable here (see ``vllm_rollout_offload``).

Remove when:
vllm_rollout_offload is removed (its only consumer), or vLLM exposes the initialised KV-cache configs on EngineCore
(check for a public attribute holding the list passed to ``initialize_from_config``).

Disable:
R1_ASCEND_DISABLE=vllm_engine_kv_cache_configs leaves vLLM untouched; the offloading rollout then refuses to start
with an error naming this patch, so also disable vllm_rollout_offload (stock verl rollout with vLLM sleep mode).
"""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from ._errors import KVCacheConfigError
from ._install import install_on_import
from ._registry import PatchSpec, spec_by_module

logger = logging.getLogger(__name__)

#: This patch's registry name (the R1_ASCEND_DISABLE token).
NAME = spec_by_module(__name__).name

#: Attribute set on ``vllm.v1.engine.core.EngineCore`` instances: the per-worker list of ``KVCacheConfig``.
KV_CACHE_CONFIGS_ATTR = "r1_ascend_kv_cache_configs"
#: Open (a list) only while the wrapped ``_initialize_kv_caches`` runs in this thread/context.
_capture: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("r1_ascend_kv_capture", default=None)


def check_block_counts(kv_cache_configs: Sequence[Any]) -> int:
    """Return the common ``num_blocks`` of all workers' configs; raise ``KVCacheConfigError`` if they differ."""
    if not kv_cache_configs:
        msg = "vLLM passed an empty KV-cache config list to initialize_from_config; expected one config per worker"
        raise KVCacheConfigError(msg)
    counts = [config.num_blocks for config in kv_cache_configs]
    if len(set(counts)) != 1:
        msg = (
            f"vLLM workers disagree on the KV-cache block count: num_blocks per worker = {counts}. One scheduler "
            f"drives all workers, so every worker must have the same count (vLLM normally unifies them to the "
            f"minimum). Check that every rank runs the same vLLM version and the same rollout config."
        )
        raise KVCacheConfigError(msg)
    return counts[0]


def saved_kv_cache_configs(engine_core: Any) -> list[Any]:
    """The KV-cache configs ``engine_core`` was initialised with (``KVCacheConfigError`` if never recorded)."""
    configs = getattr(engine_core, KV_CACHE_CONFIGS_ATTR, None)
    if configs is None:
        msg = (
            f"the vLLM engine core {type(engine_core).__name__} has no saved KV-cache configs "
            f"({KV_CACHE_CONFIGS_ATTR!r}): the patch {NAME} was not applied before the engine "
            f"was built (disabled via R1_ASCEND_DISABLE, or the overlay prelude did not run in this process). "
            f"Enable it, or disable vllm_rollout_offload as well to fall back to the stock rollout."
        )
        raise KVCacheConfigError(msg)
    return configs


def build_unify(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def unify_kv_cache_configs(kv_cache_configs: Any) -> Any:
        result = original(kv_cache_configs)
        sink = _capture.get()
        if sink is not None:
            check_block_counts(kv_cache_configs)
            sink.append(kv_cache_configs)
        return result

    return unify_kv_cache_configs


def build(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _initialize_kv_caches(self: Any, vllm_config: Any) -> Any:
        sink: list[Any] = []
        token = _capture.set(sink)
        try:
            result = original(self, vllm_config)
        finally:
            _capture.reset(token)
        if not sink:
            msg = (
                "EngineCore._initialize_kv_caches returned without calling unify_kv_cache_configs; vLLM changed how "
                f"it initialises KV caches and the patch {NAME} must be revised (or disabled "
                "together with vllm_rollout_offload)."
            )
            raise KVCacheConfigError(msg)
        configs = list(sink[-1])
        scheduler_config = result[2] if isinstance(result, tuple) and len(result) == 3 else None
        if not configs or scheduler_config is not configs[0]:
            msg = (
                "EngineCore._initialize_kv_caches sized the scheduler from a KV-cache config that is not the first of "
                "the list vLLM unified for the workers; vLLM changed how it initialises KV caches and the patch "
                f"{NAME} must be revised (or disabled together with vllm_rollout_offload)."
            )
            raise KVCacheConfigError(msg)
        setattr(self, KV_CACHE_CONFIGS_ATTR, configs)
        logger.debug("saved %d KV-cache config(s) on the engine core", len(configs))
        return result

    return _initialize_kv_caches


def apply(spec: PatchSpec) -> None:
    install_on_import(spec.name, spec.target("unify_kv_cache_configs"), build_unify)
    install_on_import(spec.name, spec.target("EngineCore._initialize_kv_caches"), build)
