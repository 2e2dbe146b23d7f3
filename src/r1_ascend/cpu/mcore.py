"""megatron-core 0.12.1's DeepSeek-V3 ``GPTModel`` on the CPU: replacements for its device-only calls, nothing else.

verl builds the actor with megatron-core's Transformer Engine layer spec, and megatron-core reaches the CUDA device
at a handful of call sites (streams, ``torch.cuda.current_device()``, the CUDA RNG tracker, fused kernels). On a
machine without CUDA or an NPU each of those fails; everything around them (MLA with yarn rope, the sigmoid
router with expert bias and group-limited routing, the alltoall token dispatcher, grouped and shared experts,
tensor/expert-parallel mappings over gloo, Megatron DDP, the distributed optimizer, dist checkpointing) is
device-agnostic upstream code and runs unchanged. :data:`REPLACEMENTS` is the complete list: what is replaced,
where (upstream ``module:line``), why, and what stands in. Every replacement checks its target before installing
(:func:`check_targets`): a class or function that moved, changed its signature or lost the device call fails
with the upstream location, so drift in the pinned packages fails a test instead of silently running
something else.

One module over the project's 400 lines: the replacements, their list and the check of each target against
its upstream source are one unit (a replacement added without its list entry and check is the drift this module
exists to catch), and splitting it would put the three in different files.

The Transformer Engine stand-ins keep TE's parameter names and sharded-state-dict keys (``layer_norm_weight``,
``weight0..N`` of a grouped linear, ``experts.experts.linear_fc1.weight`` in a checkpoint), so the dist checkpoint
the converter writes for the cluster loads here unchanged, and verl's weight export sees the cluster's names.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import math
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

#: The megatron-core and verl versions these replacements were written against (src/r1_ascend/stack.toml pins them).
MEGATRON_CORE_VERSION = "0.12.1"
VERL_VERSION = "0.6.1"


class McoreCPUDriftError(RuntimeError):
    """An upstream target of a CPU replacement no longer looks as expected."""


# --- Transformer Engine stand-ins ---------------------------------------------------------------------------------


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in fp32, cast back: TE's ``RMSNorm`` and DeepSeek-V3's reference both normalise in fp32."""
    dtype = x.dtype
    x32 = x.float()
    out = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * out).to(dtype)


def _te_layer_norm_column_parallel_linear() -> type:
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    class CPULayerNormColumnParallelLinear(ColumnParallelLinear):
        """TE's ``TELayerNormColumnParallelLinear``: RMSNorm (``layer_norm_weight``) fused before a column-parallel
        linear. Here the norm runs in torch, then megatron-core's own ``ColumnParallelLinear``."""

        def __init__(self, input_size: int, output_size: int, *, config: Any, **kwargs: Any) -> None:
            super().__init__(input_size, output_size, config=config, **kwargs)
            if config.normalization != "RMSNorm":
                msg = f"the CPU TELayerNormColumnParallelLinear implements RMSNorm, not {config.normalization}"
                raise NotImplementedError(msg)
            self.eps = float(config.layernorm_epsilon)
            self.layer_norm_weight = torch.nn.Parameter(torch.ones(input_size, dtype=config.params_dtype))
            if config.sequence_parallel:
                self.layer_norm_weight.sequence_parallel = True

        def forward(self, input_: torch.Tensor, weight: torch.Tensor | None = None, **kwargs: Any):
            return super().forward(_rms_norm(input_, self.layer_norm_weight, self.eps), weight, **kwargs)

    return CPULayerNormColumnParallelLinear


def _te_dot_product_attention() -> type:
    from megatron.core.transformer.module import MegatronModule

    class CPUDotProductAttention(MegatronModule):
        """TE's ``TEDotProductAttention`` (a fused kernel): causal softmax attention per sequence in torch, for
        MLA's different q/k and v head sizes, on ``sbhd`` batches and on packed ``thd`` sequences (cu_seqlens)."""

        def __init__(
            self,
            config: Any,
            layer_number: int,
            attn_mask_type: Any,
            attention_type: str,
            attention_dropout: float | None = None,
            softmax_scale: float | None = None,
            k_channels: int | None = None,
            v_channels: int | None = None,
            cp_comm_type: str = "p2p",
        ) -> None:
            super().__init__(config=config)
            if config.context_parallel_size != 1:
                raise NotImplementedError("the CPU attention stand-in has no context parallelism")
            self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(k_channels or 1)

        def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            # q, k: [n, s, d_qk]; v: [n, s, d_v] -> [s, n * d_v]
            out = F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), is_causal=True, scale=self.softmax_scale
            ).to(v.dtype)
            return out.transpose(0, 1).reshape(q.shape[1], -1)

        def forward(
            self,
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attention_mask: torch.Tensor | None,
            attn_mask_type: Any = None,
            attention_bias: torch.Tensor | None = None,
            packed_seq_params: Any = None,
        ) -> torch.Tensor:
            if attention_bias is not None:
                raise NotImplementedError("attention bias is not used by DeepSeek-V3")
            if packed_seq_params is not None:  # thd: [t, n, d]
                bounds = packed_seq_params.cu_seqlens_q_padded
                if bounds is None:
                    bounds = packed_seq_params.cu_seqlens_q
                bounds = [int(b) for b in bounds.tolist()]
                parts = [
                    self._attend(*(t[start:end].transpose(0, 1) for t in (query, key, value)))
                    for start, end in itertools.pairwise(bounds)
                ]
                total = query.shape[0]
                if bounds[-1] < total:  # padding after the last sequence: zeros, as TE leaves it unattended
                    parts.append(query.new_zeros(total - bounds[-1], parts[0].shape[-1] if parts else 0))
                return torch.cat(parts, dim=0)
            # sbhd: [s, b, n, d] -> [s, b, n * d_v]
            outs = [
                self._attend(*(t[:, b].transpose(0, 1) for t in (query, key, value))) for b in range(query.shape[1])
            ]
            return torch.stack(outs, dim=1)

    return CPUDotProductAttention


def _te_grouped_linears() -> tuple[type, type]:
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.utils import replace_prefix_for_sharding
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    class CPUGroupedLinear(MegatronModule):
        """TE's ``GroupedLinear`` (a grouped GEMM kernel): one weight per local expert (``weight0..N-1``, TE's
        names), applied to consecutive row blocks of sizes ``m_splits``. Expert tensor parallelism is 1 on our
        layouts; anything else is refused rather than mis-sharded."""

        tp_axis: int = 0

        def __init__(
            self,
            num_gemms: int,
            input_size: int,
            output_size: int,
            *,
            config: Any,
            init_method: Callable[[torch.Tensor], Any],
            bias: bool,
            skip_bias_add: bool,
            is_expert: bool,
            tp_comm_buffer_name: str | None = None,
        ) -> None:
            super().__init__(config=config)
            if bias:
                raise NotImplementedError("DeepSeek-V3 experts have no bias")
            if parallel_state.get_expert_tensor_parallel_world_size() != 1:
                raise NotImplementedError("the CPU grouped-linear stand-in supports expert tensor parallel size 1")
            self.num_gemms = num_gemms
            for index in range(num_gemms):
                weight = torch.empty(output_size, input_size, dtype=config.params_dtype)
                if config.perform_initialization:
                    init_method(weight)
                param = torch.nn.Parameter(weight)
                # as TE marks them: tensor-parallel along the class's axis, expert grads reduced over expert-DP
                set_tensor_model_parallel_attributes(param, is_parallel=True, dim=self.tp_axis, stride=1)
                param.allreduce = not is_expert
                setattr(self, f"weight{index}", param)

        def forward(self, x: torch.Tensor, m_splits: list[int]) -> tuple[torch.Tensor, None]:
            chunks = torch.split(x, list(m_splits))
            outs = [chunk @ getattr(self, f"weight{i}").t() for i, chunk in enumerate(chunks)]
            return torch.cat(outs, dim=0), None

        def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: Any = None) -> dict:
            """TE's ``_sharded_state_dict_grouped`` keys: each local weight is expert ``ep_rank * N + i`` of the
            global expert axis, replicated over expert-data-parallel ranks."""
            result = {}
            ep_rank = parallel_state.get_expert_model_parallel_rank()
            global_experts = parallel_state.get_expert_model_parallel_world_size() * self.num_gemms
            ep_axis = len(sharded_offsets)
            for index in range(self.num_gemms):
                offsets = (*sharded_offsets, (ep_axis, ep_rank * self.num_gemms + index, global_experts))
                sub = make_sharded_tensors_for_checkpoint(
                    {f"{index}.weight": getattr(self, f"weight{index}")}, "", {f"{index}.weight": self.tp_axis}, offsets
                )
                replace_prefix_for_sharding(sub, f"{index}.", prefix)
                tensor = sub[f"{index}.weight"]
                tensor.replica_id = (*tensor.replica_id[:2], parallel_state.get_expert_data_parallel_rank())
                result[f"{prefix}weight{index}"] = tensor
            return result

    class CPUColumnParallelGroupedLinear(CPUGroupedLinear):
        tp_axis = 0

    class CPURowParallelGroupedLinear(CPUGroupedLinear):
        tp_axis = 1

    return CPUColumnParallelGroupedLinear, CPURowParallelGroupedLinear


def te_standins() -> dict[str, type]:
    """TE class name -> the CPU class of the same role (megatron-core's own local class where one exists)."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    column_grouped, row_grouped = _te_grouped_linears()
    return {
        "TENorm": WrappedTorchNorm,
        "TEColumnParallelLinear": ColumnParallelLinear,
        "TERowParallelLinear": RowParallelLinear,
        "TELayerNormColumnParallelLinear": _te_layer_norm_column_parallel_linear(),
        "TEDotProductAttention": _te_dot_product_attention(),
        "TEColumnParallelGroupedLinear": column_grouped,
        "TERowParallelGroupedLinear": row_grouped,
    }


#: Modules that name TE classes in their layer specs (imported from megatron.core.extensions.transformer_engine,
#: which defines nothing without TE installed), and the names each uses.
TE_SPEC_MODULES: dict[str, tuple[str, ...]] = {
    "megatron.core.models.gpt.gpt_layer_specs": (
        "TEColumnParallelLinear",
        "TEDotProductAttention",
        "TELayerNormColumnParallelLinear",
        "TENorm",
        "TERowParallelLinear",
    ),
    "megatron.core.models.gpt.moe_module_specs": (
        "TEColumnParallelGroupedLinear",
        "TEColumnParallelLinear",
        "TERowParallelGroupedLinear",
        "TERowParallelLinear",
    ),
}


# --- CUDA device calls --------------------------------------------------------------------------------------------


class _NoStream:
    """A CUDA stream on a machine with one synchronous device: waiting and recording are no-ops."""

    def wait_stream(self, _other: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def record_event(self, *_: Any) -> None:
        return None


_NO_STREAM = _NoStream()


def _cpu_cuda_namespace() -> types.SimpleNamespace:
    """What the listed megatron-core modules call on ``torch.cuda``, answered for the CPU device."""
    return types.SimpleNamespace(
        current_device=lambda: torch.device("cpu"),
        Stream=lambda *_, **__: _NO_STREAM,
        current_stream=lambda *_: _NO_STREAM,
        default_stream=lambda *_: _NO_STREAM,
        stream=lambda _stream: contextlib.nullcontext(),
        is_available=lambda: False,
        synchronize=lambda *_: None,
        amp=torch.cuda.amp,
    )


def _on_cpu(factory: Callable[..., Any]) -> Callable[..., Any]:
    """A tensor factory that places ``device='cuda'`` (the literal upstream passes) on the CPU."""

    def make(*args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return factory(*args, **kwargs)

    return make


#: Tensor factories that upstream calls with a literal ``device='cuda'``.
_FACTORIES = ("tensor", "empty", "zeros", "ones", "full", "arange", "empty_like")


class _TorchOnCPU(types.ModuleType):
    """``torch`` as one upstream module sees it: everything is torch, except ``torch.cuda``'s device calls and
    tensors created with a literal ``device='cuda'``."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _cpu_cuda_namespace()
        for name in _FACTORIES:
            setattr(self, name, _on_cpu(getattr(torch, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


#: Upstream modules whose module-level ``torch`` is given the CPU ``torch.cuda`` (module -> the calls it makes).
CUDA_CALL_MODULES: dict[str, tuple[str, ...]] = {
    "megatron.core.models.common.embeddings.rotary_pos_embedding": ("torch.cuda.current_device()",),
    "megatron.core.models.common.embeddings.yarn_rotary_pos_embedding": ("torch.cuda.current_device()",),
    "megatron.core.transformer.moe.token_dispatcher": ("torch.cuda.Stream()",),
    "megatron.core.transformer.moe.shared_experts": ("torch.cuda.Stream()",),
    "megatron.core.transformer.moe.router": ("torch.cuda.current_device()",),
    "megatron.core.tensor_parallel.mappings": ("torch.cuda.current_device()",),
    "megatron.core.tensor_parallel.layers": ("torch.cuda.current_device()",),
    "megatron.core.utils": ("torch.cuda.current_device()",),
    "megatron.core.distributed.param_and_grad_buffer": ("torch.cuda.current_device()",),
    "megatron.core.optimizer.distrib_optimizer": ("torch.cuda.current_device()",),
    "megatron.core.optimizer.optimizer": ("torch.cuda.current_device()", "device='cuda'"),
    "megatron.core.optimizer.clip_grads": ("device='cuda'",),
    "megatron.core.optimizer.grad_scaler": ("device='cuda'",),
    "megatron.core.pipeline_parallel.schedules": ('device="cuda"',),
    "megatron.core.pipeline_parallel.p2p_communication": ("torch.cuda.current_device()", "torch.cuda.synchronize()"),
    "megatron.core.dist_checkpointing.strategies.filesystem_async": ("torch.cuda.synchronize()",),
    "megatron.core.dist_checkpointing.strategies.async_utils": (
        "torch.cuda.synchronize()",
        "torch.cuda.current_device()",
    ),
    "megatron.core.dist_checkpointing.strategies.fully_parallel": ("torch.cuda.synchronize()",),
    "megatron.core.dist_checkpointing.strategies.state_dict_saver": ("device='cuda'",),
    "megatron.core.dist_checkpointing.exchange_utils": ("device='cuda'",),
}


# --- the list, and its checks -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replacement:
    """One device-only call and what stands in for it."""

    what: str
    where: str  # upstream module:line (megatron-core 0.12.1 / verl 0.6.1)
    why: str
    stand_in: str


REPLACEMENTS: tuple[Replacement, ...] = (
    Replacement(
        "Transformer Engine layer classes",
        "megatron/core/models/gpt/gpt_layer_specs.py:39, moe_module_specs.py:15 (verl builds the TE spec: "
        "verl/models/mcore/model_initializer.py:174)",
        "TE is a CUDA library; without it those names are undefined and verl's spec cannot be built",
        "megatron-core's local ColumnParallelLinear/RowParallelLinear/WrappedTorchNorm; RMSNorm+ColumnParallelLinear "
        "with TE's layer_norm_weight; torch causal attention over cu_seqlens; a grouped linear with TE's weight0..N "
        "and checkpoint keys",
    ),
    Replacement(
        "torch.cuda.current_device()",
        "megatron/core/models/common/embeddings/rotary_pos_embedding.py:155,262, yarn_rotary_pos_embedding.py:103,107, "
        "transformer/moe/router.py:64, tensor_parallel/mappings.py:142, tensor_parallel/layers.py:499, utils.py:394, "
        "distributed/param_and_grad_buffer.py:625, optimizer/distrib_optimizer.py:718, optimizer/optimizer.py:1003",
        "buffers and moved tensors are placed on the CUDA device",
        "the CPU device, through a module-local torch whose torch.cuda answers for the CPU",
    ),
    Replacement(
        "torch.cuda.Stream()",
        "megatron/core/transformer/moe/token_dispatcher.py:327, transformer/moe/shared_experts.py:84",
        "side streams overlap the alltoall's device-to-host copy and the shared experts with the routed ones",
        "a stream object whose waits are no-ops (the CPU runs one stream)",
    ),
    Replacement(
        "tensor.is_cuda in maybe_move_tensor_to_cpu",
        "megatron/core/transformer/moe/moe_utils.py:754",
        "the alltoall dispatcher takes its split sizes to the host only for CUDA tensors, else keeps a tensor",
        "CPU tensors take the same path (they are on the host already)",
    ),
    Replacement(
        "CUDA RNG tracker",
        "megatron/core/tensor_parallel/random.py:232 (initialize_rng_tracker, behind get_cuda_rng_tracker and "
        "model_parallel_cuda_manual_seed)",
        "per-parallel-region CUDA generator states; verl seeds them and saves them in checkpoints",
        "the same tracker class over CPU generator states (torch.random.get/set_rng_state)",
    ),
    Replacement(
        "model.to('cpu:cpu')",
        "verl/utils/megatron_utils.py:128",
        "verl moves each chunk to f'{device}:{device_id}', which is not a device name on the CPU",
        "make_megatron_module passes its TransformerConfig to get_model, whose use_cpu_initialization branch then "
        "skips the move (the model is built on the CPU already)",
    ),
    Replacement(
        "device='cuda' literals",
        "megatron/core/optimizer/optimizer.py:357,365,369, clip_grads.py:90,103,115,174,206, grad_scaler.py:15, "
        "pipeline_parallel/schedules.py:477",
        "the optimizer's flags, scales and norms are created on the CUDA device by name",
        "the same module-local torch creates them on the CPU",
    ),
    Replacement(
        "'torch.cuda.FloatTensor' type checks",
        "megatron/core/optimizer/distrib_optimizer.py:387 (_build_model_and_main_param_groups), clip_grads.py:167",
        "parameters and gradients are validated by their CUDA type name",
        "during those two calls a CPU tensor's type() answers its dtype's CUDA name",
    ),
    Replacement(
        "FP8 parameter cast after each step",
        "megatron/core/optimizer/distrib_optimizer.py:2019 (quantize_param_shard, megatron/core/fp8_utils.py:302)",
        "called after every step, and without Transformer Engine it raises even when there is nothing to cast",
        "a no-op for an empty list of FP8 parameters (BF16/FP32 models have none); otherwise upstream's call",
    ),
    Replacement(
        "torch.cuda.synchronize() and CUDA buffers in dist checkpointing",
        "megatron/core/dist_checkpointing/strategies/filesystem_async.py:198, async_utils.py:148,195,546, "
        "fully_parallel.py:269,278, state_dict_saver.py:204, exchange_utils.py:106,112,307",
        "saving waits for the device before copying tensors to the host; flags and exchange buffers live on CUDA",
        "no-op synchronisation and host buffers through the module-local torch",
    ),
    Replacement(
        "torch.cuda in the pipeline's p2p",
        "megatron/core/pipeline_parallel/p2p_communication.py:46,50,54,58 (the shapes exchanged first, "
        "variable_seq_lengths), :106,403 (synchronize after batch_isend_irecv), :294,302 (receive buffers)",
        "the activations and gradients sent between pipeline stages, and their shapes, are placed on the device",
        "host tensors and a no-op synchronisation through the module-local torch (gloo sends host tensors)",
    ),
    Replacement(
        "tensor.cuda() in the 1F1B schedule",
        "megatron/core/pipeline_parallel/schedules.py:1828 (forward_backward_pipelining_without_interleaving)",
        "the schedule's token count for the loss is moved to the device",
        "during that schedule, .cuda() leaves a CPU tensor on the host",
    ),
    Replacement(
        "tensor.cuda() in the shard exchange",
        "megatron/core/dist_checkpointing/exchange_utils.py:317,478 (through fully_parallel.exchange_by_distribution)",
        "the fully parallel load moves each loaded shard to the device before broadcasting it to the other ranks",
        "during the exchange, .cuda() leaves a CPU tensor on the host (gloo broadcasts host tensors)",
    ),
    Replacement(
        "_write_item's arguments (torch version, not a device call)",
        "megatron/core/dist_checkpointing/strategies/filesystem_async.py:320,326",
        "megatron-core 0.12.1 calls torch 2.5's _write_item; the CPU environment's torch 2.13 adds an argument",
        "a wrapper passing SerializationFormat.TORCH_SAVE, what torch 2.5 writes; not installed under torch 2.5.1",
    ),
    Replacement(
        "Adam state without 'step' (TE/Apex fallback)",
        "megatron/core/optimizer/__init__.py:354 (init_state_fn), distrib_optimizer.py:604-606 (state_dict), "
        ":876-878 and :1437 (load_parameter_state_from_fs_model_space)",
        "without TE or Apex (CUDA libraries) torch's Adam keeps 'step' per parameter; the states created before a "
        "checkpoint load lack it and the distributed optimizer's state_dict reads it",
        "states created by init_state_fn get torch's initial step (0), and state_dict before the first step creates "
        "them (as Adam's first step would); the loaded checkpoint then sets them, and the per-parameter copy on load "
        "keeps the step load_state_dict set (distrib_optimizer.py:876-878 copies every state key, the loaded "
        "tensors leave 'step' out at :1437), and each state gets its own step tensor after a load (:740-743 shares one "
        "across all parameters, which Adam then increments once per parameter)",
    ),
    Replacement(
        "import transformer_engine",
        "verl/utils/checkpoint/megatron_checkpoint_manager.py:300",
        "verl registers TE's FusedAdam as a safe global before every checkpoint load",
        "a module stand-in providing that one name",
    ),
)


def module_source(module: str) -> str:
    return inspect.getsource(sys.modules[module] if module in sys.modules else __import__(module, fromlist=["_"]))


def check_targets() -> list[str]:
    """What no longer matches upstream (empty when every target is as the replacements expect)."""
    import importlib

    problems = []
    for module_name, names in TE_SPEC_MODULES.items():
        source = module_source(module_name)
        for name in names:
            if name not in source:
                problems.append(f"{module_name} no longer names {name}")
    for module_name, calls in CUDA_CALL_MODULES.items():
        source = module_source(module_name)
        for call in calls:
            if call not in source:
                problems.append(f"{module_name} no longer calls {call}")
    moe_utils = importlib.import_module("megatron.core.transformer.moe.moe_utils")
    if "tensor.is_cuda" not in inspect.getsource(moe_utils.maybe_move_tensor_to_cpu):
        problems.append("moe_utils.maybe_move_tensor_to_cpu no longer tests tensor.is_cuda")
    random_mod = importlib.import_module("megatron.core.tensor_parallel.random")
    if "global _CUDA_RNG_STATE_TRACKER" not in inspect.getsource(random_mod.initialize_rng_tracker):
        problems.append("tensor_parallel.random.initialize_rng_tracker no longer creates the global tracker")
    tracker_params = list(inspect.signature(random_mod.CudaRNGStatesTracker.add).parameters)
    if tracker_params != ["self", "name", "seed"]:
        problems.append(f"CudaRNGStatesTracker.add(self, name, seed) changed to {tracker_params}")
    megatron_utils = importlib.import_module("verl.utils.megatron_utils")
    if 'model_module.to(f"{get_device_name()}:{get_device_id()}")' not in inspect.getsource(megatron_utils.get_model):
        problems.append("verl.utils.megatron_utils.get_model no longer moves chunks to device:id")
    distrib = importlib.import_module("megatron.core.optimizer.distrib_optimizer")
    optimizer_class = distrib.DistributedOptimizer
    expected_methods = {
        "_build_model_and_main_param_groups": ["cls", "gbuf_ranges", "param_gbuf_map", "opt_group_ranges", "config"],
        "_set_main_param_and_optimizer_states": ["self", "model_param", "tensors"],
        "state_dict": ["self"],
        "load_state_dict": ["self", "state_dict"],
    }
    for method, params in expected_methods.items():
        function = inspect.unwrap(
            getattr(optimizer_class.__dict__[method], "__func__", optimizer_class.__dict__[method])
        )
        found = list(inspect.signature(function).parameters)
        if found != params:
            problems.append(f"DistributedOptimizer.{method}{tuple(params)} changed to {tuple(found)}")
    schedules = importlib.import_module("megatron.core.pipeline_parallel.schedules")
    pipelined = getattr(schedules, "forward_backward_pipelining_without_interleaving", None)
    if pipelined is not None and ".cuda()" not in inspect.getsource(inspect.unwrap(pipelined)):
        problems.append("the 1F1B schedule no longer moves a tensor with .cuda()")
    if 's["step"] = step' not in inspect.getsource(inspect.unwrap(optimizer_class.__dict__["load_state_dict"])):
        problems.append("DistributedOptimizer.load_state_dict no longer shares one Adam step across the states")
    for module_name, name in (
        ("megatron.core.optimizer.optimizer", "clip_grad_by_total_norm_fp32"),
        ("megatron.core.optimizer.distrib_optimizer", "quantize_param_shard"),
        ("megatron.core.dist_checkpointing.strategies.fully_parallel", "exchange_by_distribution"),
        ("megatron.core.pipeline_parallel.schedules", "forward_backward_pipelining_without_interleaving"),
        ("megatron.core.dist_checkpointing.strategies.filesystem_async", "_write_item"),
    ):
        if not callable(getattr(importlib.import_module(module_name), name, None)):
            problems.append(f"{module_name}.{name} is gone")
    manager = importlib.import_module("verl.utils.checkpoint.megatron_checkpoint_manager")
    if "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam" not in module_source(manager.__name__):
        problems.append("MegatronCheckpointManager no longer registers transformer_engine's FusedAdam")
    return problems


# --- install ------------------------------------------------------------------------------------------------------


def _maybe_move_tensor_to_cpu(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
    """``moe_utils.maybe_move_tensor_to_cpu`` for host tensors: what the CUDA branch returns."""
    if torch.is_tensor(tensor):
        tensor = tensor.to("cpu", non_blocking=True)
        if as_numpy:
            tensor = tensor.numpy()
    return tensor


class _CPURNGStatesTracker:
    """``CudaRNGStatesTracker`` over CPU generator states: forked regions draw from their own seeded stream."""

    def __init__(self) -> None:
        self.reset()

    def is_initialized(self) -> bool:
        return self._is_initialized

    def reset(self) -> None:
        self._is_initialized = False
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    def get_states(self) -> dict[str, torch.Tensor]:
        return {name: state.clone() for name, state in self.states_.items()}

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self._is_initialized = True
        self.states_ = {name: state.clone() for name, state in states.items()}

    def add(self, name: str, seed: int) -> None:
        self._is_initialized = True
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} already exists")
        if name in self.states_:
            raise ValueError(f"cuda rng state {name} already exists")
        self.seeds_.add(seed)
        saved = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.random.get_rng_state()
        torch.random.set_rng_state(saved)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng"):
        if name not in self.states_:
            raise KeyError(f"cuda rng state {name} is not added")
        saved = torch.random.get_rng_state()
        torch.random.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.random.get_rng_state()
            torch.random.set_rng_state(saved)


def _install_rng_tracker() -> None:
    """``initialize_rng_tracker`` creates the CPU tracker: ``get_cuda_rng_tracker`` and
    ``model_parallel_cuda_manual_seed`` (which verl's ``set_random_seed`` calls) both go through it."""
    import megatron.core.tensor_parallel.random as tp_random

    def initialize_rng_tracker(*_: Any, **__: Any) -> None:
        if tp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED:
            return
        tp_random._CUDA_RNG_STATE_TRACKER = _CPURNGStatesTracker()
        tp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True

    tp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = False
    tp_random.initialize_rng_tracker = initialize_rng_tracker
    initialize_rng_tracker()


def _install_transformer_engine_module() -> None:
    """The one name verl's checkpoint manager reads off ``transformer_engine`` (a safe global for torch.load)."""
    if "transformer_engine" in sys.modules:
        return

    class FusedAdam:  # never instantiated: only registered with torch.serialization
        pass

    te = types.ModuleType("transformer_engine")
    te.__r1_ascend_cpu_standin__ = True
    te.pytorch = types.SimpleNamespace(
        optimizers=types.SimpleNamespace(fused_adam=types.SimpleNamespace(FusedAdam=FusedAdam))
    )
    sys.modules["transformer_engine"] = te


def _call_within(module_name: str, name: str, context: Callable[[], Any]) -> None:
    """Rebind ``module_name.name`` (the name its callers look up) to run inside ``context()``, once."""
    import functools
    import importlib

    module = importlib.import_module(module_name)
    function = getattr(module, name)
    if getattr(function, "__r1_ascend_cpu__", False):
        return

    @functools.wraps(function)
    def within(*args: Any, **kwargs: Any) -> Any:
        with context():
            return function(*args, **kwargs)

    within.__r1_ascend_cpu__ = True
    setattr(module, name, within)


@contextlib.contextmanager
def _cuda_type_names() -> Any:
    """While upstream validates parameter types by name, a CPU tensor's ``type()`` answers the CUDA name of its
    dtype ('torch.cuda.FloatTensor'): the check is about the dtype, and the CUDA prefix is the device-only part."""
    original = torch.Tensor.type

    def type_(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        name = original(self, *args, **kwargs)
        if not args and not kwargs and self.device.type == "cpu" and name.startswith("torch."):
            return "torch.cuda." + name.removeprefix("torch.")
        return name

    torch.Tensor.type = type_
    try:
        yield
    finally:
        torch.Tensor.type = original


@contextlib.contextmanager
def _cuda_moves_stay_on_host() -> Any:
    """While dist checkpointing exchanges loaded shards between ranks, ``tensor.cuda()`` (the move to the
    collective's device) leaves a CPU tensor where it is: gloo communicates host tensors."""
    original = torch.Tensor.cuda

    def cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self if self.device.type == "cpu" else original(self, *args, **kwargs)

    torch.Tensor.cuda = cuda
    try:
        yield
    finally:
        torch.Tensor.cuda = original


def _install_checkpoint_exchange() -> None:
    """``FullyParallelLoadStrategyWrapper`` hands loaded shards to ``exchange_by_distribution``, which moves them with
    ``.cuda()`` (exchange_utils.py:317,478)."""

    _call_within(
        "megatron.core.dist_checkpointing.strategies.fully_parallel",
        "exchange_by_distribution",
        _cuda_moves_stay_on_host,
    )


def _install_pipeline_schedule() -> None:
    """The 1F1B schedule (pipeline-parallel size > 1) moves its token count with ``.cuda()`` (schedules.py:1828)."""
    _call_within(
        "megatron.core.pipeline_parallel.schedules",
        "forward_backward_pipelining_without_interleaving",
        _cuda_moves_stay_on_host,
    )


def _install_write_item_signature() -> None:
    """megatron-core 0.12.1 calls ``torch.distributed.checkpoint.filesystem._write_item`` with torch 2.5's arguments;
    the CPU environment's newer torch also wants ``serialization_format``, whose default is what 2.5 always wrote."""
    import functools

    import megatron.core.dist_checkpointing.strategies.filesystem_async as filesystem_async
    from torch.distributed.checkpoint import filesystem

    write_item = filesystem._write_item
    if "serialization_format" not in inspect.signature(write_item).parameters:
        return  # torch 2.5.1, as on the cluster: nothing to adapt
    if getattr(filesystem_async._write_item, "__r1_ascend_cpu__", False):
        return

    @functools.wraps(write_item)
    def write_item_torch_save(*args: Any) -> Any:
        return write_item(*args, filesystem.SerializationFormat.TORCH_SAVE)

    write_item_torch_save.__r1_ascend_cpu__ = True
    filesystem_async._write_item = write_item_torch_save


def _install_optimizer_state_step() -> None:
    """Without TE or Apex (CUDA libraries), megatron-core runs torch's Adam, whose per-parameter state holds the
    ``step``; the state ``init_state_fn`` creates before loading a checkpoint lacks it, and the distributed
    optimizer's ``state_dict`` (distrib_optimizer.py:604-606) reads it. New states get torch's initial ``step``."""
    import functools

    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    init = DistributedOptimizer.__init__
    if getattr(init, "__r1_ascend_cpu__", False):
        return

    @functools.wraps(init)
    def init_with_step(
        self: Any, optimizer: Any, config: Any, grad_scaler: Any, init_state_fn: Any, *args: Any, **kwargs: Any
    ) -> None:
        if init_state_fn is not None:
            upstream_init_state = init_state_fn

            def init_state_fn(opt: Any, config: Any = None) -> None:
                upstream_init_state(opt, config)
                for state in opt.state.values():
                    state.setdefault("step", torch.tensor(0.0))

        init(self, optimizer, config, grad_scaler, init_state_fn, *args, **kwargs)

    init_with_step.__r1_ascend_cpu__ = True
    DistributedOptimizer.__init__ = init_with_step

    state_dict = DistributedOptimizer.state_dict

    @functools.wraps(state_dict)
    def state_dict_with_step(self: Any) -> Any:
        if not self.optimizer.state and self.init_state_fn is not None:  # before the first step (a resume's load)
            self.init_state_fn(self.optimizer, self.config)
        return state_dict(self)

    DistributedOptimizer.state_dict = state_dict_with_step

    set_states = DistributedOptimizer._set_main_param_and_optimizer_states

    @functools.wraps(set_states)
    def set_states_keeping_step(self: Any, model_param: Any, tensors: dict[str, Any]) -> Any:
        """``load_state_dict`` put the checkpoint's 'step' into every Adam state; the per-parameter tensors read
        from the checkpoint leave it out (distrib_optimizer.py:1437), and the copy loop (:876-878) wants every key
        of the state: the step already set is kept."""
        if "step" not in tensors and not self.config.use_precision_aware_optimizer:
            group_index, group_order = self.model_param_group_index_map[model_param]
            main_param = self.optimizer.param_groups[group_index]["params"][group_order]
            step = self.optimizer.state[main_param].get("step")
            if step is not None:
                tensors = {**tensors, "step": step.clone()}
        return set_states(self, model_param, tensors)

    DistributedOptimizer._set_main_param_and_optimizer_states = set_states_keeping_step

    DistributedOptimizer.load_state_dict = with_own_adam_steps(DistributedOptimizer.load_state_dict)


def with_own_adam_steps(load_state_dict: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``DistributedOptimizer.load_state_dict`` (``load_state_dict``), after which every Adam state of
    ``self.optimizer`` holds a ``step`` tensor of its own.

    distrib_optimizer.py:740-743 puts one ``step`` tensor into every parameter's state; torch's Adam then
    increments it in place once per parameter, so the bias correction after a resume runs ahead by the number of
    parameters. Each state gets its own copy, as Adam's own initialisation gives it."""
    import functools

    @functools.wraps(load_state_dict)
    def load_state_dict_own_steps(self: Any, state_dict: Any) -> Any:
        result = load_state_dict(self, state_dict)
        for state in self.optimizer.state.values():
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].clone()
        return result

    return load_state_dict_own_steps


def _install_distributed_optimizer_type_check() -> None:
    """``DistributedOptimizer._build_model_and_main_param_groups`` accepts only 'torch.cuda.*Tensor' parameters."""
    import functools

    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    build = DistributedOptimizer.__dict__["_build_model_and_main_param_groups"].__func__
    if getattr(build, "__r1_ascend_cpu__", False):
        return

    @functools.wraps(build)
    def build_on_cpu(cls: type, *args: Any, **kwargs: Any) -> Any:
        with _cuda_type_names():
            return build(cls, *args, **kwargs)

    build_on_cpu.__r1_ascend_cpu__ = True
    DistributedOptimizer._build_model_and_main_param_groups = classmethod(build_on_cpu)

    _call_within("megatron.core.optimizer.optimizer", "clip_grad_by_total_norm_fp32", _cuda_type_names)

    import megatron.core.optimizer.distrib_optimizer as distrib_optimizer

    quantize = distrib_optimizer.quantize_param_shard
    if not getattr(quantize, "__r1_ascend_cpu__", False):

        @functools.wraps(quantize)
        def quantize_fp8_only(model_params: list[Any], *args: Any, **kwargs: Any) -> Any:
            """Called after every step; TE's FP8 cast of FP8 parameters, which a BF16/FP32 model has none of."""
            if not model_params:
                return None
            return quantize(model_params, *args, **kwargs)

        quantize_fp8_only.__r1_ascend_cpu__ = True
        distrib_optimizer.quantize_param_shard = quantize_fp8_only


#: Called with the model chunks each time verl builds a model (``make_megatron_module``): one wrapper serves the
#: CPU placement and whoever watches the builds (the rehearsal records each model's class and layout).
MODEL_LISTENERS: list[Callable[[list[Any]], None]] = []


def placing_on_cpu(make: Callable[..., Any], megatron_utils: Any) -> Callable[..., Any]:
    """verl's ``make_megatron_module`` calls ``get_model`` without its ``transformer_config``, so ``get_model`` moves
    every chunk to ``f"{device}:{device_id}"`` ('cpu:cpu'); given the config, its own CPU-initialisation branch
    keeps the chunks where they were built. Each :data:`MODEL_LISTENERS` entry then sees the built chunks.
    ``megatron_utils`` is the module whose ``get_model`` ``make`` calls (verl.utils.megatron_utils)."""
    import functools

    get_model = megatron_utils.get_model

    @functools.wraps(make)
    def make_megatron_module(wrap_config: Any, tf_config: Any, *args: Any, **kwargs: Any) -> Any:
        megatron_utils.get_model = functools.partial(get_model, transformer_config=tf_config)
        try:
            chunks = make(wrap_config, tf_config, *args, **kwargs)
        finally:
            megatron_utils.get_model = get_model
        for listener in MODEL_LISTENERS:
            listener(chunks)
        return chunks

    make_megatron_module.__r1_ascend_cpu__ = True
    return make_megatron_module


def _install_cpu_model_placement() -> None:
    import verl.utils.megatron_utils as megatron_utils

    if not getattr(megatron_utils.make_megatron_module, "__r1_ascend_cpu__", False):
        megatron_utils.make_megatron_module = placing_on_cpu(megatron_utils.make_megatron_module, megatron_utils)


_INSTALLED = False


def install() -> None:
    """Install every replacement of :data:`REPLACEMENTS` in this process (idempotent); refuses on drift."""
    global _INSTALLED
    if _INSTALLED:
        return
    problems = check_targets()
    if problems:
        raise McoreCPUDriftError(
            f"megatron-core {MEGATRON_CORE_VERSION} / verl {VERL_VERSION} CPU replacements no longer match upstream: "
            + "; ".join(problems)
        )
    import importlib

    standins = te_standins()
    for module_name, names in TE_SPEC_MODULES.items():
        module = importlib.import_module(module_name)
        for name in names:
            setattr(module, name, standins[name])
    cpu_torch = _TorchOnCPU()
    for module_name in CUDA_CALL_MODULES:
        importlib.import_module(module_name).torch = cpu_torch
    moe_utils = importlib.import_module("megatron.core.transformer.moe.moe_utils")
    moe_utils.maybe_move_tensor_to_cpu = _maybe_move_tensor_to_cpu
    token_dispatcher = importlib.import_module("megatron.core.transformer.moe.token_dispatcher")
    if hasattr(token_dispatcher, "maybe_move_tensor_to_cpu"):
        token_dispatcher.maybe_move_tensor_to_cpu = _maybe_move_tensor_to_cpu
    _install_rng_tracker()
    _install_transformer_engine_module()
    _install_cpu_model_placement()
    _install_distributed_optimizer_type_check()
    _install_checkpoint_exchange()
    _install_pipeline_schedule()
    _install_write_item_signature()
    _install_optimizer_state_step()
    _INSTALLED = True
