"""Worlds of ``test_weight_sync_check.py``: the weight-sync check (``verl_weight_sync_check``) on the real model path,
healthy and with every weight / layout fault of ``r1_ascend.rehearse.rollout_faults`` planted where its class lives.

``one MODEL_DIR OUT_JSON SEED...`` — one process, the guard's loop (``guard_calibration.Loop``: megatron-core's
actor from the converted checkpoint, verl's ``per_tensor_generator`` export, the CPU rollout engine through vLLM's
DeepSeek-V3 ``load_weights``): per seed a healthy sync, a stand-in for a training step (every actor parameter and
expert bias moved by a seeded perturbation), then each fault that one rank can carry planted in the next sync (from
a snapshot of the loop after the healthy one), and a healthy sync of the moved weights last.

``world MODEL_DIR WORLD RANK PORT OUT_JSON ACTOR_PP ACTOR_EP ROLLOUT_DP SEED...`` — one rank of a world: the actor
at PP x EP, vLLM's DeepSeek-V3 class at rollout TP = WORLD / ROLLOUT_DP with EP over every rank (the overlay's
vllm_dp_ep_groups builds the groups at DP > 1), the MLA matrices derived by vLLM's own ``AscendMLAImpl`` objects
(their TP share of the heads, as on the NPU); each fault that needs this world planted after a healthy sync.

Writes ``{seed: {"healthy": [...messages or None], "faults": {name: message or None}}}`` and the check's timings.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch

#: Faults each world plants (the one-process world: every fault one rank can carry).
WORLD_FAULTS = ("stale-stage", "ep-gather-shifted", "expert-wrong-rank", "tp-shards-swapped")


def perturb(actor: list[Any], seed: int) -> None:
    """A stand-in for one training step: every parameter and the routers' expert bias moved by seeded noise."""
    generator = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for chunk in actor:
            tensors = [p for p in chunk.parameters()] + [
                b for n, b in chunk.named_buffers() if n.endswith("router.expert_bias")
            ]
            for tensor in tensors:
                scale = 0.02 * (tensor.float().abs().mean() + 1e-3)  # norms of ones move by more than bf16's step
                noise = torch.randn(tensor.shape, generator=generator) * scale
                tensor.add_(noise.to(tensor.dtype))


def one(model_dir: Path, out: Path, seeds: list[int]) -> None:
    from r1_ascend.cpu import mcore as mcore_cpu
    from r1_ascend.patches.prelude import apply_once

    apply_once()
    mcore_cpu.install()
    from r1_ascend.rehearse import guard_calibration as gc
    from r1_ascend.rehearse import rollout_faults

    names = [n for n, f in rollout_faults.FAULTS.items() if f.needs is None and f.where != "config"]
    report: dict[str, Any] = {"timings": []}
    # one build: the checkpoint fixes the actor's weights whatever the setup's seed; each seed moves them its way
    loop = gc.Loop.build(gc.Setup(model_dir / "hf-bf16", model_dir / "mcore", seed=0))
    for seed in seeds:
        first = loop.export()
        healthy = [rollout_faults.sync(loop.engine, first, None, None, loop.prompts)]
        perturb(loop.actor, seed)
        snapshot = gc.LoopSnapshot.take(loop)
        faults = {}
        for name in names:
            start = time.perf_counter()
            second = loop.export()
            faults[name] = rollout_faults.sync(loop.engine, second, first, rollout_faults.get(name), loop.prompts)
            report["timings"].append(time.perf_counter() - start)
            snapshot.restore(loop)
        healthy.append(rollout_faults.sync(loop.engine, loop.export(), first, None, loop.prompts))
        report[str(seed)] = {"healthy": healthy, "faults": faults}
    out.write_text(json.dumps(report), encoding="utf-8")


def world(args: list[str]) -> None:
    began = time.perf_counter()
    model_dir, size, rank, port, out = Path(args[0]), int(args[1]), int(args[2]), args[3], Path(args[4])
    actor_pp, actor_ep, rollout_dp = int(args[5]), int(args[6]), int(args[7])
    seeds = [int(s) for s in args[8:]]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, LOCAL_RANK=str(rank), RANK=str(rank))
    os.environ["WORLD_SIZE"] = str(size)
    from megatron.core import parallel_state
    from transformers import AutoConfig
    from verl.utils.model import load_mcore_dist_weights

    from r1_ascend.cpu import mcore as mcore_cpu
    from r1_ascend.cpu import vllm_deepseek
    from r1_ascend.cpu.engine import VLLMLoader
    from r1_ascend.patches import WeightSyncError
    from r1_ascend.patches.impl import weight_check
    from r1_ascend.patches.impl.rollout_memory import recompute_mla_matrices
    from r1_ascend.patches.prelude import apply_once
    from r1_ascend.rehearse import rollout_faults, weight_faults
    from r1_ascend.rehearse.config import CPU_TRANSFORMER_OVERRIDES
    from r1_ascend.weights import model_check

    apply_once()
    mcore_cpu.install()
    import verl.workers.megatron_workers  # noqa: F401 - the export wrapper waits for both modules holding the export

    vllm_deepseek.name_npu_backend()
    torch.distributed.init_process_group(
        vllm_deepseek.GROUP_BACKEND, init_method=f"tcp://127.0.0.1:{port}", world_size=size, rank=rank
    )
    if rollout_dp > 1:
        from r1_ascend.patches.impl.dp_groups import init_dp_ep_groups
        from r1_ascend.patches.rules.dp_layout import plan_dp_ep_layout

        layout = plan_dp_ep_layout(size, rank, size // rollout_dp)
        init_dp_ep_groups(layout, local_rank=rank, backend=vllm_deepseek.GROUP_BACKEND)
    parallel_state.initialize_model_parallel(1, actor_pp, expert_model_parallel_size=actor_ep)
    hf_config = AutoConfig.from_pretrained(str(model_dir / "hf-bf16"))
    overrides = dict(CPU_TRANSFORMER_OVERRIDES)
    if actor_pp > 1:
        overrides["num_layers_in_first_pipeline_stage"] = 2
    with contextlib.redirect_stdout(io.StringIO()):
        actor, tf_config = model_check.build_actor(hf_config, torch.bfloat16, overrides, wrap_with_ddp=False)
    load_mcore_dist_weights(actor, str(model_dir / "mcore"), is_value_model=False)
    config = vllm_deepseek.vllm_config(
        model_dir / "hf-bf16", torch.bfloat16, tensor_parallel_size=size // rollout_dp, expert_parallel=True
    )
    vllm_deepseek.init_groups(config, size, rank, f"tcp://127.0.0.1:{port}")
    model = vllm_deepseek.build(config)
    context = {f"{name}.attn": module.mla_attn for name, module in model.named_modules() if hasattr(module, "mla_attn")}
    impls = [attention.impl for attention in context.values()]

    # what a fault's plant reads of the rollout engine: its config and the vLLM model it loads through
    engine = types.SimpleNamespace(
        hf_config=config.model_config.hf_config, model=types.SimpleNamespace(vllm_loader=VLLMLoader(model))
    )
    print(f"rank {rank}: built in {time.perf_counter() - began:.1f} s", flush=True)

    stale_stage = weight_faults.StalePipelineStage() if actor_pp > 1 else None

    def export(planted: bool = False) -> dict[str, torch.Tensor]:
        hook = stale_stage.export(planted) if stale_stage is not None else contextlib.nullcontext()
        with hook, contextlib.redirect_stdout(io.StringIO()):
            return {
                n: t.detach().clone()
                for n, t in model_check.export_weights(actor, hf_config, tf_config, torch.bfloat16).items()
            }

    def sync(weights: dict[str, torch.Tensor], fault: Any = None, previous: Any = None) -> str | None:
        # stale-stage was planted in the export (the stale pipeline stage's broadcast); the sync carries its stream
        planted = fault is not None and fault.name != "stale-stage"
        planned = fault.plant(engine, weights, previous, []) if planted else rollout_faults.Sync(weights)
        engine.model.vllm_loader.change = planned.in_loader
        try:
            engine.model.vllm_loader.load(list(planned.weights.items()))
        finally:
            engine.model.vllm_loader.change = None
        recompute_mla_matrices(impls, torch.bfloat16)
        try:
            weight_check.verify(context)
        except WeightSyncError as stopped:
            return str(stopped)
        return None

    applicable = []
    for name in WORLD_FAULTS:
        needs = rollout_faults.get(name).needs or ""
        if ("actor PP" in needs and actor_pp < 2) or ("actor EP" in needs and actor_ep < 2):
            continue
        if "rollout TP" in needs and size // rollout_dp < 2:
            continue
        applicable.append(name)
    report: dict[str, Any] = {}
    for seed in seeds:
        first = export()  # recorded by the stale stage's broadcast: what the planted sync replays
        healthy = [sync(first)]
        perturb(actor, seed)
        faults = {}
        for name in applicable:  # stale-stage first: it replays the broadcasts of the export just before
            faults[name] = sync(export(planted=name == "stale-stage"), rollout_faults.get(name), first)
        healthy.append(sync(export()))
        report[str(seed)] = {"healthy": healthy, "faults": faults}
    Path(out).write_text(json.dumps({"seeds": report, "faults": applicable}), encoding="utf-8")


if __name__ == "__main__":
    from r1_ascend.testing import npu_stub

    npu_stub.install()
    if sys.argv[1] == "one":
        one(Path(sys.argv[2]), Path(sys.argv[3]), [int(s) for s in sys.argv[4:]])
    else:
        world(sys.argv[2:])
