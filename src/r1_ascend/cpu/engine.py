"""The stand-in for ``vllm.LLM`` in the rehearsal: the pinned vLLM wheel has no CPU backend.

verl's stock ``vLLMRollout.__init__`` (run for real, through the overlay's DP/EP wrapper and the offloading rollout
subclass) calls ``LLM(**engine_args)``; :class:`CPUStandInLLM` answers it. The model is transformers'
``DeepseekV3ForCausalLM`` (the pinned release) built from the model directory's ``config.json`` in the dtype verl
asks for, so the rollout runs DeepSeek-V3's own architecture (MLA, grouped ``noaux_tc`` routing, shared experts)
from code that shares nothing with the Megatron actor: a weight export that puts a tensor in the wrong place shows
up as a log-prob gap, as it would on the NPU.

The engine is built like vLLM 0.9.1's V1 engine under verl's ``external_launcher``, so that the overlay's offloading
rollout reaches the same attribute paths as on the NPU:

- ``llm_engine.engine_core.engine_core`` is the engine core; its KV caches are initialised by running vLLM's *real*
  ``EngineCore._initialize_kv_caches`` on it, so the overlay's ``vllm_engine_kv_cache_configs`` patch saves the
  configs that ``resume(["kv_cache"])`` rebuilds from;
- ``llm_engine.model_executor.driver_worker.worker.model_runner`` holds the model, the MLA KV caches laid out as
  vllm-ascend's ``NPUModelRunner`` lays them out (bound with vLLM's real ``bind_kv_cache``) and the forward context,
  whose attention layers carry real vllm-ascend ``AscendMLAImpl`` objects over each layer's ``self_attn.kv_b_proj``
  (their ``process_weights_after_loading`` is upstream code), with the MLA dimensions of the model's config.

- every decode step is sampled by vLLM's own ``InputBatch`` -> ``Sampler`` -> ``LogprobsProcessor``
  (:class:`VLLMSampler`), so the overlay's ``Sampler.forward`` patch runs here as in the NPU worker.

This is a component stand-in, not a device-call one: vLLM's scheduler, model runner and forward do not run.
``generate`` decodes with transformers' model and its own KV cache (``past_key_values``), not with the vLLM-layout
caches above, which exist for the memory lifecycle the overlay drives (freed by ``release``, rebuilt by
``resume(["kv_cache"])``). vLLM's DeepSeek-V3 class (:mod:`r1_ascend.cpu.vllm_deepseek`) is built only for its
``load_weights``: every sync goes through it, and what it then holds is copied into the decoding model.

The engine-shaped pieces (``ModelRunner``, ``Executor``, ``start_engine``) are also what the overlay's unit tests
build their recording fakes on, so the rehearsal and the tests stand in for vLLM in one way. That is why this one
module is over the project's 400 lines: the engine's shape, its weight load and its sampling are reached through
one object by the overlay's patches, and the tests' fakes are built from the same pieces.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import math
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import DeepseekV3ForCausalLM
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

from r1_ascend import envs
from r1_ascend.patches import patched_by

BLOCK_SIZE = 16
#: Sequences of ``max_model_len`` tokens the stand-in executor reports KV-cache memory for (vLLM needs at least one).
KV_CACHE_SEQUENCES = 2
#: ``vllm.LLM(dtype=...)`` strings and what vLLM maps them to.
DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}
#: Called with each engine once it is built, before its first weight sync: the rehearsal plants its rollout faults
#: through this (r1_ascend.rehearse.worker_hooks), so the engine knows nothing of them.
ENGINE_HOOKS: list[Callable[[CPUStandInLLM], None]] = []


# --- vLLM engine shape (shared with the overlay's test fakes) -------------------------------------------------------


@dataclass(frozen=True)
class MLADims:
    """The MLA dimensions ``AscendMLAImpl`` splits ``kv_b_proj`` by and the MLA KV cache is laid out with."""

    num_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @classmethod
    def from_hf_config(cls, config: Any) -> MLADims:
        return cls(
            num_heads=int(config.num_attention_heads),
            kv_lora_rank=int(config.kv_lora_rank),
            qk_nope_head_dim=int(config.qk_nope_head_dim),
            qk_rope_head_dim=int(config.qk_rope_head_dim),
            v_head_dim=int(config.v_head_dim),
        )

    @property
    def cache_head_size(self) -> int:
        """One MLA cache entry: the compressed KV (``kv_lora_rank``) and the shared rope key (vLLM's MLA spec)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


def mla_impl(kv_b_proj: torch.nn.Module, dims: MLADims, impl_class: type | None = None) -> Any:
    """vllm-ascend's MLA implementation object (``impl_class``, default ``AscendMLAImpl``, created without its
    ``__init__``) with the fields its weight post-processing reads."""
    if impl_class is None:
        from vllm_ascend.attention.mla_v1 import AscendMLAImpl as impl_class

    impl = object.__new__(impl_class)
    impl.kv_b_proj = kv_b_proj
    impl.num_heads = dims.num_heads
    impl.kv_lora_rank = dims.kv_lora_rank
    impl.qk_nope_head_dim = dims.qk_nope_head_dim
    impl.v_head_dim = dims.v_head_dim
    return impl


class Attention:
    """``vllm.attention.Attention`` as the static forward context holds it."""

    def __init__(self, impl: Any) -> None:
        self.impl = impl
        self.kv_cache = [torch.tensor([])]
        self.attn_type = "decoder"


def _absorbed_kv_b_proj(impl: Any, _module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], _output: Any) -> Any:
    """``kv_b_proj(c_kv)`` recomputed from the MLA matrices vllm-ascend derived (``W_UK_T`` [heads, nope, lora],
    ``W_UV`` [heads, lora, v]): vLLM's MLA decode multiplies by those copies, never by ``kv_b_proj.weight``, so the
    engine's keys and values come from them too and copies left stale by a weight sync change its samples as they
    would on the NPU. Same values as the projection while the copies are current (the same matrix, rebuilt)."""
    if impl.W_UK_T is None or impl.W_UV is None:
        msg = "the MLA matrices were released and not recomputed (process_weights_after_loading) before decoding"
        raise RuntimeError(msg)
    latent = inputs[0]
    weight = torch.cat([impl.W_UK_T, impl.W_UV.transpose(1, 2)], dim=1).flatten(0, 1)  # [heads * (nope + v), lora]
    return torch.nn.functional.linear(latent, weight.to(latent.dtype))


def layer_name(index: int) -> str:
    return f"model.layers.{index}.self_attn.attn"


def _unquantized(linear: torch.nn.Module) -> torch.nn.Module:
    """Mark a plain linear as vLLM's unquantized linear, the only case ``AscendMLAImpl`` reads ``.weight`` directly."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    linear.quant_method = UnquantizedLinearMethod()
    return linear


class ModelRunner:
    """vllm-ascend ``NPUModelRunner`` as the offloading rollout uses it, for any model whose decoder layers carry
    ``self_attn.kv_b_proj`` (``impl_class``: the MLA implementation class, see ``mla_impl``)."""

    impl_class: type | None = None

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype, dims: MLADims) -> None:
        self.model = model
        self.dims = dims
        self.kv_caches: list[Any] = []
        context = {
            layer_name(i): Attention(mla_impl(_unquantized(layer.self_attn.kv_b_proj), dims, self.impl_class))
            for i, layer in enumerate(model.model.layers)
        }
        self.vllm_config = types.SimpleNamespace(
            compilation_config=types.SimpleNamespace(static_forward_context=context),
            model_config=types.SimpleNamespace(dtype=dtype),
        )
        for attention in context.values():  # vLLM's loader derives the MLA matrices once at start-up
            attention.impl.process_weights_after_loading(dtype)
        for layer, attention in zip(model.model.layers, context.values(), strict=True):
            layer.self_attn.kv_b_proj.register_forward_hook(functools.partial(_absorbed_kv_b_proj, attention.impl))

    def get_model(self) -> torch.nn.Module:
        return self.model

    @property
    def forward_context(self) -> dict[str, Attention]:
        return self.vllm_config.compilation_config.static_forward_context

    def get_kv_cache_spec(self) -> dict[str, Any]:
        """One MLA spec per attention layer, as vLLM builds it for DeepSeek (one KV head of ``cache_head_size``)."""
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        dtype = self.vllm_config.model_config.dtype
        return {
            name: FullAttentionSpec(
                block_size=BLOCK_SIZE, num_kv_heads=1, head_size=self.dims.cache_head_size, dtype=dtype, use_mla=True
            )
            for name in self.forward_context
        }

    def initialize_kv_cache(self, kv_cache_config: Any) -> None:
        """MLA caches as ``NPUModelRunner.initialize_kv_cache`` lays them out: one (nope, rope) pair per layer."""
        from vllm.v1.utils import bind_kv_cache

        dtype = self.vllm_config.model_config.dtype
        sizes = {tensor.shared_by[0]: tensor.size for tensor in kv_cache_config.kv_cache_tensors}
        caches = {}
        for group in kv_cache_config.kv_cache_groups:
            for name in group.layer_names:
                blocks = sizes[name] // group.kv_cache_spec.page_size_bytes
                nope = torch.zeros(blocks, BLOCK_SIZE, 1, self.dims.kv_lora_rank, dtype=dtype)
                rope = torch.zeros(blocks, BLOCK_SIZE, 1, self.dims.qk_rope_head_dim, dtype=dtype)
                caches[name] = (nope, rope)
        bind_kv_cache(caches, self.forward_context, self.kv_caches)


@dataclass
class Executor:
    """vLLM's executor with ``external_launcher``: one in-process worker."""

    model_runner: ModelRunner
    available_memory: int

    @property
    def driver_worker(self) -> Any:
        return types.SimpleNamespace(worker=types.SimpleNamespace(model_runner=self.model_runner))

    def get_kv_cache_specs(self) -> list[dict[str, Any]]:
        return [self.model_runner.get_kv_cache_spec()]

    def determine_available_memory(self) -> list[int]:
        return [self.available_memory]

    def initialize_from_config(self, kv_cache_configs: list[Any]) -> None:
        self.model_runner.initialize_kv_cache(kv_cache_configs[0])  # WorkerWrapperBase picks configs[rpc_rank=0]


def kv_cache_bytes(runner: ModelRunner, tokens: int) -> int:
    """Bytes of KV cache that hold ``tokens`` tokens in every attention layer of ``runner``."""
    blocks = math.ceil(tokens / BLOCK_SIZE)
    return sum(blocks * spec.page_size_bytes for spec in runner.get_kv_cache_spec().values())


def engine_config(max_model_len: int) -> Any:
    """The parts of ``VllmConfig`` that ``EngineCore._initialize_kv_caches`` reads."""
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(max_model_len=max_model_len),
        cache_config=types.SimpleNamespace(
            block_size=BLOCK_SIZE, num_gpu_blocks_override=None, num_gpu_blocks=None, num_cpu_blocks=None
        ),
        scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=False),
    )


def start_engine(executor: Executor, max_model_len: int) -> tuple[Any, Any]:
    """What ``EngineCore.__init__`` does with the executor: initialise the KV caches through vLLM's real
    ``_initialize_kv_caches``, then size the scheduler from the result. Returns the engine core and the
    ``llm_engine`` object that ``LLM.llm_engine`` is (``engine_core.engine_core`` reaches the core)."""
    from vllm.v1.engine.core import EngineCore

    config = engine_config(max_model_len)
    engine_core = types.SimpleNamespace(model_executor=executor, vllm_config=config)
    num_gpu_blocks, _, _ = EngineCore._initialize_kv_caches(engine_core, config)
    config.cache_config.num_gpu_blocks = num_gpu_blocks
    llm_engine = types.SimpleNamespace(
        engine_core=types.SimpleNamespace(engine_core=engine_core), model_executor=executor
    )
    return engine_core, llm_engine


# --- the model: transformers' DeepSeek-V3 with vLLM's weight-loading contract ----------------------------------------


class WeightSyncError(ValueError):
    """A weight load named a tensor the rollout model does not have, with the wrong shape, or left one out."""


@dataclass
class VLLMLoader:
    """vLLM's DeepSeek-V3 model a sync goes through first, and how many syncs did (empty: copied directly)."""

    model: torch.nn.Module | None = None
    loads: int = 0
    #: what vLLM's ``load_weights`` runs under for one sync, given the model (a planted layout fault); None: as is
    change: Callable[[torch.nn.Module], contextlib.AbstractContextManager[None]] | None = None
    #: the parameters the last sync's ``load_weights`` did not report written (as vLLM itself, the sync goes on
    #: with what they held; the weight-sync check ``verl_weight_sync_check`` names them)
    unwritten: list[str] = field(default_factory=list)

    def load(self, weights: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """vLLM's ``load_weights``, then each given name's tensor as that model now holds it (read back whole: a
        collective over its TP and EP groups).

        A tensor vLLM's loader refuses (its weight loaders narrow and copy by shape) raises
        :class:`WeightSyncError` naming it and the rank, on every rank: the ranks exchange what they refused first, so
        the ones that loaded do not wait in the read-back for the one that stopped."""
        from vllm.distributed.parallel_state import get_world_group

        from r1_ascend.cpu.vllm_deepseek import hf_tensors

        assert self.model is not None
        refusal = self._load_or_refusal(weights)
        group = get_world_group()
        refusals: list[str | None] = [None] * group.world_size
        torch.distributed.all_gather_object(refusals, refusal, group=group.cpu_group)
        refused = [(rank, text) for rank, text in enumerate(refusals) if text is not None]
        if refused:
            rank, text = refused[0]
            raise WeightSyncError(f"{text} (rollout rank {rank}; {len(refused)} of {len(refusals)} ranks refused)")
        held = hf_tensors(self.model)
        self.loads += 1
        absent = [name for name, _ in weights if name not in held]
        if absent:
            msg = f"vLLM's DeepSeek-V3 holds no weight under {absent[:8]} after its load_weights"
            raise WeightSyncError(msg)
        return [(name, held[name]) for name, _ in weights]

    def _load_or_refusal(self, weights: list[tuple[str, torch.Tensor]]) -> str | None:
        """vLLM's ``load_weights`` on ``weights`` after verl's MoE loader patch; what it refused, or None."""
        from verl.utils.vllm.patch import patch_vllm_moe_model_weight_loader

        assert self.model is not None
        current: list[tuple[str, tuple[int, ...]]] = []

        def named() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                current[:] = [(name, tuple(tensor.shape))]
                yield name, tensor

        # the overlay's update_weights gives verl's MoE loader patch the model its runner holds: on the cluster vLLM's,
        # here the decoding model (which it leaves alone), so the loader gives it vLLM's model, the one that loads
        patch_vllm_moe_model_weight_loader(self.model)
        try:
            with self.change(self.model) if self.change is not None else contextlib.nullcontext():
                loaded = self.model.load_weights(named())
        except (RuntimeError, ValueError, AssertionError, IndexError, KeyError, AttributeError) as error:
            where = f"{current[0][0]!r} of shape {current[0][1]}" if current else "the first weight"
            return (
                f"vLLM's DeepSeek-V3 load_weights ({type(self.model).__qualname__}) refused {where}: "
                f"{type(error).__name__}: {error}. The tensor reached vLLM's weight loader in a layout it does not "
                "take, or a parameter lost its weight_loader (verl's patch_vllm_moe_model_weight_loader puts the "
                "experts' back)"
            )
        self.unwritten = [name for name, _ in self.model.named_parameters() if name not in loaded]
        return None


class RolloutDeepseekV3(DeepseekV3ForCausalLM):
    """transformers' ``DeepseekV3ForCausalLM`` that loads weights the way vLLM's model does (``load_weights``).

    Parameter names are the Hugging Face DeepSeek-V3 checkpoint names, which is what verl's Megatron->HF export
    emits. One change to the module tree: each router's ``e_score_correction_bias`` is a float32 parameter rather
    than a buffer in the model dtype. DeepSeek-V3 checkpoints store it in float32 and the router adds it to float32
    sigmoid scores, so rounding it to bf16 would change which experts are chosen; as a parameter it is also released,
    re-allocated and checked for completeness like every other synced weight (vLLM holds it as a parameter too).
    """

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        for module in self.modules():
            if isinstance(module, DeepseekV3TopkRouter):
                bias = module._buffers.pop("e_score_correction_bias")
                module.e_score_correction_bias = torch.nn.Parameter(bias.float(), requires_grad=False)
        self.requires_grad_(False)
        #: The names written by each ``load_weights`` call (verl syncs all weights in one call).
        self.load_history: list[frozenset[str]] = []
        #: vLLM's own DeepSeek-V3 model (:mod:`r1_ascend.cpu.vllm_deepseek`), when the engine built one: every sync
        #: goes through its ``load_weights`` and this model decodes with what it then holds, read back whole. Held
        #: outside this module tree, so the offloading rollout's release / resume see only the decoding model.
        self.vllm_loader = VLLMLoader()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy each ``(HF name, tensor)`` into the parameter of that name; return the names written.

        An unknown name or a shape mismatch raises :class:`WeightSyncError` before anything is copied. When
        :attr:`vllm_loader` holds vLLM's model, the tensors first go through its ``load_weights`` (a collective
        over its TP and EP groups, as every rollout rank syncs at once), and what is copied is what that model then
        holds under each name: a tensor vLLM's loader misplaces is decoded misplaced.
        """
        params = dict(self.named_parameters())
        weights = list(weights)
        for name, tensor in weights:
            param = params.get(name)
            if param is None:
                close = difflib.get_close_matches(name, params, n=3)
                hint = f"; closest: {close}" if close else ""
                msg = f"the rollout's DeepSeek-V3 has no parameter {name!r}{hint} ({len(params)} parameters)"
                raise WeightSyncError(msg)
            if tuple(tensor.shape) != tuple(param.shape):
                msg = f"weight {name!r} has shape {tuple(tensor.shape)}, the rollout's parameter {tuple(param.shape)}"
                raise WeightSyncError(msg)
        if self.vllm_loader.model is not None:
            weights = self.vllm_loader.load(weights)
        loaded: set[str] = set()
        for name, tensor in weights:
            params[name].data.copy_(tensor.detach())
            loaded.add(name)
        self.load_history.append(frozenset(loaded))
        return loaded

    def missing_weights(self, loaded: Iterable[str]) -> list[str]:
        """The parameters not in ``loaded``, in model order (empty after a complete sync)."""
        written = set(loaded)
        return [name for name, _ in self.named_parameters() if name not in written]

    def check_complete(self, loaded: Iterable[str]) -> None:
        """Raise :class:`WeightSyncError` naming the parameters a sync that wrote ``loaded`` left out."""
        missing = self.missing_weights(loaded)
        if missing:
            shown = ", ".join(missing[:8]) + (", ..." if len(missing) > 8 else "")
            msg = f"the weight sync left {len(missing)} rollout parameters unwritten: {shown}"
            raise WeightSyncError(msg)


def torch_dtype(dtype: Any, config: Any = None) -> torch.dtype:
    """``vllm.LLM(dtype=...)`` as a torch dtype; ``"auto"`` takes the config's ``torch_dtype`` as vLLM does."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype)
    if name == "auto":
        name = str(getattr(config, "torch_dtype", None) or "bfloat16").removeprefix("torch.")
    if name not in DTYPES:
        msg = f"unsupported rollout dtype {dtype!r}; expected one of {sorted(DTYPES)} or 'auto'"
        raise ValueError(msg)
    return DTYPES[name]


def build_model(config: Any, dtype: torch.dtype, seed: int = 0) -> RolloutDeepseekV3:
    """The rollout model in ``dtype`` with transformers' initialisation drawn from ``seed`` (vLLM's dummy load)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = RolloutDeepseekV3._from_config(config, torch_dtype=dtype)
    return model.eval()


def build_vllm_model(model_dir: Path, dtype: torch.dtype, engine_kwargs: Mapping[str, Any]) -> torch.nn.Module:
    """vLLM's DeepSeek-V3 class for this rollout rank, over vLLM's groups built on the workers' torch.distributed
    world (TP as verl asks, EP over the TP x DP ranks when ``enable_expert_parallel``), as vLLM's worker builds
    them under verl's ``external_launcher``."""
    from r1_ascend.cpu import vllm_deepseek

    config = vllm_deepseek.vllm_config(
        model_dir,
        dtype,
        tensor_parallel_size=int(engine_kwargs.get("tensor_parallel_size", 1)),
        expert_parallel=bool(engine_kwargs.get("enable_expert_parallel", False)),
    )
    # with rollout DP > 1 the overlay's vllm_dp_ep_groups has built vLLM's groups; vllm-ascend's are still to add
    vllm_deepseek.init_groups(config, torch.distributed.get_world_size(), torch.distributed.get_rank(), "env://")
    return vllm_deepseek.build(config)


def with_hf_overrides(config: Any, overrides: Any) -> Any:
    """``config`` with vLLM 0.9.1's ``hf_overrides`` applied as its ``ModelConfig`` applies them: a mapping updates
    the config's fields (``PretrainedConfig.update``), a callable returns the config to use."""
    if overrides is None:
        return config
    if callable(overrides):
        return overrides(config)
    if not isinstance(overrides, Mapping):
        msg = f"hf_overrides must be a mapping of config fields or a callable, got {overrides!r}"
        raise TypeError(msg)
    config.update(dict(overrides))
    return config


def _checkpoint_tensors(model_dir: Path) -> Iterable[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        msg = f"load_format asks for the checkpoint but {model_dir} has no *.safetensors; use load_format='dummy'"
        raise FileNotFoundError(msg)
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not iterable
                yield name, f.get_tensor(name)


# --- sampling -----------------------------------------------------------------------------------------------------


#: SamplingParams fields this engine does not implement, with the value that means "off". verl's rollout sets none
#: of them. vLLM's penalties would pin host memory (``is_pin_memory_available`` is true on the NPU platform),
#: which a CPU-only torch cannot; min-p is vllm-ascend's patched ``apply_min_p`` on the cluster.
_UNSUPPORTED_DEFAULTS: dict[str, Any] = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_p": 0.0,
    "seed": None,
    "min_tokens": 0,
    "prompt_logprobs": None,
    "logits_processors": None,
    "guided_decoding": None,
    "logit_bias": None,
    "allowed_token_ids": None,
    "bad_words": None,
}


@dataclass(frozen=True)
class Sampling:
    """What ``generate`` reads from vLLM's ``SamplingParams`` itself; temperature, top-k and top-p reach vLLM's own
    ``InputBatch`` and ``Sampler`` unchanged (:class:`VLLMSampler`)."""

    n: int
    max_tokens: int
    logprobs: int | None
    stop_token_ids: frozenset[int]
    ignore_eos: bool

    @classmethod
    def from_params(cls, params: Any) -> Sampling:
        """Read ``params``; refuse any field set to something this engine would silently ignore."""
        unsupported = {
            key: getattr(params, key)
            for key, off in _UNSUPPORTED_DEFAULTS.items()
            if getattr(params, key, off) not in (off, [], {})
        }
        if getattr(params, "stop", None):
            unsupported["stop"] = params.stop
        if unsupported:
            msg = f"the CPU rollout engine does not implement these sampling parameters: {unsupported}"
            raise NotImplementedError(msg)
        if params.max_tokens is None:
            msg = "SamplingParams.max_tokens must be set for the CPU rollout engine"
            raise ValueError(msg)
        return cls(
            n=int(params.n),
            max_tokens=int(params.max_tokens),
            logprobs=None if params.logprobs is None else int(params.logprobs),
            stop_token_ids=frozenset(int(t) for t in (params.stop_token_ids or ())),
            ignore_eos=bool(params.ignore_eos),
        )


@dataclass
class SamplerCalls:
    """How the engine's sampling went since it was last read: the calls of ``Sampler.forward`` and the patch that
    had replaced it at each call (None: upstream's own), so the rehearsal can show the overlay's sampler ran."""

    calls: int = 0
    patches: set[str | None] = field(default_factory=set)

    def take(self) -> dict[str, Any]:
        """The record so far, as JSON-ready fields, and start afresh."""
        taken = {"calls": self.calls, "patched_by": sorted(p or "upstream" for p in self.patches)}
        self.calls, self.patches = 0, set()
        return taken


class VLLMSampler:
    """One decode batch sampled as vllm-ascend's ``NPUModelRunner`` samples it, with vLLM's own pieces on CPU.

    - ``vllm.v1.worker.gpu_input_batch.InputBatch`` turns each request's ``SamplingParams`` into the batch's
      ``SamplingMetadata`` (greedy rows, temperature, top-k/top-p), as the runner's ``input_batch`` does;
    - ``vllm.v1.sample.sampler.Sampler`` (the class the runner builds, ``model_runner_v1.py:356`` of vllm-ascend
      0.9.1) samples and gathers the log-probs, with whatever patch the process applied to ``Sampler.forward`` (the
      overlay's ``verl_rollout_guard``); off CUDA and TPU its top-k/top-p path is ``forward_native``, the one
      vllm-ascend keeps unless ``VLLM_ASCEND_ENABLE_TOPK_OPTIMIZE`` swaps in ``torch_npu.npu_top_k_top_p``;
    - ``vllm.v1.engine.logprobs.LogprobsProcessor`` turns the log-prob tensors into each completion's
      ``Logprob`` dicts and cumulative log-prob, as the output processor does.

    One difference: every request samples from the engine's seeded generator (vLLM gives a generator only to
    requests with their own ``seed`` and draws the others from the device's global one), so a rehearsal is
    reproducible whatever else in the worker draws random numbers.
    """

    def __init__(
        self,
        sampler: Any,
        params: Any,
        prompts: list[list[int]],
        generator: torch.Generator,
        *,
        max_model_len: int,
        vocab_size: int,
        record: SamplerCalls,
    ) -> None:
        from vllm.v1.engine.logprobs import LogprobsProcessor
        from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

        self.sampler, self.record = sampler, record
        self.batch = InputBatch(
            max_num_reqs=len(prompts),
            max_model_len=max_model_len,
            max_num_batched_tokens=len(prompts),  # a decode step's tokens: one per request
            device=torch.device("cpu"),
            pin_memory=False,
            vocab_size=vocab_size,
            block_sizes=[BLOCK_SIZE],
        )
        self.requests = [
            CachedRequestState(
                req_id=str(index),
                prompt_token_ids=ids,
                mm_inputs=[],
                mm_positions=[],
                sampling_params=params,
                generator=generator,
                block_ids=([],),
                num_computed_tokens=len(ids),
                output_token_ids=[],
            )
            for index, ids in enumerate(prompts)
        ]
        for request in self.requests:
            self.batch.add_request(request)
        self.batch.refresh_sampling_metadata()
        self.logprobs = [
            None
            if params.logprobs is None
            else LogprobsProcessor(
                tokenizer=None,
                logprobs=[],
                prompt_logprobs=None,
                cumulative_logprob=0.0,
                num_logprobs=params.logprobs,
                num_prompt_logprobs=None,
            )
            for _ in prompts
        ]

    def step(self, logits: torch.Tensor, live: Sequence[bool]) -> list[int]:
        """Sample one token per row from ``logits`` [rows, vocab]; rows still ``live`` keep it and its log-probs."""
        from vllm.v1.engine import EngineCoreOutput

        forward = type(self.sampler).forward
        output = self.sampler(logits.float(), self.batch.sampling_metadata)
        self.record.calls += 1
        self.record.patches.add(patched_by(forward))
        tokens = output.sampled_token_ids[:, 0].tolist()
        lists = None if output.logprobs_tensors is None else output.logprobs_tensors.tolists()
        for row, token in enumerate(tokens):
            if not live[row]:
                continue
            self.requests[row].output_token_ids.append(token)  # the request's output, as the runner keeps it
            processor = self.logprobs[row]
            if processor is not None and lists is not None:
                processor.update_from_output(
                    EngineCoreOutput(request_id=str(row), new_token_ids=[token], new_logprobs=lists.slice(row, row + 1))
                )
        return tokens

    def completion_logprobs(self, row: int) -> tuple[list[dict[int, Any]] | None, float | None]:
        """Row ``row``'s per-token ``Logprob`` dicts and cumulative log-prob (None, None without ``logprobs``)."""
        processor = self.logprobs[row]
        if processor is None:
            return None, None
        return processor.logprobs, processor.cumulative_logprob


# --- the LLM ------------------------------------------------------------------------------------------------------


class CPUStandInLLM:
    """Answers ``vllm.LLM(model=..., dtype=..., max_model_len=..., seed=..., **engine_kwargs)`` as verl calls it.

    ``seed`` seeds both the dummy weights and the sampling generator, so rollout TP ranks built with the same seed
    and given the same prompts return the same samples, as vLLM's TP ranks do.
    """

    def __init__(
        self,
        model: str,
        dtype: Any = "auto",
        max_model_len: int | None = None,
        seed: int = 0,
        load_format: str = "dummy",
        max_num_seqs: int = 256,
        **engine_kwargs: Any,
    ) -> None:
        from transformers import AutoConfig, AutoTokenizer
        from vllm.v1.sample.sampler import Sampler

        self.engine_kwargs = dict(engine_kwargs)
        self.hf_config = with_hf_overrides(
            AutoConfig.from_pretrained(model, trust_remote_code=False), self.engine_kwargs.get("hf_overrides")
        )
        tokenizer = AutoTokenizer.from_pretrained(model)
        self.eos_token_id = tokenizer.eos_token_id
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_id
        self.dtype = torch_dtype(dtype, self.hf_config)
        self.max_model_len = int(max_model_len or self.hf_config.max_position_embeddings)
        self.max_num_seqs = int(max_num_seqs)
        self.model, dims = self._build_model(Path(model), str(load_format), int(seed))
        if torch.distributed.is_initialized() and envs.rollout_vllm_loader():
            self.model.vllm_loader.model = build_vllm_model(Path(model), self.dtype, self.engine_kwargs)
        self.runner = ModelRunner(self.model, self.dtype, dims)
        available = kv_cache_bytes(self.runner, KV_CACHE_SEQUENCES * self.max_model_len)
        self.executor = Executor(self.runner, available)
        self.engine_core, self.llm_engine = start_engine(self.executor, self.max_model_len)
        # vLLM's LLMEngine keeps the model config its model was built from (the overlay's model-config check reads it)
        self.llm_engine.model_config = types.SimpleNamespace(hf_config=self.hf_config)
        # verl 0.6.1 always passes seed 0; the rehearsal's --seed reaches the sampler through the environment
        self.generator = torch.Generator().manual_seed(int(seed) + envs.rehearse_seed())
        #: vLLM's sampler, built once as the NPU model runner builds it; it samples every decode step
        self.sampler = Sampler()
        self.sampler_calls = SamplerCalls()
        self.prefix_cache_resets = 0
        #: the prompts of the last ``generate`` (a planted per-expert fault picks its expert by their routing)
        self.last_prompts: list[list[int]] = []
        #: the fault a hook planted (the rehearsal's ``rollout_faults.Planter``); None on a healthy engine
        self.fault: Any = None
        for hook in ENGINE_HOOKS:
            hook(self)

    def _build_model(self, model_dir: Path, load_format: str, seed: int) -> tuple[torch.nn.Module, MLADims]:
        """The model (dummy weights from ``seed``, or the directory's checkpoint) and its MLA dimensions."""
        model = build_model(self.hf_config, self.dtype, seed)
        if not load_format.startswith("dummy"):
            model.check_complete(model.load_weights(_checkpoint_tensors(model_dir)))
        return model, MLADims.from_hf_config(self.hf_config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], *, recompute_mla: bool = True) -> set[str]:
        """What vLLM's loader does with new weights: ``model.load_weights``, then each MLA layer re-derives its
        matrices (``process_weights_after_loading``). The overlay's ``update_weights`` does the same two steps; the
        rehearsal's tests and the guard's calibration load through here. ``recompute_mla=False`` leaves the
        matrices of the previous weights (a planted fault)."""
        from r1_ascend.patches.impl.rollout_memory import mla_impls, recompute_mla_matrices

        loaded = self.model.load_weights(weights)
        if recompute_mla:
            recompute_mla_matrices(mla_impls(self.runner.forward_context), self.dtype)
        return loaded

    def reset_prefix_cache(self) -> bool:
        self.prefix_cache_resets += 1
        return True

    @torch.no_grad()
    def generate(self, prompts: Sequence[Mapping[str, Any]], sampling_params: Any, **_: Any) -> list[Any]:
        """``LLM.generate`` on ``{"prompt_token_ids": [...]}`` prompts: ``n`` samples each, batched up to
        ``max_num_seqs`` sequences, returned as vLLM ``RequestOutput`` objects in prompt order."""
        from vllm.outputs import RequestOutput

        sampling = Sampling.from_params(sampling_params)
        stop = set(sampling.stop_token_ids) | (set() if sampling.ignore_eos else {self.eos_token_id})
        prompt_ids = [[int(t) for t in prompt["prompt_token_ids"]] for prompt in prompts]
        self.last_prompts = prompt_ids
        rows = [ids for ids in prompt_ids for _sample in range(sampling.n)]
        completions = []
        for start in range(0, len(rows), self.max_num_seqs):
            batch = rows[start : start + self.max_num_seqs]
            completions += self._decode(batch, sampling_params, sampling, stop)
        for index, completion in enumerate(completions):
            completion.index = index % sampling.n
        return [
            RequestOutput(str(index), None, ids, None, completions[index * sampling.n : (index + 1) * sampling.n], True)
            for index, ids in enumerate(prompt_ids)
        ]

    def _completion(
        self, tokens: list[int], logprobs: tuple[list[dict[int, Any]] | None, float | None], stop: set[int]
    ) -> Any:
        """vLLM's ``CompletionOutput``: finished by a stop token ("stop", which is kept) or by the length limit."""
        from vllm.outputs import CompletionOutput

        stopped = bool(tokens) and tokens[-1] in stop
        return CompletionOutput(
            index=0,
            text="",
            token_ids=tokens,
            cumulative_logprob=logprobs[1],
            logprobs=logprobs[0],
            finish_reason="stop" if stopped else "length",
            stop_reason=tokens[-1] if stopped and tokens[-1] != self.eos_token_id else None,
        )

    def _decode(self, prompts: list[list[int]], params: Any, sampling: Sampling, stop: set[int]) -> list[Any]:
        """One completion per prompt, all prompts decoded together (see ``_prefill`` and ``_next_logits``) and
        sampled by vLLM's sampler (:class:`VLLMSampler`)."""
        lengths = [len(ids) for ids in prompts]
        if max(lengths) >= self.max_model_len:
            msg = f"a prompt of {max(lengths)} tokens leaves no room to generate in max_model_len={self.max_model_len}"
            raise ValueError(msg)
        limits = [min(sampling.max_tokens, self.max_model_len - n) for n in lengths]
        sampler = VLLMSampler(
            self.sampler,
            params,
            prompts,
            self.generator,
            max_model_len=self.max_model_len,
            vocab_size=int(self.hf_config.vocab_size),
            record=self.sampler_calls,
        )
        live = [limit > 0 for limit in limits]
        logits, state = self._prefill(prompts)
        while True:
            sampled = sampler.step(logits, live)
            for row, token in enumerate(sampled):
                if live[row]:
                    tokens = sampler.requests[row].output_token_ids
                    live[row] = token not in stop and len(tokens) < limits[row]
            if not any(live):
                break
            logits = self._next_logits(state, torch.tensor(sampled))
        return [
            self._completion(list(request.output_token_ids), sampler.completion_logprobs(row), stop)
            for row, request in enumerate(sampler.requests)
        ]

    def _prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, Any]:
        """The next-token logits [rows, vocab] after each prompt, and the decode state: the prompts left-padded into
        one batch (attention mask, position ids) with transformers' KV cache."""
        from transformers import DynamicCache

        width = max(len(ids) for ids in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            mask[row, width - len(ids) :] = 1
        state = _DecodeState(DynamicCache(), mask, (mask.cumsum(dim=-1) - 1).clamp(min=0))
        return self._forward(state, input_ids), state

    def _next_logits(self, state: Any, sampled: torch.Tensor) -> torch.Tensor:
        """Feed one sampled token per row through the cache; rows that already stopped decode on, unread."""
        state.mask = torch.cat([state.mask, state.mask.new_ones((len(sampled), 1))], dim=-1)
        state.positions = state.positions[:, -1:] + 1
        return self._forward(state, sampled.unsqueeze(-1))

    def _forward(self, state: _DecodeState, input_ids: torch.Tensor) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids,
            attention_mask=state.mask,
            position_ids=state.positions,
            past_key_values=state.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1]


@dataclass
class _DecodeState:
    cache: Any
    mask: torch.Tensor
    positions: torch.Tensor
