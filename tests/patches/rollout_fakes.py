"""CPU stand-ins for the vLLM engine objects the offloading rollout touches, mirroring vLLM/vllm-ascend 0.9.1 paths.

A real engine cannot be built without an NPU, so the rollout is wired to these objects, reached through the same
attribute paths as on hardware:

- ``LLM.llm_engine.engine_core.engine_core``: the engine core (``InprocClient.engine_core`` -> ``EngineCore``); its
  KV caches are initialised by running the *real* ``EngineCore._initialize_kv_caches`` on it;
- ``LLM.llm_engine.model_executor.driver_worker.worker.model_runner``: the runner (``NPUModelRunner``): ``get_model()``,
  ``kv_caches``, ``vllm_config.compilation_config.static_forward_context``, ``vllm_config.model_config.dtype``;
- ``static_forward_context["model.layers.<i>.self_attn.attn"]``: attention layers with ``kv_cache`` and ``impl``;
  ``impl`` is a real vllm-ascend ``AscendMLAImpl`` (created without ``__init__``) whose
  ``process_weights_after_loading`` is the upstream code, wrapped only to record calls.

``FakeModelRunner.initialize_kv_cache`` allocates MLA caches as ``NPUModelRunner.initialize_kv_cache`` does (one
``(nope, rope)`` pair per layer sized from the config's ``KVCacheTensor``) and binds them with vLLM's real
``bind_kv_cache``.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.model_executor.layers.linear import UnquantizedLinearMethod
from vllm.v1.engine.core import EngineCore
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.utils import bind_kv_cache
from vllm_ascend.attention.mla_v1 import AscendMLAImpl

NUM_LAYERS = 2
NUM_HEADS = 2
KV_LORA_RANK = 8
QK_NOPE_HEAD_DIM = 4
QK_ROPE_HEAD_DIM = 2
V_HEAD_DIM = 4
HIDDEN = 16
BLOCK_SIZE = 16
DTYPE = torch.float32


class RecordingMLAImpl(AscendMLAImpl):
    """vllm-ascend's MLA impl with upstream ``process_weights_after_loading``, recording each call."""

    calls: list[torch.dtype]

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        self.calls.append(act_dtype)
        super().process_weights_after_loading(act_dtype)


def make_mla_impl(kv_b_proj: torch.nn.Module) -> RecordingMLAImpl:
    impl = object.__new__(RecordingMLAImpl)
    impl.calls = []
    impl.kv_b_proj = kv_b_proj
    impl.num_heads = NUM_HEADS
    impl.kv_lora_rank = KV_LORA_RANK
    impl.qk_nope_head_dim = QK_NOPE_HEAD_DIM
    impl.v_head_dim = V_HEAD_DIM
    return impl


class FakeLinear(torch.nn.Module):
    """A vLLM linear layer as MLA post-processing sees it: ``weight`` (out, in) and an unquantized ``quant_method``."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(out_features, in_features, dtype=DTYPE), requires_grad=False)
        self.quant_method = UnquantizedLinearMethod()


class FakeDecoderLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = torch.nn.Module()
        self.self_attn.kv_b_proj = FakeLinear(KV_LORA_RANK, NUM_HEADS * (QK_NOPE_HEAD_DIM + V_HEAD_DIM))
        self.self_attn.o_proj = FakeLinear(NUM_HEADS * V_HEAD_DIM, HIDDEN)
        self.mlp = FakeLinear(HIDDEN, HIDDEN)


class FakeForCausalLM(torch.nn.Module):
    """Shaped like vLLM's ``DeepseekV2ForCausalLM``: ``.model.layers``, ``load_weights`` returning loaded names."""

    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList(FakeDecoderLayer() for _ in range(NUM_LAYERS))
        self.model.embed_tokens = FakeLinear(HIDDEN, 32)
        self.load_calls = 0

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        self.load_calls += 1
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            params[name].data.copy_(tensor)
            loaded.add(name)
        return loaded


class FakeAttention:
    """``vllm.attention.Attention`` as the forward context holds it."""

    def __init__(self, impl: Any) -> None:
        self.impl = impl
        self.kv_cache = [torch.tensor([])]
        self.attn_type = "decoder"


def layer_name(index: int) -> str:
    return f"model.layers.{index}.self_attn.attn"


class FakeModelRunner:
    def __init__(self, model: FakeForCausalLM) -> None:
        self.model = model
        self.kv_caches: list[Any] = []
        self.received_configs: list[Any] = []
        context = {
            layer_name(i): FakeAttention(make_mla_impl(layer.self_attn.kv_b_proj))
            for i, layer in enumerate(model.model.layers)
        }
        self.vllm_config = types.SimpleNamespace(
            compilation_config=types.SimpleNamespace(static_forward_context=context),
            model_config=types.SimpleNamespace(dtype=DTYPE),
        )
        for attention in context.values():  # the loader derives the MLA matrices once at start-up
            attention.impl.process_weights_after_loading(DTYPE)
            attention.impl.calls.clear()

    def get_model(self) -> FakeForCausalLM:
        return self.model

    @property
    def forward_context(self) -> dict[str, FakeAttention]:
        return self.vllm_config.compilation_config.static_forward_context

    def get_kv_cache_spec(self) -> dict[str, FullAttentionSpec]:
        head_size = QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM
        return {
            name: FullAttentionSpec(
                block_size=BLOCK_SIZE, num_kv_heads=1, head_size=head_size, dtype=DTYPE, use_mla=True
            )
            for name in self.forward_context
        }

    def initialize_kv_cache(self, kv_cache_config: Any) -> None:
        self.received_configs.append(kv_cache_config)
        sizes = {tensor.shared_by[0]: tensor.size for tensor in kv_cache_config.kv_cache_tensors}
        caches = {}
        for group in kv_cache_config.kv_cache_groups:
            for name in group.layer_names:
                num_blocks = sizes[name] // group.kv_cache_spec.page_size_bytes
                assert num_blocks >= kv_cache_config.num_blocks
                nope = torch.zeros(num_blocks, BLOCK_SIZE, 1, QK_NOPE_HEAD_DIM, dtype=DTYPE)
                rope = torch.zeros(num_blocks, BLOCK_SIZE, 1, QK_ROPE_HEAD_DIM, dtype=DTYPE)
                caches[name] = (nope, rope)
        bind_kv_cache(caches, self.forward_context, self.kv_caches)


@dataclass
class FakeExecutor:
    """``Executor`` with ``external_launcher``: one in-process worker (``collective_rpc`` returns one-element lists)."""

    model_runner: FakeModelRunner
    available_memory: int
    warmups: int = 0
    calls: list[tuple[str, Any]] = field(default_factory=list)

    @property
    def driver_worker(self) -> Any:
        return types.SimpleNamespace(worker=types.SimpleNamespace(model_runner=self.model_runner))

    def get_kv_cache_specs(self) -> list[dict[str, Any]]:
        self.calls.append(("get_kv_cache_specs", None))
        return [self.model_runner.get_kv_cache_spec()]

    def determine_available_memory(self) -> list[int]:
        self.calls.append(("determine_available_memory", None))
        return [self.available_memory]

    def initialize_from_config(self, kv_cache_configs: list[Any]) -> None:
        self.calls.append(("initialize_from_config", kv_cache_configs))
        self.model_runner.initialize_kv_cache(kv_cache_configs[0])  # WorkerWrapperBase picks configs[rpc_rank=0]
        self.warmups += 1  # compile_or_warm_up_model


def vllm_config(max_model_len: int = 64) -> Any:
    """The parts of ``VllmConfig`` that ``EngineCore._initialize_kv_caches`` reads."""
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(max_model_len=max_model_len),
        cache_config=types.SimpleNamespace(
            block_size=BLOCK_SIZE, num_gpu_blocks_override=None, num_gpu_blocks=None, num_cpu_blocks=None
        ),
        scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=False),
    )


class FakeLLM:
    """``vllm.LLM`` with an in-process V1 engine core, as verl's external launcher builds it."""

    def __init__(self, available_memory: int = 64 * 1024) -> None:
        self.model = FakeForCausalLM()
        self.runner = FakeModelRunner(self.model)
        self.executor = FakeExecutor(self.runner, available_memory)
        config = vllm_config()
        self.engine_core = types.SimpleNamespace(model_executor=self.executor, vllm_config=config)
        # What EngineCore.__init__ does: initialise the caches, then size the scheduler from the result.
        num_gpu_blocks, _, _ = EngineCore._initialize_kv_caches(self.engine_core, config)
        config.cache_config.num_gpu_blocks = num_gpu_blocks
        self.llm_engine = types.SimpleNamespace(
            engine_core=types.SimpleNamespace(engine_core=self.engine_core), model_executor=self.executor
        )
        self.prefix_cache_resets = 0

    def reset_prefix_cache(self) -> bool:
        self.prefix_cache_resets += 1
        return True


def fresh_weights(model: torch.nn.Module, *, skip: Iterable[str] = ()) -> dict[str, torch.Tensor]:
    """New values for every parameter (what the actor->rollout sync would send), minus ``skip``."""
    skipped = set(skip)
    return {name: torch.randn_like(p) for name, p in model.named_parameters() if name not in skipped}


def stream(weights: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    yield from weights.items()


def parameter_storage_bytes(model: torch.nn.Module) -> int:
    return sum(p.untyped_storage().nbytes() for p in model.parameters())


def kv_cache_bytes(runner: FakeModelRunner) -> int:
    """Bytes held by the caches bound into the forward context (what attention actually uses)."""
    total = 0
    for attention in runner.forward_context.values():
        for entry in attention.kv_cache:
            tensors = entry if isinstance(entry, tuple) else (entry,)
            total += sum(t.untyped_storage().nbytes() for t in tensors)
    return total


def mla_matrix_bytes(runner: FakeModelRunner) -> int:
    total = 0
    for attention in runner.forward_context.values():
        for attr in ("W_UV", "W_UK_T"):
            value = getattr(attention.impl, attr)
            total += 0 if value is None else value.untyped_storage().nbytes()
    return total
