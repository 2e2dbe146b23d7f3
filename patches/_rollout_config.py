"""Rollout-config checks for the offloading vLLM rollout, usable without building an engine (e.g. on the driver)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class RolloutConfigError(ValueError):
    """The rollout config cannot work with the offloading rollout on vllm-ascend."""


def max_model_len(config: Any) -> int:
    """The engine's context length exactly as stock verl 0.6.1 computes it."""
    return int(config.max_model_len or config.prompt_length + config.response_length)


def ascend_scheduler_options(config: Any) -> Mapping[str, Any]:
    """``engine_kwargs.vllm.additional_config.ascend_scheduler_config`` (empty when not set)."""
    engine_kwargs = config.engine_kwargs or {}
    vllm_kwargs = engine_kwargs.get("vllm") or {}
    additional = vllm_kwargs.get("additional_config") or {}
    return additional.get("ascend_scheduler_config") or {}


def check_free_cache_engine(config: Any) -> None:
    if not config.free_cache_engine:
        msg = (
            "actor_rollout_ref.rollout.free_cache_engine=False is not supported by the offloading rollout: the rollout "
            "weights and KV cache would stay on the NPU during training, which cannot fit for DeepSeek-V3 "
            "(certain OOM). Set actor_rollout_ref.rollout.free_cache_engine=True."
        )
        raise RolloutConfigError(msg)


def check_batched_tokens(config: Any) -> None:
    """Reject ``max_num_batched_tokens < max_model_len`` when the engine would run without chunked prefill.

    vLLM V1 always enables chunked prefill, so the plain V1 scheduler accepts any value. vllm-ascend 0.9.1's
    ``AscendSchedulerConfig`` (``additional_config.ascend_scheduler_config.enabled``) turns chunked prefill off unless
    that same dict sets ``enable_chunked_prefill``, and then raises deep inside engine construction. Stock verl's own
    check is the reverse (it rejects small batches *with* chunked prefill), so it is bypassed and replaced by this one.
    """
    batched = int(config.max_num_batched_tokens)
    length = max_model_len(config)
    scheduler = ascend_scheduler_options(config)
    if batched >= length or not scheduler.get("enabled", False):
        return
    if scheduler.get("enable_chunked_prefill", False):
        return
    msg = (
        f"rollout max_num_batched_tokens ({batched}) is smaller than max_model_len ({length}) while vllm-ascend's "
        f"Ascend scheduler is enabled without chunked prefill, which vllm-ascend 0.9.1 rejects. Either set "
        f"actor_rollout_ref.rollout.max_num_batched_tokens>={length}, or add "
        f"enable_chunked_prefill: true to actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config."
        f"ascend_scheduler_config."
    )
    raise RolloutConfigError(msg)


def stock_length_check_would_fail(config: Any) -> bool:
    """Whether stock verl 0.6.1 ``vLLMRollout.__init__`` would reject this config (see ``check_batched_tokens``)."""
    return int(config.max_num_batched_tokens) < max_model_len(config) and bool(config.enable_chunked_prefill)
