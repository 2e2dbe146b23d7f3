"""Device-compute stand-ins for the rehearsal, installed in every Ray worker after the overlay's prelude.

The rehearsal names this module in ``VERL_USE_EXTERNAL_MODULES`` after ``r1_ascend.patches.prelude``, so verl imports
it in each worker right after the overlay is applied. It replaces only what needs an NPU, each at the narrowest
name verl reaches it through; verl's worker (``ActorRolloutRefWorker``, selected as the recipe selects it), its
``init_model``/``_build_model_optimizer``/``rollout_mode``/``trainer_mode``, the Megatron actor's
``compute_log_prob``/``update_policy``/``forward_backward_batch``/``loss_func``, verl's Megatron forward function
(sequence packing, logits processor, vocab-parallel log-probs over the real TP group), verl's stock
``vLLMRollout`` and the overlay's offloading rollout all run unchanged. The list, with why, is
:data:`STAND_INS` (docs/launch.md prints it).

It also records, per worker process, the rollout lifecycle calls the worker makes (``lifecycle-<pid>.log`` under
``R1_ASCEND_REHEARSE_DIR``) so the rehearsal can assert their order.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import torch

from r1_ascend import envs
from r1_ascend.rehearse.tiny_policy import TinyPolicy, TinyPolicyLLM

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
        "Megatron GPTModel",
        "verl.utils.megatron_utils.make_megatron_module -> [TinyPolicy]",
        "megatron-core 0.12.1's forward needs CUDA (alltoall dispatcher streams, global memory buffer, RNG tracker)",
    ),
    (
        "Megatron distributed optimizer",
        "verl.utils.megatron.optimizer.get_megatron_optimizer -> CPUAdam; register_megatron_training_hooks no-op",
        "it is built on Megatron DDP grad buffers of the GPTModel above",
    ),
    (
        "Megatron pipeline schedule",
        "verl.workers.actor.megatron_actor.get_forward_backward_func -> sequential CPU schedule",
        "Megatron's schedules use CUDA streams and p2p; verl's forward_step and loss_func still run inside",
    ),
    (
        "Megatron -> vLLM weight export",
        "verl.workers.megatron_workers.per_tensor_generator -> the policy's named parameters",
        "the converter reads Megatron GPTModel internals; the stand-in policy already has the vLLM names",
    ),
    (
        "Megatron dist checkpoint",
        "verl.workers.megatron_workers.MegatronCheckpointManager -> torch.save of the same state",
        "dist checkpointing shards the GPTModel's sharded_state_dict; layout global_step_N/actor is kept",
    ),
    (
        "vLLM engine",
        "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd.LLM -> TinyPolicyLLM",
        "the pinned vLLM wheel has no CPU backend; engine core, KV-cache init and MLA impls stay upstream code",
    ),
)


# --- device API on torch.cpu --------------------------------------------------------------------------------------


def _zero(*_: Any, **__: Any) -> int:
    return 0


def _none(*_: Any, **__: Any) -> None:
    return None


def _install_cpu_device_api() -> None:
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


def _topk_reduce_ratio_min_max(timing: float, k: int = 10) -> tuple[float, float, float]:
    """verl's timing all-gather with matching shapes: verl gathers a 0-d tensor into 1-element ones, which NCCL and
    HCCL accept and gloo rejects."""
    import torch.distributed as dist

    gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, torch.tensor([float(timing)]))
    stack = torch.stack(gathered)
    percentile = torch.quantile(stack, 1 - k / 100)
    return float((stack > percentile).float().mean()), float(stack.min()), float(stack.max())


def _set_random_seed(seed: int) -> None:
    import random

    import numpy as np

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


# --- actor: model, optimizer, schedule, weight export, checkpoint ---------------------------------------------------


def _make_module(*, hf_config: Any, tf_config: Any, **_: Any) -> list[TinyPolicy]:
    policy = TinyPolicy(int(hf_config.vocab_size))
    policy.config = tf_config  # Megatron reads the TransformerConfig off the model (get_model_config)
    return [policy]


class CPUAdam:
    """What verl's Megatron actor calls on its optimizer: zero_grad, step -> (ok, grad_norm, zeros), param_groups."""

    def __init__(self, model: list[torch.nn.Module], config: Any) -> None:
        params = [p for chunk in model for p in chunk.parameters()]
        self.params = params
        self.clip_grad = float(getattr(config, "clip_grad", 1.0) or 0.0)
        self.inner = torch.optim.AdamW(params, lr=float(config.lr), weight_decay=float(config.weight_decay))

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    def step(self) -> tuple[bool, float, None]:
        grads = [p for p in self.params if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(grads, self.clip_grad) if self.clip_grad > 0 else torch.tensor(0.0)
        self.inner.step()
        return True, float(norm), None

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


def _forward_backward_func() -> Any:
    def schedule(*, forward_step_func, data_iterator, model, num_microbatches, forward_only, **_: Any) -> list[Any]:
        """Megatron's no-pipelining schedule on one stage: forward, loss_func, backward of loss / microbatches."""
        iterator = data_iterator[0] if isinstance(data_iterator, list) else data_iterator
        chunk = model[0] if isinstance(model, list | torch.nn.ModuleList) else model
        store = []
        for _micro in range(num_microbatches):
            with torch.set_grad_enabled(not forward_only):
                output, loss_func = forward_step_func(iterator, chunk)
                if forward_only:
                    store.append(loss_func(output)[1])
                    continue
                loss, reduced = loss_func(output)
                (loss / num_microbatches).backward()
                store.append(reduced)
        return store

    return schedule


def _per_tensor_generator(actor_module: list[torch.nn.Module], *_: Any, **__: Any) -> Iterator[tuple[str, Any]]:
    for name, param in actor_module[0].named_parameters():
        yield name, param.detach()


class CPUCheckpointManager:
    """verl's checkpoint manager interface; saves model, optimizer, scheduler and RNG per rank under local_path."""

    def __init__(self, *, model: list[torch.nn.Module], optimizer: Any, optimizer_scheduler: Any, **_: Any) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = optimizer_scheduler
        self.saved: list[str] = []

    def _file(self, local_path: str) -> str:
        return os.path.join(local_path, f"rank_{torch.distributed.get_rank()}.pt")

    def save_checkpoint(self, local_path: str, hdfs_path: Any = None, global_step: int = 0, max_ckpt_to_keep=None):
        import shutil

        os.makedirs(local_path, exist_ok=True)
        state = {
            "model": [chunk.state_dict() for chunk in self.model],
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": torch.random.get_rng_state(),
            "global_step": global_step,
        }
        torch.save(state, self._file(local_path))
        self.saved.append(local_path)
        if max_ckpt_to_keep and torch.distributed.get_rank() == 0:
            while len(self.saved) > max_ckpt_to_keep:
                shutil.rmtree(os.path.dirname(self.saved.pop(0).rstrip("/")), ignore_errors=True)

    def load_checkpoint(self, local_path: str, hdfs_path: Any = None, del_local_after_load: bool = False) -> None:
        state = torch.load(self._file(local_path), weights_only=False)
        for chunk, chunk_state in zip(self.model, state["model"], strict=True):
            chunk.load_state_dict(chunk_state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.random.set_rng_state(state["rng"])
        _record("load_checkpoint", step=int(state["global_step"]))


# --- lifecycle record ---------------------------------------------------------------------------------------------


def _record(event: str, **fields: Any) -> None:
    directory = envs.rehearse_dir()
    if not directory:
        return
    line = json.dumps({"t": time.time(), "pid": os.getpid(), "event": event, **fields})
    with open(os.path.join(directory, f"lifecycle-{os.getpid()}.log"), "a", encoding="utf-8") as f:
        f.write(line + "\n")


def _recorded(name: str, method: Any) -> Any:
    @functools.wraps(method)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        tags = kwargs.get("tags", args[0] if args and name == "resume" else None)
        _record(f"{name}({','.join(tags)})" if tags else name)
        return await method(self, *args, **kwargs)

    return wrapper


def _record_lifecycle() -> None:
    from r1_ascend.patches.vllm_rollout_offload import rollout_class

    NPUOffloadVLLMRollout = rollout_class()
    for name in ("release", "resume", "update_weights"):
        method = NPUOffloadVLLMRollout.__dict__[name]
        if not getattr(method, "__r1_rehearse__", False):
            wrapped = _recorded(name, method)
            wrapped.__r1_rehearse__ = True
            setattr(NPUOffloadVLLMRollout, name, wrapped)

    original = NPUOffloadVLLMRollout.__dict__["generate_sequences"]
    if not getattr(original, "__r1_rehearse__", False):

        @functools.wraps(original)
        def generate(self: Any, prompts: Any, **kwargs: Any) -> Any:
            _record("generate", validate=bool(prompts.meta_info.get("validate", False)))
            return original(self, prompts, **kwargs)

        generate.__r1_rehearse__ = True
        NPUOffloadVLLMRollout.generate_sequences = generate


# --- install ------------------------------------------------------------------------------------------------------


def install() -> None:
    """Install every stand-in of :data:`STAND_INS` in this process (idempotent)."""
    import verl.utils.megatron.optimizer as megatron_optimizer
    import verl.utils.megatron_utils as megatron_utils
    import verl.workers.actor.megatron_actor as megatron_actor
    import verl.workers.megatron_workers as megatron_workers
    import verl.workers.rollout.vllm_rollout.vllm_rollout_spmd as vllm_rollout_spmd

    _install_cpu_device_api()
    megatron_workers.get_nccl_backend = lambda: "gloo"
    megatron_workers.set_random_seed = _set_random_seed
    megatron_workers.topk_reduce_ratio_min_max = _topk_reduce_ratio_min_max
    megatron_utils.make_megatron_module = _make_module
    megatron_optimizer.get_megatron_optimizer = lambda model, config, **_: CPUAdam(model, config)
    megatron_workers.register_megatron_training_hooks = _none
    megatron_workers.per_tensor_generator = _per_tensor_generator
    megatron_workers.MegatronCheckpointManager = CPUCheckpointManager
    megatron_actor.get_forward_backward_func = _forward_backward_func
    vllm_rollout_spmd.LLM = TinyPolicyLLM
    _record_lifecycle()
    _record("stand-ins installed")


install()
