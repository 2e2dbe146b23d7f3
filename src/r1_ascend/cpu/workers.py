"""The device calls of verl's Megatron workers on the CPU, and the one install of the CPU platform in a process.

verl 0.6.1's ``megatron_workers`` reaches the device through three names: its collective backend, its timing
all-gather and the ``torch.<device>`` API (RNG state, memory statistics). :data:`STAND_INS` is the complete list of
what the platform stands in for in a worker, with why; docs/launch.md prints it.
"""

from __future__ import annotations

from typing import Any

import torch

#: (what is stood in, where verl reaches it, why) - the complete list.
STAND_INS: tuple[tuple[str, str, str], ...] = (
    (
        "collective backend",
        "verl.workers.megatron_workers.get_nccl_backend -> 'gloo'",
        "HCCL needs NPUs; gloo runs the same torch.distributed and Megatron process groups on CPU "
        "(megatron_workers.topk_reduce_ratio_min_max gathers equal shapes, which gloo requires)",
    ),
    (
        "device RNG / memory API",
        "torch.cpu.{get,set}_rng_state, manual_seed, memory_* (added), megatron_workers.set_random_seed",
        "verl drives torch.<device>; torch.cpu lacks them, and Megatron's RNG tracker is CUDA-only",
    ),
    (
        "megatron-core device-only calls",
        "r1_ascend.cpu.mcore (Transformer Engine classes, torch.cuda calls, CUDA RNG tracker, ...)",
        "the listed calls need CUDA; the model, optimizer, schedule, checkpoint and export around them are upstream",
    ),
    (
        "collective backend of vLLM's groups",
        "verl.utils.device.get_nccl_backend -> 'cpu:gloo,npu:gloo', torch's PrivateUse1 backend named 'npu'",
        "the overlay's vllm_dp_ep_groups (rollout DP > 1) builds vLLM's groups with verl's backend, HCCL on the "
        "cluster; vLLM's config then parses the platform's device 'npu', which torch_npu registers",
    ),
    (
        "vLLM engine",
        "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd.LLM -> CPUStandInLLM (transformers' DeepSeek-V3)",
        "the pinned vLLM wheel has no CPU backend: a component stand-in. vLLM's scheduler, model runner and forward "
        "do not run; transformers' DeepSeek-V3 decodes, holding what vLLM's DeepSeek-V3 class (built only for its "
        "load_weights) loaded. Upstream code inside it: the sampling (InputBatch, Sampler with the overlay's patch, "
        "LogprobsProcessor), EngineCore._initialize_kv_caches on a stand-in core, vllm-ascend's MLA post-processing",
    ),
)


def _zero(*_: Any, **__: Any) -> int:
    return 0


def _none(*_: Any, **__: Any) -> None:
    return None


def install_device_api() -> None:
    """The ``torch.cuda``-style calls verl makes on ``torch.<device>``, added to ``torch.cpu`` where it lacks them."""
    additions = {
        "get_rng_state": lambda *_: torch.random.get_rng_state(),
        "set_rng_state": lambda state, *_: torch.random.set_rng_state(state),
        "manual_seed": lambda seed: torch.manual_seed(seed),
        "manual_seed_all": lambda seed: torch.manual_seed(seed),
        "memory_allocated": _zero,
        "memory_reserved": _zero,
        "max_memory_allocated": _zero,
        "max_memory_reserved": _zero,
        "reset_peak_memory_stats": _none,
        "empty_cache": _none,
        "mem_get_info": lambda *_: (0, 0),
    }
    for name, fn in additions.items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, fn)


def topk_reduce_ratio_min_max(timing: float, k: int = 10) -> tuple[float, float, float]:
    """verl's timing all-gather with matching shapes: verl gathers a 0-d tensor into 1-element ones, which NCCL and
    HCCL accept and gloo rejects."""
    import torch.distributed as dist

    gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, torch.tensor([float(timing)]))
    stack = torch.stack(gathered)
    percentile = torch.quantile(stack, 1 - k / 100)
    return float((stack > percentile).float().mean()), float(stack.min()), float(stack.max())


def install() -> None:
    """Install every stand-in of :data:`STAND_INS` in this process (idempotent; megatron-core's part refuses on
    drift)."""
    import verl.utils.device as verl_device
    import verl.workers.megatron_workers as megatron_workers
    import verl.workers.rollout.vllm_rollout.vllm_rollout_spmd as vllm_rollout_spmd

    from r1_ascend.cpu import mcore, vllm_deepseek
    from r1_ascend.cpu.engine import CPUStandInLLM

    install_device_api()
    mcore.install()
    megatron_workers.get_nccl_backend = lambda: "gloo"
    vllm_deepseek.name_npu_backend()
    verl_device.get_nccl_backend = lambda: vllm_deepseek.GROUP_BACKEND
    megatron_workers.topk_reduce_ratio_min_max = topk_reduce_ratio_min_max
    vllm_rollout_spmd.LLM = CPUStandInLLM
