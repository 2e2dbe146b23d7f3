"""verl ``global_step_N`` directories written with the real formats: torch's DCP writer, ``torch.save``, and the
``metadata.json`` megatron-core writes last, for the checkpoint rule and patch tests."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

TRACKER = "latest_checkpointed_iteration.txt"


def write_dist_ckpt(dist: Path, seed: int = 0) -> None:
    """A dist checkpoint as megatron-core's torch_dist strategy leaves it: shards + .metadata, common.pt, then
    metadata.json."""
    dist.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    state = {"weight": torch.randn(64, 64, generator=generator), "bias": torch.randn(64, generator=generator)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ... single process": intended here
        dcp.save(state, checkpoint_id=dist, no_dist=True)
    torch.save({"iteration": seed}, dist / "common.pt")
    (dist / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}))


def write_step(root: Path, step: int, *, track: bool = True) -> Path:
    """A complete ``global_step_<step>`` as verl's trainer leaves it (actor dist checkpoint, data.pt, tracker)."""
    path = root / f"global_step_{step}"
    write_dist_ckpt(path / "actor" / "dist_ckpt", seed=step)
    torch.save({"batches_seen": step}, path / "data.pt")
    if track:
        (root / TRACKER).write_text(str(step))
    return path


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def shard(step_dir: Path) -> Path:
    return next((step_dir / "actor" / "dist_ckpt").glob("*.distcp"))
