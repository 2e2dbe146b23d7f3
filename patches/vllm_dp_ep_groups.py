"""Build vLLM's DP and EP groups over all rollout ranks: DP = world / rollout TP, EP = world.

Target:
verl.workers.rollout.vllm_rollout.vllm_rollout_spmd.vLLMRollout.__init__ (wrapped: the groups are built first,
then the stock constructor runs and creates ``LLM()``). Subclasses that call ``super().__init__`` (the
``vllm_rollout_offload`` rollout) go through the wrapper too. Inside, it calls the stock
``vllm.distributed.parallel_state.init_distributed_environment`` and ``initialize_model_parallel`` and writes
``VLLM_DP_SIZE``, ``VLLM_DP_RANK``, ``VLLM_DP_MASTER_IP``, ``VLLM_DP_MASTER_PORT`` to ``os.environ``.

Upstream:
verl 0.6.1, vllm 0.9.1, vllm-ascend 0.9.1.

Process:
worker (the Ray WorkerDict process that holds actor, reference and rollout).

Why:
verl builds the vLLM engine with ``distributed_executor_backend="external_launcher"``, which gives every TP group
its own engine: vLLM sees neither a DP size nor the other ranks, so DeepSeek-V3's experts are only sharded over
TP and the MoE collectives of vllm-ascend fail or hang ("assert self.cpu_group is not None",
vllm-project/vllm-ascend#1154). The predecessors built the groups by hand but trusted a hard-coded
``VLLM_DP_SIZE=128`` (a different node count silently changes the layout), found the node IP by a UDP connect
to 8.8.8.8 or by parsing ``ifconfig`` (wrong NIC, air-gapped clusters), and took ``MASTER_PORT + 1 + k`` as DP
port with no free-port check (collisions with HCCL/Ray ports).

How:
Before the stock ``__init__`` runs, ``impl.dp_groups.setup_rollout_groups`` (1) requires verl's
``rollout.data_parallel_size == 1`` and ``pipeline_model_parallel_size == 1``, (2) plans the layout from the
real torch.distributed world (``rules.dp_layout.plan_dp_ep_layout``: DP = world / TP, error if not divisible or if an
exported ``VLLM_DP_SIZE`` disagrees), (3) exports ``VLLM_DP_SIZE``/``VLLM_DP_RANK``, imports ``vllm`` then
``vllm_ascend.patch.worker`` (``GroupCoordinatorPatch`` with ``all_to_all``), calls
``init_distributed_environment(world, rank, "env://", LOCAL_RANK, hccl)`` and ``initialize_model_parallel(tp)``
and checks the TP/PP/DP/EP members against the plan, (4) all-gathers each rank's IPv4 address (NIC named by
``HCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` via ioctl; ``MASTER_ADDR`` only for rank 0 or a loopback
rendezvous) and, from each DP group's first rank, a kernel-chosen free port outside the job's reserved ports,
held bound until all masters picked, and exports ``VLLM_DP_MASTER_IP``/``VLLM_DP_MASTER_PORT``. ``LLM()`` then
finds the groups built (``ensure_model_parallel_initialized`` only checks sizes). When DP is 1 (world = rollout TP)
no group is built: only ``VLLM_DP_SIZE=1``/``VLLM_DP_RANK=0`` are exported and ``LLM()`` proceeds as stock.
Details in docs/patches.md.

Upstream fix:
none — verl 0.6.1's SPMD rollout has no notion of vLLM DP under ``external_launcher``; verl removed the SPMD
rollout (volcengine/verl#4411) in favour of the async server rollout, which sets DP/EP itself.

Remove when:
the rollout no longer goes through verl's SPMD ``vLLMRollout`` (verl >= 0.7.0 contains volcengine/verl#4411,
which deleted it); then delete this module, ``rules/dp_layout.py``, ``impl/dp_net.py``, ``impl/dp_groups.py``, the
registry entry and tests/patches/test_vllm_dp_ep_groups.py.

Disable:
R1_ASCEND_DISABLE=vllm_dp_ep_groups leaves the stock constructor alone: each TP group becomes its own vLLM
instance with DP 1 (or whatever an exported ``VLLM_DP_SIZE`` makes vLLM build, unchecked), so EP no longer spans
all ranks; DeepSeek-V3 at TP 2 will not fit or will hang in the MoE collectives. Useful only for dense models.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ._install import install_on_import
from ._registry import PatchSpec, spec_by_module

#: This patch's registry name (the R1_ASCEND_DISABLE token).
NAME = spec_by_module(__name__).name


def apply(spec: PatchSpec) -> None:
    install_on_import(spec.name, spec.target("vLLMRollout.__init__"), _build_init)


def _build_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: Any, config: Any, model_config: Any, device_mesh: Any) -> None:
        from .impl.dp_groups import setup_rollout_groups

        setup_rollout_groups(config)
        original(self, config, model_config, device_mesh)

    return __init__
