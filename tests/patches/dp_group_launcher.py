"""Run real torch.distributed (gloo) worlds on CPU and report how vLLM's parallel groups came out.

Usage: ``python dp_group_launcher.py '<json list of scenarios>'`` prints one line per scenario: the marker
``DP-RESULT`` and a JSON object (vLLM logs to stdout too). Each
scenario is ``{"name", "world", "tp", "mode", "env"}``; ``mode`` is ``"groups"`` (call ``init_dp_ep_groups`` with
backend gloo and report the groups), ``"wrapper"`` (apply the ``vllm_dp_ep_groups`` patch and construct verl's
``vLLMRollout``, expecting the configuration to be rejected before ``LLM()``) or ``"wrapper_groups"`` (the same
construction with a valid configuration: world size and rank come from the gloo group through the patched
``__init__``, which builds the groups and then hands over to the stock constructor, which fails on the stand-in
config; the groups are reported). In ``"wrapper_groups"`` verl's
``get_nccl_backend`` answers ``gloo``: HCCL is the one device boundary.

Why a separate process: importing vLLM and building its global groups changes module state for good, so it must
not happen inside the pytest process. vLLM is imported once here, then every rank is a ``fork`` of this process
(importing vLLM per rank would cost seconds and hundreds of MB each), joined over a TCP store on 127.0.0.1.
Like real ``torch_npu``, the privateuse1 device is renamed to ``npu`` so vLLM's ``npu:<local_rank>`` device
strings parse; nothing in vLLM is faked: groups use the real vllm-ascend ``GroupCoordinatorPatch`` and
``NPUCommunicator`` with gloo underneath.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
import traceback
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from r1_ascend.ports import unused_local_port

RANK_TIMEOUT_S = 90.0
RESULT_MARKER = "DP-RESULT"


def _prepare_parent() -> None:
    from r1_ascend.testing import npu_stub

    npu_stub.install()
    import torch

    _register_npu_device_type(torch)
    # Imported once here so forked ranks do not pay for it; vllm before vllm_ascend (circular import otherwise).
    import verl.workers.rollout.vllm_rollout.vllm_rollout_spmd  # noqa: F401
    import vllm.distributed.parallel_state  # noqa: F401
    import vllm_ascend.patch.worker  # noqa: F401


def _register_npu_device_type(torch: Any) -> None:
    """Name torch's privateuse1 device ``npu`` and register its hooks, as the real torch_npu does at import.

    vLLM builds ``torch.device("npu:<local_rank>")`` for every group on the Ascend platform, and
    ``torch.distributed.barrier`` asks torch for the accelerator; both need the device type to exist. The hooks
    report no device, so nothing is ever allocated on it (all collectives here run on gloo/CPU).
    """

    class _NoNpuHooks(torch._C._acc.PrivateUse1Hooks):
        def is_available(self) -> bool:
            return False

        def has_primary_context(self, dev_id: int) -> bool:
            return False

        def is_built(self) -> bool:
            return True

    torch.utils.rename_privateuse1_backend("npu")
    torch._C._acc.register_python_privateuseone_hook(_NoNpuHooks())


def _rank_main(rank: int, scenario: dict[str, Any], store_port: int, queue: Any) -> None:
    try:
        queue.put(_run_rank(rank, scenario, store_port))
    except BaseException as exc:  # report every failure to the parent instead of hanging it
        queue.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})


def _run_rank(rank: int, scenario: dict[str, Any], store_port: int) -> dict[str, Any]:
    import torch.distributed as dist

    world = scenario["world"]
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store_port),
        }
    )
    for key in ("VLLM_DP_SIZE", "VLLM_DP_RANK", "VLLM_DP_MASTER_IP", "VLLM_DP_MASTER_PORT"):
        os.environ.pop(key, None)
    os.environ.update(scenario.get("env", {}))
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{store_port}",
        world_size=world,
        rank=rank,
        timeout=timedelta(seconds=RANK_TIMEOUT_S),
    )
    if scenario["mode"] == "wrapper":
        return _run_wrapper(rank, scenario)
    if scenario["mode"] == "wrapper_groups":
        return _run_wrapper_groups(rank, scenario)
    from r1_ascend.patches.impl.dp_groups import init_dp_ep_groups
    from r1_ascend.patches.rules.dp_layout import plan_dp_ep_layout

    layout = plan_dp_ep_layout(world, rank, scenario["tp"], os.environ.get("VLLM_DP_SIZE"))
    from vllm.distributed import parallel_state as ps

    try:
        rendezvous = init_dp_ep_groups(layout, local_rank=rank, backend="gloo")
        return _report(rank, rendezvous, ps)
    finally:
        ps.destroy_model_parallel()  # releases the TP group's shared-memory broadcaster
        ps.destroy_distributed_environment()


def _report(rank: int, rendezvous: Any, ps: Any) -> dict[str, Any]:
    import vllm.envs as vllm_envs

    tp, pp, dp, ep = ps.get_tp_group(), ps.get_pp_group(), ps.get_dp_group(), ps.get_ep_group()
    names = ("VLLM_DP_SIZE", "VLLM_DP_RANK", "VLLM_DP_MASTER_IP", "VLLM_DP_MASTER_PORT")
    return {
        "rank": rank,
        "tp": tp.ranks,
        "pp": pp.ranks,
        "dp": dp.ranks,
        "ep": ep.ranks,
        "world_group": ps.get_world_group().ranks,
        "tp_rank": tp.rank_in_group,
        "dp_rank": dp.rank_in_group,
        "coordinator": type(ep).__name__,
        "has_all_to_all": hasattr(ep, "all_to_all"),
        "device_communicator": type(ep.device_communicator).__name__,
        "rendezvous": [rendezvous.master_ip, rendezvous.master_port] if rendezvous else None,
        "env": {name: os.environ.get(name) for name in names},
        "vllm_envs": {name: getattr(vllm_envs, name) for name in names},
        "ep_sum": _ep_all_reduce(ep, rank),
    }


def _ep_all_reduce(ep: Any, rank: int) -> int:
    """Sum ``rank + 1`` over the EP group's CPU group: proves the group is a working communicator of all ranks."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([rank + 1], dtype=torch.int64)
    dist.all_reduce(value, group=ep.cpu_group)
    return int(value.item())


def _run_wrapper(rank: int, scenario: dict[str, Any]) -> dict[str, Any]:
    from r1_ascend.patches import apply_one, patched_by, spec_by_name

    apply_one(spec_by_name("vllm_dp_ep_groups"))
    from verl.workers.rollout.vllm_rollout.vllm_rollout_spmd import vLLMRollout

    config = SimpleNamespace(**scenario["config"])
    try:
        vLLMRollout(config=config, model_config=None, device_mesh=None)
    except Exception as exc:
        return {
            "rank": rank,
            "raised": type(exc).__name__,
            "message": str(exc),
            "patched": patched_by(vLLMRollout.__init__),
        }
    return {"rank": rank, "raised": None, "patched": patched_by(vLLMRollout.__init__)}


def _run_wrapper_groups(rank: int, scenario: dict[str, Any]) -> dict[str, Any]:
    import verl.utils.device as verl_device
    from vllm.distributed import parallel_state as ps

    from r1_ascend.patches import apply_one, patched_by, spec_by_name

    verl_device.get_nccl_backend = lambda: "gloo"
    apply_one(spec_by_name("vllm_dp_ep_groups"))
    from verl.workers.rollout.vllm_rollout.vllm_rollout_spmd import vLLMRollout

    try:
        vLLMRollout(config=SimpleNamespace(**scenario["config"]), model_config=None, device_mesh=None)
        raised = None
    except Exception as exc:
        raised = f"{type(exc).__name__}: {exc}"
    try:
        built = ps.model_parallel_is_initialized()
        report = _report(rank, None, ps) if built else {"rank": rank}
        names = ("VLLM_DP_SIZE", "VLLM_DP_RANK")
        report.update(
            built=built,
            raised=raised,
            patched=patched_by(vLLMRollout.__init__),
            env={name: os.environ.get(name) for name in names},
        )
        return report
    finally:
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()


def run_scenario(scenario: dict[str, Any]) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    port = unused_local_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, scenario, port, queue), daemon=True) for r in range(scenario["world"])
    ]
    started = time.monotonic()
    for proc in procs:
        proc.start()
    results: list[dict[str, Any]] = []
    deadline = started + RANK_TIMEOUT_S + 30
    try:
        while len(results) < len(procs):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                results.append(queue.get(timeout=min(remaining, 5.0)))
            except Exception:  # queue.Empty: check whether a rank died without reporting
                if all(not p.is_alive() for p in procs) and queue.empty():
                    break
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return {
        "name": scenario["name"],
        "seconds": round(time.monotonic() - started, 2),
        "complete": len(results) == len(procs),
        "ranks": sorted(results, key=lambda r: r["rank"]),
    }


def main(argv: list[str]) -> int:
    scenarios = json.loads(argv[0])
    _prepare_parent()
    for scenario in scenarios:
        print(RESULT_MARKER, json.dumps(run_scenario(scenario)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
