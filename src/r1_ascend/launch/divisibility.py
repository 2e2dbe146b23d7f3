"""The divisibility rules of the parallel layouts, as pure functions (the checks word them; tests fuzz them).

Attention heads: Megatron-core's ``TransformerConfig.__post_init__`` refuses a tensor-parallel size that does not
divide ``num_attention_heads`` or ``num_query_groups`` (the KV heads of grouped-query attention); vLLM's
``ModelConfig.verify_with_parallel_config`` refuses one that does not divide the attention heads. Both run only
once the workers start, after the actor has loaded. Experts: Megatron's MoE layer and vLLM's fused MoE split the
routed experts evenly over the expert-parallel ranks.
"""

from __future__ import annotations


def divides(divisor: int, value: int) -> bool:
    """``divisor`` divides ``value`` (a size < 1 never does)."""
    return divisor >= 1 and value % divisor == 0


def head_split_problems(heads: int, query_groups: int | None, tp: int) -> list[str]:
    """Why ``tp`` cannot split the attention heads (and KV heads, when given); empty when it can."""
    problems = []
    if not divides(tp, heads):
        problems.append(f"{heads} attention heads are not divisible by tensor parallel size {tp}")
    if query_groups is not None and not divides(tp, query_groups):
        problems.append(f"{query_groups} KV heads (query groups) are not divisible by tensor parallel size {tp}")
    return problems


def largest_head_tp(heads: int, query_groups: int | None, tp: int, world: int) -> int:
    """The largest tensor-parallel size <= ``tp`` that splits the heads (and KV heads) and divides ``world``."""
    for candidate in range(max(tp, 1), 0, -1):
        if not head_split_problems(heads, query_groups, candidate) and divides(candidate, world):
            return candidate
    return 1


def expert_split_problems(experts: int, ep: int, rollout_ep: int | None) -> list[str]:
    """Why the routed experts cannot be split over actor EP (and rollout EP, when given); empty when they can."""
    problems = []
    if not divides(ep, experts):
        problems.append(f"actor expert_model_parallel_size {ep} does not divide the {experts} experts")
    if rollout_ep is not None and not divides(rollout_ep, experts):
        problems.append(
            f"rollout EP = TP x VLLM_DP_SIZE = {rollout_ep} does not divide the {experts} experts "
            "(vLLM shards every MoE layer's experts over all rollout ranks)"
        )
    return problems


def world_split_problems(world: int, tp: int, pp: int, cp: int, ep: int, etp: int) -> list[str]:
    """Why the world size cannot hold the dense (TP x PP x CP) and expert (PP x EP x expert-TP) grids."""
    problems = []
    if not divides(tp * pp * cp, world):
        problems.append(f"world {world} is not divisible by TP x PP x CP = {tp * pp * cp}")
    if not divides(pp * ep * etp, world):
        problems.append(f"world {world} is not divisible by PP x EP x expert-TP = {pp} x {ep} x {etp}")
    return problems
