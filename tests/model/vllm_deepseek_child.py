"""One rank of ``test_vllm_deepseek_load.py``: build vLLM's DeepSeek-V3 class on the CPU, load the tiny checkpoint's
HF tensors through its ``load_weights`` and report what each parameter holds against the source tensors, and what
the weight-sync check (``verl_weight_sync_check``, its load check: no actor here) says of each load.

Usage: python vllm_deepseek_child.py MODEL_DIR WORLD RANK PORT OUT_JSON [DP]
One build (as vLLM's loader leaves the model at start-up), then one load per case: ``unpatched`` (vLLM's
``load_weights`` without verl's MoE loader patch), ``healthy``, and the layout faults the rehearsal plants in vLLM's
loader (``r1_ascend.rehearse.rollout_faults``), loaded as the rollout engine's sync loads (``VLLMLoader``): ``w13-swap``
(every expert's gate and up exchanged in ``w13``), ``expert-transposed-load`` (expert 0's down_proj handed over
transposed, laid back into its shape) and ``wrong-ep-rank`` (each MoE layer's expert map shifted by one while the
weights load: experts land in another rank's or slot's place, and are read back through the layer's own map, as its
kernels route), ``moe-loader-dropped`` (the experts' ``weight_loader`` missing and their tensors skipped), and where
the world has them ``tp-shards-swapped`` (TP >= 2) and ``expert-wrong-rank`` (EP >= 2). After each load vLLM's own
``AscendMLAImpl`` objects re-derive the MLA matrices (their TP share of the heads, as on the NPU) and the check
compares every engine tensor with what it received. Seeds 0-4 of every fault: test_weight_sync_check.py.
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

from r1_ascend.testing import npu_stub

npu_stub.install()

from r1_ascend.patches.prelude import apply_once  # noqa: E402

apply_once()  # the weight-sync check wraps vLLM's load_weights, as in every rollout worker

import torch  # noqa: E402

from r1_ascend.cpu import vllm_deepseek  # noqa: E402
from r1_ascend.cpu.engine import VLLMLoader, WeightSyncError  # noqa: E402
from r1_ascend.rehearse import rollout_faults  # noqa: E402
from r1_ascend.weights.tiny import bf16_state_dict  # noqa: E402

#: ``unpatched`` first (vLLM's own load_weights, verl's MoE loader patch not yet applied), then the rollout engine's
#: sync (``VLLMLoader``): healthy, and the layout faults the rehearsal plants in vLLM's loader
CASES = ("unpatched", "healthy", "w13-swap", "expert-transposed-load", "wrong-ep-rank", "moe-loader-dropped")
#: Faults planted too where the world has what they need (``RolloutFault.needs``).
WIDER = ("tp-shards-swapped", "expert-wrong-rank", "kv-b-proj-halves")


def _engine(model: torch.nn.Module, config: dict) -> types.SimpleNamespace:
    """What a fault's plant reads of the rollout engine: its config and the vLLM model it loads through."""
    return types.SimpleNamespace(
        hf_config=types.SimpleNamespace(**config), model=types.SimpleNamespace(vllm_loader=VLLMLoader(model))
    )


def checked(model: torch.nn.Module) -> str | None:
    """The MLA matrices re-derived by vLLM's own MLA objects, then the weight-sync check's verdict on the load."""
    from r1_ascend.patches import WeightSyncError as CheckError
    from r1_ascend.patches.impl import weight_check
    from r1_ascend.patches.impl.rollout_memory import recompute_mla_matrices

    context = {f"{name}.attn": m.mla_attn for name, m in model.named_modules() if hasattr(m, "mla_attn")}
    recompute_mla_matrices([attention.impl for attention in context.values()], torch.bfloat16)
    try:
        weight_check.verify(context)
    except CheckError as error:
        return str(error)
    return None


def applicable(name: str, tp: int, ep: int) -> bool:
    needs = rollout_faults.get(name).needs or ""
    return not (("rollout TP" in needs and tp < 2) or (needs == "EP >= 2" and ep < 2))


def load_case(model: torch.nn.Module, source: dict[str, torch.Tensor], case: str, config: dict) -> dict[str, object]:
    report: dict[str, object] = {}
    if case == "unpatched":
        try:
            model.load_weights(iter(source.items()))
        except AttributeError as error:
            report["load_error"] = f"{type(error).__name__}: {error}"
        return report
    change = None
    if case != "healthy":
        planned = rollout_faults.get(case).plant(_engine(model, config), source, source, [])
        assert planned.in_loader is not None, case
        change = planned.in_loader
    loader = VLLMLoader(model, change=change)
    try:
        tensors = dict(loader.load(list(source.items())))
    except WeightSyncError as error:
        report["load_error"] = str(error)
        return report
    report["unwritten"] = loader.unwritten
    report["check"] = checked(model)
    report["experts"] = sorted(name for name in tensors if ".experts." in name)
    report["differ"] = sorted(
        name for name, tensor in tensors.items() if not torch.equal(tensor, source[name].to(tensor.dtype))
    )
    report["missing"] = sorted(name for name in source if name not in tensors)
    report["held"] = {
        name: [expert for expert, slot in enumerate(module.expert_map.tolist()) if slot >= 0]
        for name, module in model.named_modules()
        if getattr(module, "expert_map", None) is not None
    }
    return report


def overlay_groups(world: int, rank: int, port: str, dp: int) -> dict[str, object]:
    """Rollout DP > 1 as on the cluster: torch.distributed first (verl's worker), then the overlay's
    ``vllm_dp_ep_groups`` builds vLLM's TP, DP and EP groups and exports ``VLLM_DP_*``, which the engine's
    ``ParallelConfig`` reads (vLLM's offline SPMD path)."""
    from r1_ascend.patches.impl.dp_groups import init_dp_ep_groups
    from r1_ascend.patches.rules.dp_layout import plan_dp_ep_layout

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, LOCAL_RANK=str(rank))
    vllm_deepseek.name_npu_backend()
    init = f"tcp://127.0.0.1:{port}"
    torch.distributed.init_process_group(vllm_deepseek.GROUP_BACKEND, init_method=init, world_size=world, rank=rank)
    layout = plan_dp_ep_layout(world, rank, world // dp)
    init_dp_ep_groups(layout, local_rank=rank, backend=vllm_deepseek.GROUP_BACKEND)
    return {"tp_group": list(layout.tp_group), "dp_group": list(layout.dp_group), "ep_group": list(layout.ep_group)}


def main() -> None:
    model_dir, world, rank, port, out = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    dp = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    planned = overlay_groups(world, rank, port, dp) if dp > 1 else {}
    tp = world // dp
    config = vllm_deepseek.vllm_config(model_dir, torch.bfloat16, tensor_parallel_size=tp, expert_parallel=world > 1)
    vllm_deepseek.init_groups(config, world, rank, f"tcp://127.0.0.1:{port}")
    model = vllm_deepseek.build(config)
    from vllm.distributed import parallel_state

    groups = {
        "tp": parallel_state.get_tp_group().ranks,
        "dp": parallel_state.get_dp_group().ranks,
        "ep": parallel_state.get_ep_group().ranks,
        "planned": planned,
        "data_parallel_size": config.parallel_config.data_parallel_size,
        "moe_ep_size": [m.moe_parallel_config.ep_size for m in model.modules() if hasattr(m, "moe_parallel_config")],
    }
    hf = json.loads((model_dir / "config.json").read_text())
    source = bf16_state_dict(hf, 0)
    report: dict[str, object] = {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "dtypes": {name: str(param.dtype) for name, param in model.named_parameters()},
        "groups": groups,
    }
    ep = max(groups["moe_ep_size"])
    wider = [name for name in WIDER if applicable(name, tp, ep)]
    for case in (*CASES, *wider):
        report[case] = load_case(model, source, case, hf)
    report["wider"] = wider
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main()
