"""The rollout's vLLM data-parallel / expert-parallel layout, computed from the real world size (no side effects).

One vLLM instance spans every rollout rank. vLLM 0.9.1 lays ranks out as ExternalDP x DP x PP x TP (row-major,
TP fastest); here ExternalDP = PP = 1, so ``rank = dp_rank * tp_size + tp_rank`` and:

- TP groups are runs of ``tp_size`` consecutive ranks: ``[0, 1], [2, 3], ...`` for TP 2;
- DP groups take one rank per TP group at the same TP position: ``[0, 2, 4, ...], [1, 3, 5, ...]``;
- the EP group is every rank (EP = DP x TP = world size).

``VLLM_DP_SIZE`` is derived, never trusted: a value that disagrees with ``world_size / tp_size`` is an error
instead of a silently different layout (or a crash deep inside vLLM's rank reshape).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._errors import DpEpConfigError

__all__ = [
    "VLLM_DP_SIZE",
    "DpEpConfigError",
    "RankGroups",
    "check_env_dp_size",
    "check_rollout_config",
    "plan_dp_ep_layout",
    "rollout_dp_size",
]

VLLM_DP_SIZE = "VLLM_DP_SIZE"


@dataclass(frozen=True)
class RankGroups:
    """Where one rank sits in the rollout's single vLLM instance, and who its group peers are."""

    world_size: int
    rank: int
    tp_size: int
    dp_size: int
    dp_rank: int
    tp_rank: int
    ep_size: int
    ep_rank: int
    tp_group: tuple[int, ...]
    dp_group: tuple[int, ...]
    ep_group: tuple[int, ...]
    tp_groups: tuple[tuple[int, ...], ...]
    dp_groups: tuple[tuple[int, ...], ...]

    @property
    def dp_master_rank(self) -> int:
        """The global rank hosting this DP group's rendezvous (vLLM's DP rank 0 of the group)."""
        return self.dp_group[0]

    @property
    def dp_master_ranks(self) -> tuple[int, ...]:
        return tuple(group[0] for group in self.dp_groups)


def plan_dp_ep_layout(world_size: int, rank: int, tp_size: int, env_dp_size: str | int | None = None) -> RankGroups:
    """The layout of ``rank`` in a world of ``world_size`` ranks with rollout tensor parallelism ``tp_size``.

    ``env_dp_size`` is the raw ``VLLM_DP_SIZE`` value if the user exported one (``None`` or ``""`` if not); it
    must equal ``world_size // tp_size``. Raises ``DpEpConfigError`` with the values and the fix otherwise.
    """
    if world_size < 1:
        msg = f"world size must be >= 1, got {world_size}"
        raise DpEpConfigError(msg)
    if not 0 <= rank < world_size:
        msg = f"rank {rank} is outside the world of {world_size} ranks"
        raise DpEpConfigError(msg)
    dp_size = rollout_dp_size(world_size, tp_size)
    check_env_dp_size(env_dp_size, dp_size=dp_size, world_size=world_size, tp_size=tp_size)

    tp_groups = tuple(tuple(range(d * tp_size, (d + 1) * tp_size)) for d in range(dp_size))
    dp_groups = tuple(tuple(range(t, world_size, tp_size)) for t in range(tp_size))
    dp_rank, tp_rank = divmod(rank, tp_size)
    return RankGroups(
        world_size=world_size,
        rank=rank,
        tp_size=tp_size,
        dp_size=dp_size,
        dp_rank=dp_rank,
        tp_rank=tp_rank,
        ep_size=world_size,
        ep_rank=rank,
        tp_group=tp_groups[dp_rank],
        dp_group=dp_groups[tp_rank],
        ep_group=tuple(range(world_size)),
        tp_groups=tp_groups,
        dp_groups=dp_groups,
    )


def rollout_dp_size(world_size: int, tp_size: int) -> int:
    """The rollout's vLLM data-parallel size: one instance over every rank, so DP = world size / rollout TP.

    Raises ``DpEpConfigError`` (what is wrong and how to fix it) when ``tp_size`` is not a positive divisor of
    ``world_size``. This is the only place the rule is written; the patch, preflight and the recipe ask it.
    """
    if tp_size < 1:
        msg = f"actor_rollout_ref.rollout.tensor_model_parallel_size must be >= 1, got {tp_size}"
        raise DpEpConfigError(msg)
    if world_size % tp_size:
        msg = (
            f"the world size {world_size} is not divisible by the rollout tensor-parallel size {tp_size}, so one "
            f"vLLM instance cannot span all ranks. Set actor_rollout_ref.rollout.tensor_model_parallel_size to a "
            f"divisor of {world_size} (nodes x NPUs per node), or change the number of nodes."
        )
        raise DpEpConfigError(msg)
    return world_size // tp_size


def check_env_dp_size(raw: str | int | None, *, dp_size: int, world_size: int, tp_size: int) -> None:
    """Accept an unset/empty ``VLLM_DP_SIZE`` or one equal to the derived DP size; anything else is an error."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return
    fix = (
        f"Unset {VLLM_DP_SIZE} (r1-ascend derives it from the world size) or set it to {dp_size} "
        f"(= world size {world_size} / rollout tensor_model_parallel_size {tp_size})."
    )
    try:
        value = int(str(raw).strip())
    except ValueError:
        msg = f"{VLLM_DP_SIZE}={raw!r} is not an integer. {fix}"
        raise DpEpConfigError(msg) from None
    if value != dp_size:
        msg = (
            f"{VLLM_DP_SIZE}={value} disagrees with the running job: world size {world_size} / rollout "
            f"tensor_model_parallel_size {tp_size} = DP {dp_size}. {fix} If you meant a different layout, change "
            f"the number of nodes or the rollout TP instead."
        )
        raise DpEpConfigError(msg)


def check_rollout_config(config: Any) -> int:
    """Validate verl's rollout config for one vLLM instance over all ranks; return the rollout TP size.

    ``config`` is verl's ``RolloutConfig`` (anything with ``.get``/attribute access works).
    """
    tp_size = _config_int(config, "tensor_model_parallel_size", 1)
    verl_dp = _config_int(config, "data_parallel_size", 1)
    pp_size = _config_int(config, "pipeline_model_parallel_size", 1)
    if verl_dp != 1:
        msg = (
            f"actor_rollout_ref.rollout.data_parallel_size={verl_dp}, expected 1. vLLM data parallelism is set up "
            f"by r1-ascend across all ranks (VLLM_DP_SIZE = world size / rollout TP); verl 0.6.1's _build_rollout "
            f"multiplies data_parallel_size into infer_tp, which would change verl's dispatch mesh as well. "
            f"Remove the override (or set it to 1)."
        )
        raise DpEpConfigError(msg)
    if pp_size != 1:
        msg = (
            f"actor_rollout_ref.rollout.pipeline_model_parallel_size={pp_size}, expected 1: the rollout layout "
            f"(one vLLM instance, EP = all ranks) has no pipeline stages. Set it to 1."
        )
        raise DpEpConfigError(msg)
    return tp_size


def _config_int(config: Any, key: str, default: int) -> int:
    getter = getattr(config, "get", None)
    value = getter(key, default) if callable(getter) else getattr(config, key, default)
    try:
        return int(value)
    except (TypeError, ValueError):
        msg = f"actor_rollout_ref.rollout.{key}={value!r} is not an integer"
        raise DpEpConfigError(msg) from None
