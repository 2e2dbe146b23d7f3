"""Release and restore rollout weights and KV cache by hand instead of vLLM sleep mode.

Target:
verl.workers.rollout.base._ROLLOUT_REGISTRY[("vllm", "sync")] (verl 0.6.1): rebound from
"verl.workers.rollout.vllm_rollout.vLLMRollout" to "r1_ascend.patches.impl.rollout_vllm.NPUOffloadVLLMRollout", a
subclass of stock verl.workers.rollout.vllm_rollout.vllm_rollout_spmd.vLLMRollout.

Upstream:
verl 0.6.1 with vllm 0.9.1 and vllm-ascend 0.9.1. verl's sync rollout frees memory between steps with vLLM
sleep mode: ``release()`` calls ``LLM.sleep(level)``, ``resume(tags)`` calls ``LLM.wake_up(tags)``,
``update_weights`` calls ``model.load_weights``. It builds the engine with
``enable_sleep_mode=config.free_cache_engine``.

Process:
The Ray worker that builds the rollout (verl ``ActorRolloutRefWorker._build_rollout`` resolves the class with
``get_rollout_class``), and the driver so that the selection is visible to configuration checks.

Why:
vllm-ascend's sleep mode does not reliably give NPU memory back when driven by verl's external launcher
(vllm-ascend#977, open), needs the custom-kernel build (CaMemAllocator) and cannot be combined with
``PYTORCH_NPU_ALLOC_CONF=expandable_segments:True``; at 671B the rollout must give back its weights and KV cache
during training or the actor runs out of memory. Stock verl 0.6.1 also never re-derives DeepSeek MLA's
absorbed matrices after a weight sync (verl PR #4130 landed after 0.6.1), so the rollout would keep the matrices
computed from the dummy start-up weights.

How:
The subclass calls the stock ``__init__`` (so the vllm_dp_ep_groups wrapper on it still runs) with a config copy whose
``free_cache_engine`` is False (engine built with sleep mode off), after refusing ``free_cache_engine=False`` and
checking ``max_num_batched_tokens`` against the Ascend scheduler. ``release()`` drops the KV caches and resizes every
parameter's device storage to zero (no host copy kept) plus the MLA ``W_UV``/``W_UK_T``; ``resume`` handles each of
``weights`` and ``kv_cache`` independently: weights are re-allocated uninitialised and refilled by ``update_weights``,
which then re-derives the MLA matrices and records the loaded names (generation refuses to start if a parameter was
missed); the KV cache is rebuilt from the configs saved by vllm_engine_kv_cache_configs, then the prefix cache is
reset. ``torch.npu.empty_cache()`` runs after every release (verl ``aggressive_empty_cache``; no-op without a device).

Upstream fix:
verl PR #4130 (MLA post-load processing in ``update_weights``, after v0.6.1); vllm-ascend#977 (sleep mode under the
external launcher) is not fixed at 0.9.1.

Remove when:
verl contains PR #4130 (``process_weights_after_loading`` called in vLLMRollout.update_weights) and vllm-ascend sleep
mode frees NPU memory under external_launcher (vllm-ascend#977 closed in the pinned vllm-ascend); then drop both this
patch and vllm_engine_kv_cache_configs and let stock verl sleep/wake the engine.

Disable:
R1_ASCEND_DISABLE=vllm_rollout_offload keeps stock verl's rollout, which builds the engine with vLLM sleep mode and
calls sleep/wake_up; on vllm-ascend 0.9.1 that frees nothing and DeepSeek-V3 training runs out of NPU memory.
"""

from __future__ import annotations

import importlib

from ._errors import PatchTargetError
from ._install import install_on_import
from ._registry import PatchSpec, spec_by_module
from ._target import disable_hint

#: This patch's registry name (the R1_ASCEND_DISABLE token).
NAME = spec_by_module(__name__).name

#: The rollout class verl instantiates once this patch is applied (imported lazily by verl's get_rollout_class).
ROLLOUT_CLASS_PATH = "r1_ascend.patches.impl.rollout_vllm.NPUOffloadVLLMRollout"
#: What stock verl 0.6.1 registers for ("vllm", "sync"): the class ours subclasses.
STOCK_ROLLOUT_CLASS_PATH = "verl.workers.rollout.vllm_rollout.vLLMRollout"


def build(original: str) -> str:
    if original != STOCK_ROLLOUT_CLASS_PATH:
        msg = (
            f"patch {NAME!r}: verl's rollout registry maps ('vllm', 'sync') to {original!r}, expected "
            f"the stock {STOCK_ROLLOUT_CLASS_PATH!r} that the offloading rollout extends. Something else replaced the "
            f"rollout class. {disable_hint(NAME)}"
        )
        raise PatchTargetError(msg)
    return ROLLOUT_CLASS_PATH


def apply(spec: PatchSpec) -> None:
    install_on_import(spec.name, spec.target("_ROLLOUT_REGISTRY"), build)


def rollout_class() -> type:
    """The offloading rollout class verl builds once this patch is applied (importing it imports verl and vLLM)."""
    module, _, name = ROLLOUT_CLASS_PATH.rpartition(".")
    return getattr(importlib.import_module(module), name)
