"""vLLM's own DeepSeek-V3 model class, built on the CPU, so HF-named weights go through its ``load_weights``.

On the cluster the rollout's weights reach the class vLLM's model registry resolves for ``DeepseekV3ForCausalLM``
once vllm-ascend has registered its models: ``vllm_ascend.models.deepseek_v2.CustomDeepseekV3ForCausalLM``
(``vllm_ascend/models/__init__.py:57-59``). Its ``load_weights`` (``deepseek_v2.py:863``) is vLLM's
``DeepseekV2ForCausalLM.load_weights`` (``vllm/model_executor/models/deepseek_v2.py:741``): ``gate_proj`` and
``up_proj`` stacked into ``gate_up_proj``, every routed expert's three matrices into ``FusedMoE``'s ``w13_weight`` /
``w2_weight`` through ``FusedMoE.weight_loader`` (``fused_moe/layer.py:1124``), which drops the experts another EP
rank owns. :func:`build` makes that class here; :func:`hf_tensors` reads its parameters back under the HF names,
whole (TP shards and EP ranks' experts gathered, each expert from the rank and slot its expert map names), in the
layout vLLM's MoE and MLP kernels read them (the gate in the first half of ``w13`` and of ``gate_up_proj``): what a
decoder that holds the whole model, as the CPU engine does, must be given.

Real: the registry's choice, the model's module tree and shapes, every ``weight_loader``, the TP / EP group
coordinators (gloo). Stood in, all at device-only calls made while the model is built:

- vllm-ascend puts tensors on ``"npu"`` by name (``_set_cos_sin_cache(..., device="npu")``,
  ``vllm_ascend/ops/rotary_embedding.py:279``; the platform's ``device_type``/``device_name`` in vLLM's group
  coordinator and rotary embeddings). torch's PrivateUse1 backend is named ``"npu"`` here, as ``torch_npu`` names
  it, so those device strings parse; :class:`NPUOnCPU` then allocates what is asked for on ``"npu"`` on the CPU.
- the accelerator torch's collectives ask for (``torch._C._get_accelerator``, in every ``dist.barrier``) is the
  CPU: the renamed backend has no C++ hooks, which only torch_npu registers.
- the process groups carry gloo for the ``npu`` device type too, so ``AscendUnquantizedFusedMoEMethod`` asking the
  group for its HCCL communicator's name (``vllm_ascend/ops/fused_moe.py:989``) takes its own ``AttributeError``
  branch (no name), as on any backend without HCCL.

:func:`check_targets` fails loudly when a release moves these lines.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

#: The device type torch_npu registers as torch's PrivateUse1 backend.
NPU = "npu"
#: Process-group backends by device type: gloo for both, so the HCCL-only lookups find no HCCL communicator.
GROUP_BACKEND = "cpu:gloo,npu:gloo"
#: The architecture verl's DeepSeek-V3 checkpoints name in ``config.json``.
ARCHITECTURE = "DeepseekV3ForCausalLM"
#: Upstream lines the stand-ins answer: (module, function or class, text it must still contain).
TARGETS = (
    ("vllm_ascend.ops.rotary_embedding", "deepseek_rope_init_func", 'device="npu"'),
    ("vllm_ascend.ops.fused_moe", "AscendUnquantizedFusedMoEMethod", '_get_backend(torch.device("npu"))'),
    ("vllm.model_executor.layers.fused_moe.layer", "FusedMoE", "_map_global_expert_id_to_local_expert_id"),
)


class UpstreamDriftError(RuntimeError):
    """An upstream line the CPU build of vLLM's model stands in for has changed."""


def check_targets() -> None:
    """Raise :class:`UpstreamDriftError` naming each stood-in upstream line that is no longer there."""
    import importlib

    missing = []
    for module_name, attribute, text in TARGETS:
        source = inspect.getsource(getattr(importlib.import_module(module_name), attribute))
        if text not in source:
            missing.append(f"{module_name}.{attribute} no longer contains {text!r}")
    if missing:
        msg = (
            "the CPU build of vLLM's DeepSeek model stands in for upstream lines that moved: "
            + "; ".join(missing)
            + ". Re-read the pinned vllm / vllm-ascend sources and update src/r1_ascend/cpu/vllm_deepseek.py."
        )
        raise UpstreamDriftError(msg)


def _no_accelerator() -> torch.device:
    return torch.device("cpu")


def name_npu_backend() -> None:
    """Name torch's PrivateUse1 backend ``"npu"`` (what torch_npu does), once per process.

    torch_npu also registers the backend's C++ hooks, which no Python code can; without them torch's question "which
    accelerator does this machine have" (``torch._C._get_accelerator``, asked by every ``dist.barrier``) raises.
    It is answered here as on any machine without one: the CPU."""
    if torch._C._get_privateuse1_backend_name() != NPU:
        torch.utils.rename_privateuse1_backend(NPU)
    try:
        torch._C._get_accelerator()
    except RuntimeError:
        torch._C._get_accelerator = _no_accelerator


def _on_cpu(value: Any) -> Any:
    if isinstance(value, torch.device):
        device_type = value.type
    else:
        device_type = value.split(":")[0] if isinstance(value, str) else ""
    return torch.device("cpu") if device_type == NPU else value


class NPUOnCPU(TorchFunctionMode):
    """Every tensor asked for on ``"npu"`` (``device=`` or ``Tensor.to``) is made on the CPU instead."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = _on_cpu(kwargs["device"])
        if func is torch.Tensor.to:
            args = tuple(_on_cpu(arg) for arg in args)
        return func(*args, **kwargs)


def register_in_process(architecture: str = ARCHITECTURE) -> None:
    """vllm-ascend's registration, with the registry's class for ``architecture`` imported in this process.

    vllm-ascend registers its models by name; vLLM then inspects such a class in a fresh interpreter (``registry.py``
    ``_LazyRegisteredModel.inspect_model_cls``, "to avoid initializing CUDA"), about 20 s of imports here for no
    device. The class the registry names is loaded here and registered as the class itself (vLLM's own
    ``_RegisteredModel`` path): the same class, inspected in process."""
    from vllm import ModelRegistry
    from vllm_ascend.models import register_model

    register_model()
    ModelRegistry.register_model(architecture, ModelRegistry.models[architecture].load_model_cls())


def vllm_config(
    model_dir: Path,
    dtype: torch.dtype,
    *,
    tensor_parallel_size: int = 1,
    expert_parallel: bool = False,
    max_model_len: int = 512,
) -> Any:
    """The ``VllmConfig`` of a rollout engine for ``model_dir`` (eager: vllm-ascend runs DeepSeek eager or torchair)."""
    from vllm.config import DeviceConfig, LoadConfig, ModelConfig, ParallelConfig, VllmConfig

    register_in_process()
    model = ModelConfig(
        model=str(model_dir),
        tokenizer=str(model_dir),
        skip_tokenizer_init=True,
        dtype=dtype,
        seed=0,
        max_model_len=max_model_len,
        enforce_eager=True,
    )
    return VllmConfig(
        model_config=model,
        device_config=DeviceConfig("cpu"),
        load_config=LoadConfig(load_format="dummy"),
        parallel_config=ParallelConfig(
            tensor_parallel_size=tensor_parallel_size, enable_expert_parallel=expert_parallel
        ),
    )


def init_groups(config: Any, world_size: int, rank: int, init_method: str) -> None:
    """vLLM's world, TP and EP group coordinators and vllm-ascend's MC2 / LM-head groups, as its NPU worker builds
    them (``vllm_ascend/worker/worker_v1.py:301-308``), over gloo, with the config's TP size; on an initialised
    torch.distributed world only the coordinators are built, and where vLLM's model-parallel groups exist already
    (the overlay's ``vllm_dp_ep_groups`` builds them when rollout DP > 1) only vllm-ascend's are added."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state
    from vllm_ascend.distributed.parallel_state import init_ascend_model_parallel

    name_npu_backend()
    with set_current_vllm_config(config):
        parallel_state.init_distributed_environment(world_size, rank, init_method, rank, GROUP_BACKEND)
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(config.parallel_config.tensor_parallel_size, 1, GROUP_BACKEND)
        parallel = config.parallel_config
        init_ascend_model_parallel(parallel.expert_parallel_size, parallel.lmhead_tp_size)


def model_class(config: Any) -> type[torch.nn.Module]:
    """The class vLLM's registry resolves for the config's architecture (vllm-ascend's: :func:`vllm_config`
    registered it)."""
    from vllm.model_executor.model_loader.utils import get_model_architecture

    cls, _ = get_model_architecture(config.model_config)
    return cls


def build(config: Any) -> torch.nn.Module:
    """The registry's DeepSeek-V3 class for ``config``, on the CPU in the config's dtype, as vLLM's model loader
    leaves it at start-up (call :func:`init_groups` first).

    The loader ends with ``process_weights_after_loading`` (``model_loader/base_loader.py`` of vLLM 0.9.1, for the
    dummy load verl asks for as for a real one). That matters for every later sync: vllm-ascend's
    ``AscendUnquantizedFusedMoEMethod.process_weights_after_loading`` (``fused_moe.py:995``) replaces ``w13_weight``
    and ``w2_weight`` by new parameters without their ``weight_loader``, so a second ``load_weights`` stops with an
    ``AttributeError`` unless verl's ``patch_vllm_moe_model_weight_loader`` has put the loaders back."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading, set_default_torch_dtype

    check_targets()
    name_npu_backend()
    cls = model_class(config)
    with set_current_vllm_config(config), set_default_torch_dtype(config.model_config.dtype), NPUOnCPU():
        model = cls(vllm_config=config)
        process_weights_after_loading(model, config.model_config, torch.device("cpu"))
    return model.eval()


def _gather(tensor: torch.Tensor, dim: int, coordinator: Any) -> torch.Tensor:
    """``tensor`` of every rank of a vLLM group coordinator, concatenated along ``dim`` in rank order (gloo)."""
    if coordinator.world_size == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(coordinator.world_size)]
    torch.distributed.all_gather(parts, tensor.contiguous(), group=coordinator.cpu_group)
    return torch.cat(parts, dim=dim)


def _gather_halves(tensor: torch.Tensor, dim: int, coordinator: Any) -> torch.Tensor:
    """A stacked gate/up shard (gate rows first, then up rows, along ``dim``) gathered into the whole stack."""
    gate, up = tensor.chunk(2, dim=dim)
    return torch.cat([_gather(gate, dim, coordinator), _gather(up, dim, coordinator)], dim=dim)


def _whole_linear(module: Any, weight: torch.Tensor) -> torch.Tensor:
    """A linear layer's weight as one matrix: shards of the TP group put back together in rank order."""
    from vllm.distributed import get_tp_group
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        RowParallelLinear,
    )

    if isinstance(module, MergedColumnParallelLinear):
        return _gather_halves(weight, 0, get_tp_group())
    if isinstance(module, ColumnParallelLinear):
        return _gather(weight, 0, get_tp_group())
    if isinstance(module, RowParallelLinear):
        return _gather(weight, 1, get_tp_group())
    return weight


def _whole_vocab(module: Any, weight: torch.Tensor) -> torch.Tensor:
    """A vocab-parallel embedding or LM head (vllm-ascend's over its own LM-head group), padding rows dropped."""
    from vllm.distributed import get_tp_group
    from vllm_ascend.distributed.parallel_state import get_lmhead_group
    from vllm_ascend.ops.lmhead import CustomParallelLMHead

    group = get_lmhead_group() if isinstance(module, CustomParallelLMHead) else get_tp_group()
    return _gather(weight, 0, group)[: module.org_vocab_size]


def _whole_experts(module: Any, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w13, w2)`` of every expert in global order: slots of every EP rank placed by that rank's expert map,
    intermediate shards of the MoE's TP group put back together."""
    from vllm.distributed import get_ep_group, get_tp_group

    w13, w2 = module.w13_weight.data, module.w2_weight.data
    if module.tp_size > 1:
        w13, w2 = _gather_halves(w13, 1, get_tp_group()), _gather(w2, 2, get_tp_group())
    experts = module.global_num_experts
    expert_map = module.expert_map if module.expert_map is not None else torch.arange(experts)
    if module.ep_size == 1:
        slots = expert_map.tolist()
        return w13[slots], w2[slots]
    group = get_ep_group()
    maps = _gather(expert_map.to(torch.int64).unsqueeze(0), 0, group)
    all_w13 = _gather(w13.unsqueeze(0), 0, group)
    all_w2 = _gather(w2.unsqueeze(0), 0, group)
    whole13, whole2 = [], []
    for expert in range(experts):
        owners = (maps[:, expert] >= 0).nonzero().flatten().tolist()
        if len(owners) != 1:
            msg = f"expert {expert} of {prefix} is held by EP ranks {owners}, expected exactly one"
            raise ValueError(msg)
        slot = int(maps[owners[0], expert])
        whole13.append(all_w13[owners[0], slot])
        whole2.append(all_w2[owners[0], slot])
    return torch.stack(whole13), torch.stack(whole2)


def hf_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights under the HF checkpoint names, whole, split as vLLM's kernels read them.

    A collective over the model's TP, EP and LM-head groups: every rank calls it, and every rank gets every tensor.
    Shards are put back together in rank order; each expert comes from the EP rank whose expert map owns it, from
    the slot that map names (the slot its kernels route the expert's tokens to). ``gate_up_proj`` and ``w13`` hold
    the gate in their first half (``SiluAndMul`` and the fused MoE take ``x[..., :d]`` as the gate); ``w2[e]`` is
    expert ``e``'s ``down_proj``."""
    from vllm.model_executor.layers.fused_moe import FusedMoE
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    tensors: dict[str, torch.Tensor] = {}
    for prefix, module in model.named_modules():
        if isinstance(module, FusedMoE):
            w13, w2 = _whole_experts(module, prefix)
            half = w13.shape[1] // 2
            for expert in range(w13.shape[0]):
                base = f"{prefix}.{expert}"
                tensors[f"{base}.gate_proj.weight"] = w13[expert, :half]
                tensors[f"{base}.up_proj.weight"] = w13[expert, half:]
                tensors[f"{base}.down_proj.weight"] = w2[expert]
            continue
        for name, param in module.named_parameters(recurse=False):
            full = f"{prefix}.{name}" if prefix else name
            data = param.data
            if isinstance(module, LinearBase) and name == "weight":
                data = _whole_linear(module, data)
            elif isinstance(module, VocabParallelEmbedding) and name == "weight":
                data = _whole_vocab(module, data)
            if ".gate_up_proj." in full:
                gate, up = data.chunk(2, dim=0)
                tensors[full.replace("gate_up_proj", "gate_proj")] = gate
                tensors[full.replace("gate_up_proj", "up_proj")] = up
            else:
                tensors[full] = data
    return tensors
