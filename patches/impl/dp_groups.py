"""Build vLLM's data-parallel and expert-parallel groups over all rollout ranks (the side effects).

Order matters and is the reason this exists:
1. ``VLLM_DP_SIZE``/``VLLM_DP_RANK`` are exported first: with no vLLM config current, vLLM 0.9.1's
   ``initialize_model_parallel`` takes its DP size from a default ``ParallelConfig``, whose ``__post_init__``
   falls back to ``vllm.envs.VLLM_DP_SIZE`` (the "offline SPMD" path);
2. ``vllm`` then ``vllm_ascend.patch.worker`` are imported so every ``GroupCoordinator`` built below is
   vllm-ascend's ``GroupCoordinatorPatch`` (it adds the ``all_to_all`` the MoE layers need);
3. ``init_distributed_environment`` (torch.distributed is already up, so this only builds vLLM's world
   coordinator) and ``initialize_model_parallel(tp)`` build TP, PP, DP and EP groups, which are then checked
   member by member against the planned layout;
4. every rank's IP and each DP master's free port are all-gathered over the world's gloo group, and
   ``VLLM_DP_MASTER_IP``/``VLLM_DP_MASTER_PORT`` are exported for the ``LLM()`` that follows (vLLM's LLMEngine
   opens its stateless gloo DP group there).

``vllm.envs`` evaluates these variables lazily from ``os.environ`` (module ``__getattr__``) in vLLM 0.9.1, so
writing ``os.environ`` is what makes vLLM see them; the values are read back through ``vllm.envs`` to prove it.
Every failure that can happen after the first collective is decided from gathered data, so all ranks raise
together instead of some of them hanging.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import DpEpConfigError, DpEpGroupError, NodeIpError, PortSelectionError
from ..rules.dp_layout import VLLM_DP_SIZE, RankGroups, check_rollout_config, plan_dp_ep_layout
from .dp_net import discover_node_ip, pick_free_port, reserved_port_ranges

logger = logging.getLogger(__name__)

VLLM_DP_RANK = "VLLM_DP_RANK"
VLLM_DP_MASTER_IP = "VLLM_DP_MASTER_IP"
VLLM_DP_MASTER_PORT = "VLLM_DP_MASTER_PORT"


@dataclass(frozen=True)
class Rendezvous:
    """Where this rank's DP group meets: the DP master's node IP and the port it reserved."""

    master_ip: str
    master_port: int


def setup_rollout_groups(config: Any) -> RankGroups:
    """Validate verl's rollout ``config`` and build the groups for this rank (called before ``LLM()``)."""
    import torch.distributed as dist

    env = os.environ
    tp_size = check_rollout_config(config)
    if not dist.is_initialized():
        msg = (
            "torch.distributed is not initialised; the vLLM rollout must be built inside verl's worker, which "
            "initialises it before building the rollout"
        )
        raise DpEpGroupError(msg)
    layout = plan_dp_ep_layout(dist.get_world_size(), dist.get_rank(), tp_size, env.get(VLLM_DP_SIZE))
    from verl.utils.device import get_nccl_backend

    init_dp_ep_groups(layout, local_rank=_local_rank(env), backend=get_nccl_backend())
    return layout


def init_dp_ep_groups(layout: RankGroups, *, local_rank: int, backend: str) -> Rendezvous | None:
    """Build vLLM's world, TP, PP, DP and EP groups for ``layout`` and export the ``VLLM_DP_*`` variables.

    They go to ``os.environ`` because that is where vLLM reads them. Returns the DP rendezvous, or ``None`` when DP
    is 1 (then ``LLM()`` builds the groups itself).
    """
    import torch.distributed as dist

    env = os.environ
    if not dist.is_initialized() or (dist.get_world_size(), dist.get_rank()) != (layout.world_size, layout.rank):
        found = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else "not initialised"
        msg = f"layout is for (world size, rank) = {(layout.world_size, layout.rank)}, torch.distributed is {found}"
        raise DpEpGroupError(msg)
    env[VLLM_DP_SIZE] = str(layout.dp_size)
    env[VLLM_DP_RANK] = str(layout.dp_rank)
    if layout.dp_size == 1:
        _check_vllm_envs({VLLM_DP_SIZE: 1, VLLM_DP_RANK: 0})
        logger.info("vLLM DP size is 1 (world %d = rollout TP): vLLM builds its own groups", layout.world_size)
        return None

    parallel_state = _import_parallel_state_with_ascend_coordinator()
    parallel_state.init_distributed_environment(layout.world_size, layout.rank, "env://", local_rank, backend)
    if parallel_state.model_parallel_is_initialized():
        logger.info("vLLM model-parallel groups already exist; checking them against the planned layout")
    else:
        parallel_state.initialize_model_parallel(layout.tp_size, 1, backend)
    check_vllm_groups(layout, parallel_state)

    rendezvous = exchange_rendezvous(layout, env, group=parallel_state.get_world_group().cpu_group)
    env[VLLM_DP_MASTER_IP] = rendezvous.master_ip
    env[VLLM_DP_MASTER_PORT] = str(rendezvous.master_port)
    _check_vllm_envs(
        {
            VLLM_DP_SIZE: layout.dp_size,
            VLLM_DP_RANK: layout.dp_rank,
            VLLM_DP_MASTER_IP: rendezvous.master_ip,
            VLLM_DP_MASTER_PORT: rendezvous.master_port,
        },
    )
    logger.info(
        "rank %d: vLLM TP %d (rank %d) x DP %d (rank %d), EP %d; DP master %s:%d (global rank %d)",
        layout.rank,
        layout.tp_size,
        layout.tp_rank,
        layout.dp_size,
        layout.dp_rank,
        layout.ep_size,
        rendezvous.master_ip,
        rendezvous.master_port,
        layout.dp_master_rank,
    )
    return rendezvous


def _import_parallel_state_with_ascend_coordinator() -> Any:
    import vllm  # noqa: F401  - must precede any vllm_ascend import (circular import otherwise)

    try:
        import vllm_ascend.patch.worker  # noqa: F401  - installs GroupCoordinatorPatch (adds all_to_all)
    except ImportError as exc:
        msg = f"cannot import vllm_ascend.patch.worker ({exc}); the Ascend rollout needs vllm-ascend 0.9.1"
        raise DpEpGroupError(msg) from exc
    from vllm.distributed import parallel_state

    if not hasattr(parallel_state.GroupCoordinator, "all_to_all"):
        msg = (
            "vllm.distributed.parallel_state.GroupCoordinator has no all_to_all after importing "
            "vllm_ascend.patch.worker: vllm-ascend no longer patches it there, so the EP groups would lack the "
            "collective its MoE layers call. Check the installed vllm-ascend against 0.9.1."
        )
        raise DpEpGroupError(msg)
    return parallel_state


def check_vllm_groups(layout: RankGroups, parallel_state: Any) -> None:
    """Raise unless vLLM's TP, PP, DP and EP groups for this rank are exactly the planned ones."""
    found = {
        "TP": tuple(parallel_state.get_tp_group().ranks),
        "PP": tuple(parallel_state.get_pp_group().ranks),
        "DP": tuple(parallel_state.get_dp_group().ranks),
        "EP": tuple(parallel_state.get_ep_group().ranks),
    }
    wanted = {"TP": layout.tp_group, "PP": (layout.rank,), "DP": layout.dp_group, "EP": layout.ep_group}
    wrong = [
        f"{name}: vLLM has {found[name]}, planned {wanted[name]}" for name in wanted if found[name] != wanted[name]
    ]
    if wrong:
        msg = (
            f"rank {layout.rank}: vLLM's parallel groups differ from the planned layout (TP {layout.tp_size} x DP "
            f"{layout.dp_size}, EP {layout.ep_size}): {'; '.join(wrong)}. Either something built vLLM's groups "
            f"before the rollout with other sizes, or vLLM's rank layout changed (written for vLLM 0.9.1)."
        )
        raise DpEpGroupError(msg)


def exchange_rendezvous(layout: RankGroups, env: Mapping[str, str], *, group: Any) -> Rendezvous:
    """All-gather every rank's node IP and each DP master's reserved port; return this rank's DP rendezvous.

    Each DP master keeps its port bound until the gather completes, so masters sharing a host draw distinct ports.
    """
    import torch.distributed as dist

    ip_error: str | None = None
    try:
        ip: str | None = discover_node_ip(env, layout.rank)
    except NodeIpError as exc:
        ip, ip_error = None, str(exc)
    held, port_error = None, None
    if layout.rank in layout.dp_master_ranks:
        try:
            held = pick_free_port(reserved_port_ranges(env))
        except PortSelectionError as exc:
            port_error = str(exc)
    mine = (ip, ip_error, held.port if held else None, port_error)
    gathered: list[Any] = [None] * layout.world_size
    try:
        dist.all_gather_object(gathered, mine, group=group)
    finally:
        if held is not None:
            held.release()
    problems = []
    for rank in layout.dp_master_ranks:
        peer_ip, peer_ip_error, _, peer_port_error = gathered[rank]
        if peer_ip is None:
            problems.append(f"DP master rank {rank}: {peer_ip_error}")
        if peer_port_error is not None:
            problems.append(f"DP master rank {rank}: {peer_port_error}")
    if problems:
        msg = "cannot set up vLLM's DP rendezvous: " + " | ".join(problems)
        raise DpEpGroupError(msg)
    master_ip, _, master_port, _ = gathered[layout.dp_master_rank]
    return Rendezvous(master_ip, int(master_port))


def _check_vllm_envs(expected: Mapping[str, object]) -> None:
    """vLLM must read back what was exported (it would not if someone assigned ``vllm.envs.X`` directly)."""
    import vllm.envs as vllm_envs

    for name, value in expected.items():
        seen = getattr(vllm_envs, name)
        if str(seen) != str(value):
            msg = (
                f"vllm.envs.{name} reads {seen!r} although {name}={value!r} was exported: something assigned "
                f"vllm.envs.{name} directly, which shadows vLLM's lazy lookup of os.environ. Remove that assignment."
            )
            raise DpEpGroupError(msg)


def _local_rank(env: Mapping[str, str]) -> int:
    raw = env.get("LOCAL_RANK")
    try:
        return int(str(raw))
    except ValueError:
        msg = f"LOCAL_RANK={raw!r} is not an integer; verl's worker sets it for every rank"
        raise DpEpConfigError(msg) from None
