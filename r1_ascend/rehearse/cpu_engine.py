"""The stand-in for ``vllm.LLM`` in the rehearsal: the pinned vLLM wheel has no CPU backend.

verl's stock ``vLLMRollout.__init__`` (run for real, through the overlay's DP/EP wrapper and the offloading rollout
subclass) calls ``LLM(**engine_args)``; this object answers it. It is built like vLLM 0.9.1's V1 engine under
verl's ``external_launcher`` so that the overlay's offloading rollout reaches the same attribute paths as on the
NPU:

- ``llm_engine.engine_core.engine_core`` is the engine core; its KV caches are initialised by running vLLM's *real*
  ``EngineCore._initialize_kv_caches`` on it, so the overlay's ``vllm_engine_kv_cache_configs`` patch saves the
  configs that ``resume(["kv_cache"])`` rebuilds from;
- ``llm_engine.model_executor.driver_worker.worker.model_runner`` holds the model (a :class:`TinyPolicy`), the KV
  caches (bound with vLLM's real ``bind_kv_cache``) and the forward context, whose attention layers carry real
  vllm-ascend ``AscendMLAImpl`` objects (their ``process_weights_after_loading`` is upstream code).

``generate`` is the device compute: it samples ``max_tokens`` tokens per prompt from the policy's logits at the
sampling temperature (greedy at temperature 0), stops at the tokenizer's EOS, and returns ``RequestOutput``-shaped
objects (``outputs[i].token_ids``, ``outputs[i].logprobs`` when asked), which verl's stock ``generate_sequences``
pads and assembles. top-p/top-k are not applied.

The engine-shaped pieces (``ModelRunner``, ``Executor``, ``start_engine``) are also what the overlay's unit tests
build their recording fakes on, so the rehearsal and the tests stand in for vLLM in one way.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import torch

from r1_ascend.rehearse import tiny_policy as tp

BLOCK_SIZE = 16
#: Bytes the stand-in executor reports free for KV cache (a handful of blocks per layer).
AVAILABLE_KV_BYTES = 256 * 1024


def mla_impl(kv_b_proj: torch.nn.Module, impl_class: type | None = None) -> Any:
    """vllm-ascend's MLA implementation object (``impl_class``, default ``AscendMLAImpl``, created without its
    ``__init__``) with the fields its weight post-processing reads."""
    if impl_class is None:
        from vllm_ascend.attention.mla_v1 import AscendMLAImpl as impl_class

    impl = object.__new__(impl_class)
    impl.kv_b_proj = kv_b_proj
    impl.num_heads = tp.NUM_HEADS
    impl.kv_lora_rank = tp.KV_LORA_RANK
    impl.qk_nope_head_dim = tp.QK_NOPE_HEAD_DIM
    impl.v_head_dim = tp.V_HEAD_DIM
    return impl


class Attention:
    """``vllm.attention.Attention`` as the static forward context holds it."""

    def __init__(self, impl: Any) -> None:
        self.impl = impl
        self.kv_cache = [torch.tensor([])]
        self.attn_type = "decoder"


def layer_name(index: int) -> str:
    return f"model.layers.{index}.self_attn.attn"


def _unquantized(linear: torch.nn.Linear) -> torch.nn.Linear:
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    linear.quant_method = UnquantizedLinearMethod()
    return linear


class ModelRunner:
    """vllm-ascend ``NPUModelRunner`` as the offloading rollout uses it, for any model whose decoder layers carry
    ``self_attn.kv_b_proj`` (``impl_class``: the MLA implementation class, see ``mla_impl``)."""

    impl_class: type | None = None

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        self.model = model
        self.kv_caches: list[Any] = []
        context = {
            layer_name(i): Attention(mla_impl(_unquantized(layer.self_attn.kv_b_proj), self.impl_class))
            for i, layer in enumerate(model.model.layers)
        }
        self.vllm_config = types.SimpleNamespace(
            compilation_config=types.SimpleNamespace(static_forward_context=context),
            model_config=types.SimpleNamespace(dtype=dtype),
        )
        for attention in context.values():  # vLLM's loader derives the MLA matrices once at start-up
            attention.impl.process_weights_after_loading(dtype)

    def get_model(self) -> torch.nn.Module:
        return self.model

    @property
    def forward_context(self) -> dict[str, Attention]:
        return self.vllm_config.compilation_config.static_forward_context

    def get_kv_cache_spec(self) -> dict[str, Any]:
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        head_size = tp.QK_NOPE_HEAD_DIM + tp.QK_ROPE_HEAD_DIM
        dtype = self.vllm_config.model_config.dtype
        return {
            name: FullAttentionSpec(
                block_size=BLOCK_SIZE, num_kv_heads=1, head_size=head_size, dtype=dtype, use_mla=True
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
                nope = torch.zeros(blocks, BLOCK_SIZE, 1, tp.QK_NOPE_HEAD_DIM, dtype=dtype)
                rope = torch.zeros(blocks, BLOCK_SIZE, 1, tp.QK_ROPE_HEAD_DIM, dtype=dtype)
                caches[name] = (nope, rope)
        bind_kv_cache(caches, self.forward_context, self.kv_caches)


@dataclass
class Executor:
    """vLLM's executor with ``external_launcher``: one in-process worker."""

    model_runner: ModelRunner
    available_memory: int = AVAILABLE_KV_BYTES

    @property
    def driver_worker(self) -> Any:
        return types.SimpleNamespace(worker=types.SimpleNamespace(model_runner=self.model_runner))

    def get_kv_cache_specs(self) -> list[dict[str, Any]]:
        return [self.model_runner.get_kv_cache_spec()]

    def determine_available_memory(self) -> list[int]:
        return [self.available_memory]

    def initialize_from_config(self, kv_cache_configs: list[Any]) -> None:
        self.model_runner.initialize_kv_cache(kv_cache_configs[0])  # WorkerWrapperBase picks configs[rpc_rank=0]


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


class CPUStandInLLM:
    """Answers ``vllm.LLM(model=..., max_model_len=..., seed=..., **engine_kwargs)`` as verl calls it."""

    def __init__(self, model: str, max_model_len: int = 1024, seed: int = 0, **engine_kwargs: Any) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self.engine_kwargs = dict(engine_kwargs)
        hf_config = AutoConfig.from_pretrained(model, trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(model)
        self.eos_token_id = tokenizer.eos_token_id
        self.model = tp.TinyPolicy(int(hf_config.vocab_size))
        self.runner = ModelRunner(self.model, torch.float32)
        self.executor = Executor(self.runner)
        self.engine_core, self.llm_engine = start_engine(self.executor, int(max_model_len))
        self.generator = torch.Generator().manual_seed(int(seed))
        self.prefix_cache_resets = 0

    def reset_prefix_cache(self) -> bool:
        self.prefix_cache_resets += 1
        return True

    @torch.no_grad()
    def generate(self, prompts: list[dict[str, Any]], sampling_params: Any, **_: Any) -> list[Any]:
        temperature = float(sampling_params.temperature)
        want_logprobs = sampling_params.logprobs is not None
        outputs = []
        for prompt in prompts:
            samples = []
            for _sample in range(int(sampling_params.n)):
                token = int(prompt["prompt_token_ids"][-1])
                token_ids: list[int] = []
                logprobs: list[dict[int, Any]] = []
                for _step in range(int(sampling_params.max_tokens)):
                    logits = self.model.logits(torch.tensor([token]))[0]
                    if temperature > 0:
                        log_p = torch.log_softmax(logits / temperature, dim=-1)
                        token = int(torch.multinomial(log_p.exp(), 1, generator=self.generator))
                    else:
                        log_p = torch.log_softmax(logits, dim=-1)
                        token = int(torch.argmax(log_p))
                    token_ids.append(token)
                    if want_logprobs:
                        logprobs.append({token: types.SimpleNamespace(logprob=float(log_p[token]))})
                    if token == self.eos_token_id:
                        break
                samples.append(types.SimpleNamespace(token_ids=token_ids, logprobs=logprobs if want_logprobs else None))
            outputs.append(types.SimpleNamespace(outputs=samples))
        return outputs
