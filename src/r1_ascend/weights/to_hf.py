"""Megatron-core dist checkpoint (as verl saves it during training) -> HF BF16 safetensors, streaming and resumable.

verl 0.6.1's Megatron checkpoint manager saves a training checkpoint as ``<dir>/global_step_<N>/actor/`` with
``dist_ckpt/`` (a ``torch_dist`` checkpoint of ``{"model": GPTModel.sharded_state_dict(), "optimizer": ...,
"rng_state": ...}``) and ``huggingface/`` (the HF config, generation config and tokenizer, written by rank 0). The
model keys are the same global keys ``to-megatron`` writes, so the inverse mapping is the same plan read backwards.

Each output shard reads only the regions of the dist tensors it needs (for MoE layers, single experts) through
PyTorch DCP's reader, whatever TP/PP/EP the training saved at (``dcp_regions``), so memory stays at one output
shard. Shards are written under a temporary name and renamed when complete; a rerun skips finished shards. The
architecture check runs on the written shards before the index, which marks the directory complete, is written.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from r1_ascend.atomic import atomic_open, atomic_write_json, remove_stale_temps
from r1_ascend.parallel import Layout
from r1_ascend.patches.rules.checkpoints import dist_ckpt_problems
from r1_ascend.patches.rules.mcore_mapping import hf_sources
from r1_ascend.weights.ckpt_root import CheckpointRoot, find_root
from r1_ascend.weights.dcp_regions import read_regions
from r1_ascend.weights.dequant import ShardPlan, check_output_inventory, shard_is_complete
from r1_ascend.weights.errors import CheckpointFormatError
from r1_ascend.weights.inventory import checkpoint_specs, expected_tensors
from r1_ascend.weights.mcore_plan import build_plan
from r1_ascend.weights.outdir import copy_side_files, fingerprint, prepare_output
from r1_ascend.weights.progress import Progress
from r1_ascend.weights.safetensors_io import PT_METADATA, StreamingWriter, ordered_layout
from r1_ascend.weights.source import INDEX_NAME, load_json
from r1_ascend.weights.workers import worker_pool

log = logging.getLogger(__name__)

MANIFEST = ".r1-ascend-to-hf.json"
DEFAULT_SHARD_BYTES = 2_000_000_000
_NEVER_COPIED = {INDEX_NAME}
_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def locate(path: Path, hf_dir: Path | None = None) -> CheckpointRoot:
    """The training checkpoint at ``path`` (``global_step_N``, its ``actor/``, its ``dist_ckpt/`` or any dist
    checkpoint), with ``hf_dir`` taking the place of the HF directory it names, if given."""
    found = find_root(path)
    if found.dist_ckpt is None:
        msg = (
            f"{path} is an HF directory, not a Megatron checkpoint: to-hf reads verl's global_step_N (or its actor/ "
            "or dist_ckpt/) or a dist checkpoint directory; the HF model needs no conversion."
        )
        raise CheckpointFormatError(msg)
    problems = dist_ckpt_problems(found.dist_ckpt)
    if problems:
        msg = f"{path} is not a complete checkpoint ({found.dist_ckpt}: {'; '.join(problems)}); export another one."
        raise CheckpointFormatError(msg)
    if hf_dir is not None:
        found = replace(found, hf_dir=Path(hf_dir).expanduser().resolve())
    return found


def plan_output(cfg: dict[str, Any], max_shard_bytes: int) -> list[ShardPlan]:
    """HF names in the upstream order, cut into shards of at most ``max_shard_bytes`` (one tensor may exceed it)."""
    inventory = expected_tensors(cfg, fp8=False, mtp=False)
    groups: list[list[tuple[str, str, tuple[int, ...]]]] = [[]]
    used = 0
    for spec in checkpoint_specs(cfg, mtp=False):
        dtype, shape = inventory[spec.name]
        size = torch.Size(shape).numel() * (4 if dtype == "F32" else 2)
        if groups[-1] and used + size > max_shard_bytes:
            groups.append([])
            used = 0
        groups[-1].append((spec.name, dtype, shape))
        used += size
    n = len(groups)
    plans = []
    for i, group in enumerate(groups):
        layout = ordered_layout(group)
        plans.append(ShardPlan(f"model-{i + 1:05d}-of-{n:05d}.safetensors", layout, sum(e.nbytes for e in layout)))
    return plans


def _load_shard(dist_ckpt: Path, cfg: dict[str, Any], names: list[str]) -> dict[str, torch.Tensor]:
    """The HF tensors ``names``, each read as its region of the dist tensor that holds it."""
    sources = hf_sources(cfg)
    inventory = expected_tensors(cfg, fp8=False, mtp=False)
    out: dict[str, torch.Tensor] = {}
    regions: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}
    for name in names:
        source = sources[name]
        dtype, shape = inventory[name]
        dest = torch.empty(shape, dtype=_DTYPES[source.tensor.dtype])
        if dtype != {"bfloat16": "BF16", "float32": "F32"}[source.tensor.dtype]:
            msg = f"internal error: {name} is {dtype} in the inventory but {source.tensor.dtype} in the Megatron plan"
            raise RuntimeError(msg)
        out[name] = dest
        # the HF tensor's box of the dist tensor (TP/PP/EP chunks are resolved by the reader)
        regions[(source.tensor.key, source.offset)] = dest.view(source.box_shape)
    read_regions(dist_ckpt, regions)
    return out


def write_shard(dist_ckpt: str, dst: str, cfg: dict[str, Any], plan: ShardPlan) -> int:
    """Load one output shard's tensors and write the shard atomically; returns its size."""
    tensors = _load_shard(Path(dist_ckpt), cfg, [e.name for e in plan.layout])
    with atomic_open(Path(dst) / plan.file) as f:
        writer = StreamingWriter(f, plan.layout, PT_METADATA)
        for entry in plan.layout:
            writer.write(entry.name, tensors.pop(entry.name).contiguous())
        writer.close_check()
    return plan.file_size


@dataclass
class ToHFResult:
    out_dir: Path
    shards_written: int
    shards_skipped: int
    bytes_written: int
    seconds: float


def convert_megatron_to_hf(
    src: str | Path,
    dst: str | Path,
    *,
    hf_dir: str | Path | None = None,
    workers: int = 1,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    overwrite: bool = False,
    progress: bool = True,
) -> ToHFResult:
    """A verl Megatron training checkpoint (``global_step_N[/actor]`` or its ``dist_ckpt``) -> HF BF16 directory
    with the checkpoint's own ``config.json`` and tokenizer files (from ``huggingface/``, or ``hf_dir``)."""
    start = time.monotonic()
    where = locate(Path(src), Path(hf_dir) if hf_dir else None)
    if where.hf_dir is None or not (where.hf_dir / "config.json").is_file():
        found = f"{where.hf_dir}/config.json not found" if where.hf_dir else f"no HF config is known for {src}"
        msg = (
            f"{found}: verl writes the HF config and tokenizer to the checkpoint's huggingface/ directory, "
            "to-megatron records the HF directory it converted from. Pass --hf-dir with the model directory the "
            "checkpoint came from."
        )
        raise CheckpointFormatError(msg)
    cfg = load_json(where.hf_dir / "config.json")
    from r1_ascend.weights.mcore_verify import check_megatron_inventory

    check_megatron_inventory(where.dist_ckpt, build_plan(cfg, Layout(), extra_state=False), allow_extra=True)
    plans = plan_output(cfg, max_shard_bytes)
    given_dst = Path(dst)
    dst = given_dst.expanduser().resolve()
    manifest = {
        "step": "to-hf",
        "source": str(where.dist_ckpt),
        "source_metadata_size": (where.dist_ckpt / ".metadata").stat().st_size,
        "config_sha256": fingerprint(where.hf_dir / "config.json"),
        "max_shard_bytes": max_shard_bytes,
    }
    resuming = prepare_output(
        dst, MANIFEST, manifest, overwrite=overwrite, source=Path(src), root=where.root, shown_out=given_dst
    )
    if resuming:
        remove_stale_temps(dst)
    todo = [p for p in plans if not shard_is_complete(dst / p.file, p)]
    bar = Progress("to-hf", sum(p.input_bytes for p in plans), enabled=progress)
    bar.skip(sum(p.input_bytes for p in plans) - sum(p.input_bytes for p in todo))
    written = 0
    if workers <= 1 or len(todo) <= 1:
        for p in todo:
            written += write_shard(str(where.dist_ckpt), str(dst), cfg, p)
            bar.add(p.input_bytes)
    else:
        with worker_pool(workers) as pool:
            futures = {pool.submit(write_shard, str(where.dist_ckpt), str(dst), cfg, p): p for p in todo}
            for fut, p in futures.items():
                written += fut.result()
                bar.add(p.input_bytes)
    check_output_inventory(dst, [p.file for p in plans], cfg, mtp=False)
    copy_side_files(where.hf_dir, dst, skip=_NEVER_COPIED)
    weight_map = {e.name: p.file for p in plans for e in p.layout}
    index = {
        "metadata": {"total_size": sum(p.input_bytes for p in plans)},
        "weight_map": dict(sorted(weight_map.items())),
    }
    atomic_write_json(dst / INDEX_NAME, index)
    bar.finish()
    return ToHFResult(dst, len(todo), len(plans) - len(todo), written, time.monotonic() - start)
