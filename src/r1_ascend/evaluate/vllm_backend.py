"""The NPU backend: vLLM 0.9.1's offline ``vllm.LLM`` (with vllm-ascend 0.9.1) at tensor parallelism.

Why not verl 0.6.1's ``verl.trainer.main_generation``: it builds ``verl.workers.fsdp_workers.ActorRolloutRefWorker``
with role ``rollout``, which loads the HF model into FSDP as well and syncs it into vLLM (two copies of 671B on the
same NPUs, through the FSDP path this recipe does not use for DeepSeek-V3), calls ``generate_sequences`` once per
sample (64 passes over the set instead of one request with ``n=64``), truncates prompts to
``rollout.prompt_length`` without saying so, and scores nothing. The offline engine holds one copy of the weights,
samples ``n`` per prompt in one request, and takes the prompt token ids verbatim.

The engine settings are the 671B rollout's (``recipe/config/grpo_deepseekv3_671b.yaml``: expert parallelism over
the TP ranks for MoE models, the Ascend scheduler, TorchAir graph mode with one graph batch size = ``max_num_seqs``,
no prefix caching), except that ``max_num_batched_tokens`` is raised to ``max_model_len`` (the Ascend scheduler
without chunked prefill refuses less) and the memory share is vLLM's default 0.9 (no trainer shares the dies).
A TP larger than this node's NPUs runs over Ray (``distributed_executor_backend="ray"``; start the Ray cluster on
every node first). ``--vllm-kwargs`` replaces any of them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from r1_ascend.evaluate.generation import VLLM, BackendSpec, Completion, Request, SampleProgress, SamplingOptions
from r1_ascend.evaluate.prompts import decode_response
from r1_ascend.launch.memory import A3_DIE_MEMORY_GB, GIB
from r1_ascend.launch.model_info import BF16_BYTES, ModelInfo

#: Sequences decoded at once per engine, and the one TorchAir graph batch size (the 671B rollout's value).
MAX_NUM_SEQS = 64
#: Share of each die's memory vLLM may take (vLLM's default; the rollout uses 0.8 beside the trainer).
GPU_MEMORY_UTILIZATION = 0.9


class EngineConfigError(ValueError):
    """The engine settings cannot work (the model does not fit at this TP); the message says what would."""


def additional_config(max_num_seqs: int) -> dict[str, Any]:
    """vllm-ascend's ``additional_config`` as the 671B rollout sets it (without ``refresh``, which only the
    rollout's DP/EP overlay needs)."""
    return {
        "torchair_graph_config": {
            "enabled": True,
            "use_cached_graph": False,
            "graph_batch_sizes_init": False,
            "graph_batch_sizes": [max_num_seqs],
        },
        "ascend_scheduler_config": {"enabled": True},
    }


def engine_kwargs(spec: BackendSpec, info: ModelInfo, local_devices: int) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` for this model and machine, ``spec.engine_kwargs`` applied last."""
    tp = spec.tensor_parallel_size or max(local_devices, 1)
    kwargs: dict[str, Any] = {
        "model": str(spec.model_dir),
        "tokenizer": str(spec.model_dir),
        "trust_remote_code": spec.trust_remote_code,
        "dtype": "bfloat16",
        "seed": spec.seed,
        "tensor_parallel_size": tp,
        "max_model_len": spec.max_model_len,
        "max_num_batched_tokens": spec.max_model_len,
        "max_num_seqs": MAX_NUM_SEQS,
        "enable_chunked_prefill": False,
        "enable_prefix_caching": False,
        "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
        "additional_config": additional_config(MAX_NUM_SEQS),
    }
    if info.is_moe:
        kwargs["enable_expert_parallel"] = True
    if tp > local_devices:
        kwargs["distributed_executor_backend"] = "ray"
    kwargs.update(spec.engine_kwargs or {})
    return kwargs


@dataclass(frozen=True)
class MemoryPlan:
    """Per die: the BF16 weights at this TP, and the KV-cache tokens the rest of the engine's share holds."""

    tensor_parallel_size: int
    weights_gib: float
    budget_gib: float
    kv_bytes_per_token: int

    @property
    def kv_tokens(self) -> int:
        return max(int((self.budget_gib - self.weights_gib) * GIB // self.kv_bytes_per_token), 0)

    def describe(self, max_model_len: int) -> str:
        return (
            f"TP {self.tensor_parallel_size}: {self.weights_gib:.1f} GiB of BF16 weights per die of a "
            f"{self.budget_gib:.1f} GiB share, room for about {self.kv_tokens:,} tokens of KV cache "
            f"(~{self.kv_tokens / max_model_len:.1f} sequences of the full {max_model_len:,} tokens at once)"
        )


def memory_plan(
    info: ModelInfo, tensor_parallel_size: int, utilization: float, die_gib: float = A3_DIE_MEMORY_GB
) -> MemoryPlan:
    """Weights split evenly over the TP (and expert-parallel) ranks; the lower bound of what a die must hold."""
    weights = info.total_params() * BF16_BYTES / tensor_parallel_size / GIB
    return MemoryPlan(
        tensor_parallel_size, weights, die_gib * utilization, info.kv_cache_bytes_per_token(tensor_parallel_size)
    )


def check_fits(plan: MemoryPlan, info: ModelInfo) -> None:
    """Refuse a TP whose weight share alone fills the die, naming the smallest TP that leaves room."""
    if plan.weights_gib < plan.budget_gib:
        return
    total = plan.weights_gib * plan.tensor_parallel_size
    heads = int(info.config.get("num_attention_heads", 1))
    fitting = [tp for tp in range(1, heads + 1) if heads % tp == 0 and total / tp < plan.budget_gib]
    hint = (
        f"use --tensor-parallel-size {fitting[0]} or more (it must divide the {heads} attention heads; more than "
        "one node's NPUs run over Ray, see docs/evaluate.md)"
        if fitting
        else "no tensor-parallel size dividing the attention heads fits"
    )
    msg = (
        f"the model's {total:.0f} GiB of BF16 weights need {plan.weights_gib:.1f} GiB per die at TP "
        f"{plan.tensor_parallel_size}, more than the engine's {plan.budget_gib:.1f} GiB share of a "
        f"{plan.budget_gib / GPU_MEMORY_UTILIZATION:.0f} GiB die; {hint}"
    )
    raise EngineConfigError(msg)


def sampling_params(options: SamplingOptions, seed: int) -> Any:
    """One request's ``vllm.SamplingParams``: ``n`` samples, temperature and top-p only (top-k off)."""
    from vllm import SamplingParams

    return SamplingParams(
        n=options.n,
        temperature=options.temperature,
        top_p=options.top_p,
        top_k=-1,
        max_tokens=options.max_new_tokens,
        seed=seed,
    )


class VllmBackend:
    name = VLLM

    def __init__(self, spec: BackendSpec) -> None:
        from r1_ascend.doctor import npu_devices

        config = json.loads((spec.model_dir / "config.json").read_text(encoding="utf-8"))
        info = ModelInfo(spec.model_dir, config)
        self.kwargs = engine_kwargs(spec, info, len(npu_devices()))
        self.plan = memory_plan(info, int(self.kwargs["tensor_parallel_size"]), self.kwargs["gpu_memory_utilization"])
        check_fits(self.plan, info)
        self.tokenizer = spec.tokenizer
        try:
            import vllm  # after the checks: importing it takes seconds
        except ImportError as exc:
            msg = (
                f"vLLM cannot be imported here ({exc}); it needs the NPU stack (vllm-ascend, torch_npu, CANN). On a "
                "machine without NPUs use --backend transformers"
            )
            raise EngineConfigError(msg) from exc
        self.llm = vllm.LLM(**self.kwargs)

    def generate(
        self, requests: Sequence[Request], options: SamplingOptions, progress: SampleProgress
    ) -> list[list[Completion]]:
        prompts = [{"prompt_token_ids": list(request.token_ids)} for request in requests]
        params = [sampling_params(options, request.seed) for request in requests]
        outputs = self.llm.generate(prompts, sampling_params=params, use_tqdm=progress)
        if len(outputs) != len(requests):
            msg = f"vLLM returned {len(outputs)} results for {len(requests)} prompts"
            raise RuntimeError(msg)
        results = []
        for output in outputs:
            samples = sorted(output.outputs, key=lambda sample: sample.index)
            results.append(
                [
                    Completion(
                        decode_response(self.tokenizer, list(sample.token_ids)),
                        str(sample.finish_reason),
                        len(sample.token_ids),
                    )
                    for sample in samples
                ]
            )
        return results
