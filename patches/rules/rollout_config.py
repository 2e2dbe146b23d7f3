"""Rollout-config checks for the offloading vLLM rollout, usable without building an engine (e.g. on the driver)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._errors import RolloutConfigError

__all__ = [
    "RolloutConfigError",
    "ascend_scheduler_options",
    "check_batched_tokens",
    "check_engine_options",
    "check_free_cache_engine",
    "max_model_len",
    "stock_length_check_would_fail",
    "vllm_engine_kwargs",
]


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


def vllm_engine_kwargs(config: Any) -> Mapping[str, Any]:
    """``engine_kwargs.vllm`` (empty when not set): the keyword arguments verl passes through to ``LLM()``."""
    engine_kwargs = config.engine_kwargs or {}
    return engine_kwargs.get("vllm") or {}


def check_engine_options(
    config: Any,
    *,
    model_type: str,
    is_moe: bool,
    dp_size: int,
    dp_groups: bool = True,
    offload: bool = True,
    live_params: bool = True,
) -> list[str]:
    """Engine options vllm-ascend 0.9.1 needs for this model and layout; one message per problem.

    Mirrors ``vllm_ascend.ascend_config.check_ascend_config`` (which raises deep inside engine construction) and
    the needs of the ``vllm_dp_ep_groups`` patch:
    - DeepSeek models without ``enforce_eager`` must use TorchAir graph mode (ACL graph raises for DeepSeek);
      TorchAir graph mode is only for DeepSeek models and cannot be combined with ``enforce_eager``;
    - with DP > 1 and the ``vllm_dp_ep_groups`` patch active (``dp_groups``), MoE experts must be sharded over all
      ranks (``enable_expert_parallel``), and ``additional_config.refresh`` must be true: building the DP/EP groups
      before ``LLM()`` initialises vllm-ascend's global ``AscendConfig`` with defaults, which ``LLM()`` would
      otherwise keep (silently ignoring the TorchAir and scheduler settings). With that patch disabled every TP group
      runs its own engine, and neither applies;
    - with the offloading rollout (``offload``), which re-allocates parameter storage every step, no graph may keep
      the addresses it first saw: ACL graph mode (non-DeepSeek without ``enforce_eager``) is refused; TorchAir graph
      mode needs the ``vllm_ascend_torchair_live_params`` patch (``live_params``) and neither ``use_cached_graph``
      nor ``enable_frozen_parameter``.
    """
    kwargs = vllm_engine_kwargs(config)
    additional = kwargs.get("additional_config") or {}
    torchair = additional.get("torchair_graph_config") or {}
    graph = bool(torchair.get("enabled", False))
    deepseek = "deepseek" in model_type
    prefix = "actor_rollout_ref.rollout.engine_kwargs.vllm"
    problems = []
    if config.enforce_eager and graph:
        problems.append(
            f"{prefix}.additional_config.torchair_graph_config.enabled=true with enforce_eager=True: vllm-ascend 0.9.1 "
            "refuses graph mode in eager mode; set actor_rollout_ref.rollout.enforce_eager=False"
        )
    if not config.enforce_eager and deepseek and not graph:
        problems.append(
            f"model_type {model_type!r} without TorchAir graph mode: vllm-ascend 0.9.1 raises 'ACL Graph does not "
            f"support deepseek'; set {prefix}.additional_config.torchair_graph_config.enabled=true"
        )
    if graph and not deepseek:
        problems.append(
            f"TorchAir graph mode is only supported for DeepSeek models in vllm-ascend 0.9.1 (model_type "
            f"{model_type!r}); remove {prefix}.additional_config.torchair_graph_config"
        )
    if offload:
        problems += _address_capture_problems(config, torchair, graph=graph, deepseek=deepseek, live=live_params)
    if graph:
        sizes = list(torchair.get("graph_batch_sizes") or [])
        if sizes and int(config.max_num_seqs) not in sizes:
            problems.append(
                f"torchair_graph_config.graph_batch_sizes {sizes} does not contain max_num_seqs "
                f"({config.max_num_seqs}): full decode batches would fall outside every captured graph; add it"
            )
    if dp_size > 1 and dp_groups:
        if is_moe and not kwargs.get("enable_expert_parallel", False):
            problems.append(
                f"rollout DP size {dp_size} with a MoE model but {prefix}.enable_expert_parallel is not true: every DP "
                "rank would hold all experts; set it to true (EP = all rollout ranks)"
            )
        if not additional.get("refresh", False):
            problems.append(
                f"rollout DP size {dp_size} but {prefix}.additional_config.refresh is not true: the DP/EP groups are "
                "built before LLM(), which leaves vllm-ascend's AscendConfig at its defaults unless refreshed; set "
                "refresh: true"
            )
    return problems


def _address_capture_problems(
    config: Any, torchair: Mapping[str, Any], *, graph: bool, deepseek: bool, live: bool
) -> list[str]:
    """Graph modes that would keep replaying parameter addresses the offloading rollout has freed."""
    prefix = "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.torchair_graph_config"
    why = "the offloading rollout frees and re-allocates every parameter's storage each step"
    problems = []
    if not config.enforce_eager and not graph and not deepseek:
        problems.append(
            f"enforce_eager=False without TorchAir selects ACL graph mode, whose captured NPU graphs replay the "
            f"parameter addresses of capture time, but {why}; vllm-ascend 0.9.1 has no way to refresh them. Set "
            f"actor_rollout_ref.rollout.enforce_eager=True"
        )
    if graph and not live:
        problems.append(
            f"TorchAir graph mode with frozen parameters (patch vllm_ascend_torchair_live_params disabled) keeps the "
            f"parameter addresses of its first run, but {why}. Enable that patch (remove it from R1_ASCEND_DISABLE) "
            f"or set actor_rollout_ref.rollout.enforce_eager=True"
        )
    if graph and torchair.get("use_cached_graph", False):
        problems.append(
            f"{prefix}.use_cached_graph=true serialises graphs with frozen parameter addresses, but {why}; set it "
            f"to false"
        )
    if graph and torchair.get("enable_frozen_parameter", False):
        problems.append(
            f"{prefix}.enable_frozen_parameter=true asks TorchAir to keep parameter addresses, but {why} (vllm-ascend "
            f"0.9.1 ignores this key; the vllm_ascend_torchair_live_params patch never freezes); remove it or set "
            f"it to false"
        )
    return problems
