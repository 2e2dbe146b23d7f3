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

The runner, executor and engine start-up are the rehearsal's (``r1_ascend.cpu.engine``, which allocates
MLA caches as ``NPUModelRunner.initialize_kv_cache`` does and binds them with vLLM's real ``bind_kv_cache``); the
classes here add what the tests record and check.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.model_executor.layers.linear import UnquantizedLinearMethod
from vllm_ascend.attention.mla_v1 import AscendMLAImpl

from r1_ascend.cpu import engine as cpu_engine

HIDDEN = 16
NUM_LAYERS = 2
#: MLA dimensions of the fake attention (AscendMLAImpl.process_weights_after_loading splits kv_b_proj by them).
NUM_HEADS = 2
KV_LORA_RANK = 8
QK_NOPE_HEAD_DIM = 4
QK_ROPE_HEAD_DIM = 2
V_HEAD_DIM = 4
MLA_DIMS = cpu_engine.MLADims(NUM_HEADS, KV_LORA_RANK, QK_NOPE_HEAD_DIM, QK_ROPE_HEAD_DIM, V_HEAD_DIM)
BLOCK_SIZE = cpu_engine.BLOCK_SIZE
DTYPE = torch.float32
FakeAttention = cpu_engine.Attention
layer_name = cpu_engine.layer_name
MAX_MODEL_LEN = 64


def vllm_config(max_model_len: int = MAX_MODEL_LEN) -> Any:
    """The parts of ``VllmConfig`` that ``EngineCore._initialize_kv_caches`` reads."""
    return cpu_engine.engine_config(max_model_len)


class RecordingMLAImpl(AscendMLAImpl):
    """vllm-ascend's MLA impl with upstream ``process_weights_after_loading``, recording each call."""

    calls: list[torch.dtype]

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        vars(self).setdefault("calls", []).append(act_dtype)  # created without __init__ (cpu_engine.mla_impl)
        super().process_weights_after_loading(act_dtype)


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


class FakeModelRunner(cpu_engine.ModelRunner):
    """The rehearsal's runner with recording MLA impls, that keeps every KV-cache config it receives."""

    impl_class = RecordingMLAImpl

    def __init__(self, model: FakeForCausalLM) -> None:
        super().__init__(model, DTYPE, MLA_DIMS)
        self.received_configs: list[Any] = []
        for attention in self.forward_context.values():  # forget the start-up derivation
            attention.impl.calls.clear()

    def initialize_kv_cache(self, kv_cache_config: Any) -> None:
        self.received_configs.append(kv_cache_config)
        sizes = {tensor.shared_by[0]: tensor.size for tensor in kv_cache_config.kv_cache_tensors}
        for group in kv_cache_config.kv_cache_groups:
            for name in group.layer_names:
                assert sizes[name] // group.kv_cache_spec.page_size_bytes >= kv_cache_config.num_blocks
        super().initialize_kv_cache(kv_cache_config)


@dataclass
class FakeExecutor(cpu_engine.Executor):
    """The rehearsal's executor, recording each call as ``(name, argument)`` and counting warm-ups."""

    model_runner: FakeModelRunner
    available_memory: int
    warmups: int = 0
    calls: list[tuple[str, Any]] = field(default_factory=list)

    def get_kv_cache_specs(self) -> list[dict[str, Any]]:
        self.calls.append(("get_kv_cache_specs", None))
        return super().get_kv_cache_specs()

    def determine_available_memory(self) -> list[int]:
        self.calls.append(("determine_available_memory", None))
        return super().determine_available_memory()

    def initialize_from_config(self, kv_cache_configs: list[Any]) -> None:
        self.calls.append(("initialize_from_config", kv_cache_configs))
        super().initialize_from_config(kv_cache_configs)
        self.warmups += 1  # compile_or_warm_up_model


class FakeLLM:
    """``vllm.LLM`` with an in-process V1 engine core, as verl's external launcher builds it."""

    def __init__(self, available_memory: int = 64 * 1024) -> None:
        self.model = FakeForCausalLM()
        self.runner = FakeModelRunner(self.model)
        self.executor = FakeExecutor(self.runner, available_memory)
        self.engine_core, self.llm_engine = cpu_engine.start_engine(self.executor, MAX_MODEL_LEN)
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
