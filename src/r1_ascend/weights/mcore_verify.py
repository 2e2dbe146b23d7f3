"""Check a written dist checkpoint by loading it through megatron-core's own ``dist_checkpointing.load``.

The sharded state dict is built the way the model's ``sharded_state_dict()`` builds it (``ShardedTensor`` TP
offsets, the expert axis prepended, mcore's own SwiGLU factory for fc1, ``ShardedObject`` extra states) for any
(TP rank, EP rank) of any layout, loaded on CPU in a one-process gloo group, and compared bit for bit with the HF
source. ``megatron_to_hf`` loads full tensors and splits them back into HF names (the round trip).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from r1_ascend.parallel import Layout
from r1_ascend.weights.errors import CheckpointFormatError
from r1_ascend.weights.mcore_plan import DistTensor, MegatronPlan, build_plan, check_layout
from r1_ascend.weights.safetensors_io import PT_METADATA
from r1_ascend.weights.source import INDEX_NAME, HFCheckpoint

log = logging.getLogger(__name__)


@contextlib.contextmanager
def process_group(rank: int = 0, world_size: int = 1, store_path: str | None = None) -> Iterator[None]:
    """A gloo group on CPU (dist_checkpointing.load uses collectives even on one rank)."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory() as tmp:
        store = dist.FileStore(store_path or os.path.join(tmp, "store"), world_size)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
        try:
            yield
        finally:
            dist.destroy_process_group()


def local_sharded(
    t: DistTensor, layout: Layout, tp_rank: int, ep_rank: int, experts: set[int] | None = None
) -> dict[str, Any]:
    """The mcore sharded entries the model at (tp_rank, ep_rank) would request for ``t`` (only the local experts
    in ``experts`` when given)."""
    from megatron.core.dist_checkpointing import ShardedTensor
    from megatron.core.transformer.mlp import apply_swiglu_sharded_factory

    tp = layout.tp
    # (PP, TP, DP) replica ids as mcore sets them: a TP-split tensor has TP in its offsets, a TP-replicated one in
    # its replica id; EP ranks are data-parallel replicas of every non-expert weight.
    if t.kind == "replicated":
        rid = (0, tp_rank, ep_rank)
        return {
            t.key: ShardedTensor.from_rank_offsets(t.key, torch.empty(t.global_shape, dtype=t.dtype), replica_id=rid)
        }
    rid = (0, 0, ep_rank)
    if t.kind in ("rows", "cols", "swiglu"):
        axis = 1 if t.kind == "cols" else 0
        local = list(t.global_shape)
        local[axis] //= tp
        sh = ShardedTensor.from_rank_offsets(
            t.key, torch.empty(local, dtype=t.dtype), (axis, tp_rank, tp), replica_id=rid
        )
        return {t.key: apply_swiglu_sharded_factory(sh, ()) if t.kind == "swiglu" else sh}
    n_experts = t.global_shape[0]
    per_ep = n_experts // layout.ep
    out: dict[str, Any] = {}
    for i in range(per_ep):
        e = ep_rank * per_ep + i
        if experts is not None and e not in experts:
            continue
        local = list(t.global_shape[1:])
        axis = 0 if t.kind == "experts_fc1" else 1
        local[axis] //= tp
        offsets = ((0, e, n_experts),)
        sh = ShardedTensor.from_rank_offsets(
            t.key,
            torch.empty(local, dtype=t.dtype),
            *offsets,
            (axis + 1, tp_rank, tp),
            replica_id=(0, 0, 0),
            prepend_axis_num=1,
        )
        out[f"{t.key}{i}"] = apply_swiglu_sharded_factory(sh, offsets) if t.kind == "experts_fc1" else sh
    return out


def expected_shards(
    t: DistTensor, src: HFCheckpoint, layout: Layout, tp_rank: int, ep_rank: int
) -> dict[str, torch.Tensor]:
    """Independent statement of the mapping: the local tensors straight from the HF names."""
    tp = layout.tp

    def rows(x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0] // tp
        return x[tp_rank * n : (tp_rank + 1) * n]

    def cols(x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1] // tp
        return x[:, tp_rank * n : (tp_rank + 1) * n]

    get = src.tensor
    if t.kind == "replicated":
        return {t.key: get(t.sources[0]).to(t.dtype)}
    if t.kind == "rows":
        return {t.key: rows(get(t.sources[0]))}
    if t.kind == "cols":
        return {t.key: cols(get(t.sources[0]))}
    if t.kind == "swiglu":
        return {t.key: torch.cat([rows(get(t.sources[0])), rows(get(t.sources[1]))])}
    per_ep = t.global_shape[0] // layout.ep
    out = {}
    for i in range(per_ep):
        p = f"{t.sources[0]}experts.{ep_rank * per_ep + i}."
        if t.kind == "experts_fc1":
            out[f"{t.key}{i}"] = torch.cat([rows(get(p + "gate_proj.weight")), rows(get(p + "up_proj.weight"))])
        else:
            out[f"{t.key}{i}"] = cols(get(p + "down_proj.weight"))
    return out


def _groups(plan: MegatronPlan) -> dict[int | None, list[DistTensor]]:
    groups: dict[int | None, list[DistTensor]] = {}
    for t in plan.tensors:
        groups.setdefault(t.layer, []).append(t)
    return groups


def _load(ssd: dict[str, Any], ckpt_dir: Path, *, whole_tensors: bool = True) -> dict[str, Any]:
    """The call verl's ``load_mcore_dist_weights`` makes (``strict=ASSUME_OK_UNEXPECTED``).

    ``whole_tensors=False`` allows requesting only part of a tensor (some experts); megatron-core otherwise
    checks that the ranks together request every element exactly once.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import StrictHandling

    return dist_checkpointing.load(
        ssd, str(ckpt_dir), strict=StrictHandling.ASSUME_OK_UNEXPECTED, validate_access_integrity=whole_tensors
    )


def _verify_rank(ckpt_dir: Path, hf_dir: Path, layout: Layout, extra_state: bool) -> int:
    """Load this rank's share (rank = ep_rank * tp + tp_rank) layer by layer and compare with HF; returns a count."""
    import torch.distributed as dist
    from megatron.core.dist_checkpointing import ShardedObject

    rank = dist.get_rank()
    tp_rank, ep_rank = rank % layout.tp, rank // layout.tp
    src = HFCheckpoint(hf_dir)
    plan = build_plan(src.config, layout, extra_state=extra_state)
    extras_by_layer: dict[int | None, list] = {}
    for e in plan.extra_states:
        extras_by_layer.setdefault(e.layer, []).append(e)
    compared = 0
    for layer, tensors in _groups(plan).items():
        ssd: dict[str, Any] = {}
        for t in tensors:
            ssd.update(local_sharded(t, layout, tp_rank, ep_rank))
        extras = [
            e
            for e in extras_by_layer.get(layer, [])
            if e.shape == (1,) or e.offset[0] // (e.shape[0] // layout.ep) == ep_rank
        ]
        for e in extras:
            replica = (0, tp_rank, 0 if e.shape != (1,) else ep_rank)
            ssd[e.unique_key] = ShardedObject(e.key, None, e.shape, e.offset, replica_id=replica)
        loaded = _load(ssd, ckpt_dir)
        for t in tensors:
            for key, want in expected_shards(t, src, layout, tp_rank, ep_rank).items():
                have = loaded[key]
                if have.dtype != want.dtype or have.shape != want.shape or not torch.equal(have, want):
                    msg = f"{ckpt_dir}: {key} at tp_rank={tp_rank} ep_rank={ep_rank} of {layout} differs from HF"
                    raise CheckpointFormatError(msg)
                compared += 1
        for e in extras:
            if loaded.get(e.unique_key, "missing") is not None:
                msg = f"{ckpt_dir}: extra state {e.unique_key} is missing or not empty"
                raise CheckpointFormatError(msg)
            compared += 1
    return compared


def check_megatron_inventory(ckpt_dir: Path, plan: MegatronPlan, *, allow_extra: bool = False) -> None:
    """The dist checkpoint's metadata lists exactly the plan's tensors (keys, global shapes, dtypes).

    ``allow_extra`` accepts other keys (a training checkpoint also holds optimizer state).
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from r1_ascend.weights.inventory import check_inventory

    try:
        meta = FileSystemReader(str(ckpt_dir)).read_metadata()
    except (OSError, EOFError, ValueError) as exc:
        msg = f"{ckpt_dir} has no readable dist-checkpoint metadata (.metadata: {exc}); the save did not finish"
        raise CheckpointFormatError(msg) from exc
    have = {
        k: (str(v.properties.dtype), tuple(v.size))
        for k, v in meta.state_dict_metadata.items()
        if isinstance(v, TensorStorageMetadata)
    }
    expected = {t.key: (str(t.dtype), tuple(t.global_shape)) for t in plan.tensors}
    if allow_extra:
        have = {k: v for k, v in have.items() if k in expected}
    check_inventory(have, expected, f"Megatron checkpoint {ckpt_dir}", fix="re-run the conversion with --overwrite")


def _rank_main(rank: int, world: int, store: str, args: tuple, results: Any) -> None:
    try:
        with process_group(rank, world, store):
            results.put((rank, _verify_rank(*args), None))
    except Exception as exc:  # reported to the parent, which raises
        results.put((rank, 0, f"{type(exc).__name__}: {exc}"))


def verify_megatron(
    ckpt_dir: str | Path, hf_dir: str | Path, layouts: list[Layout] | None = None, *, extra_state: bool = True
) -> int:
    """Load ``ckpt_dir`` with megatron-core at each layout (TP x EP gloo processes on CPU) and compare every
    tensor and extra state with ``hf_dir``. Returns the number of entries compared over all ranks.

    Each rank loads one layer at a time, so memory stays at about one layer's share per process.
    """
    import multiprocessing as mp

    ckpt_dir, hf_dir = Path(ckpt_dir), Path(hf_dir)
    source = HFCheckpoint(hf_dir)
    source.check_architecture(what="HF source")
    check_megatron_inventory(ckpt_dir, build_plan(source.config, Layout(), extra_state=extra_state))
    total = 0
    loads = [Layout(tp=layout.tp, ep=layout.ep) for layout in layouts or [Layout()]]  # one stage: every layer
    for load in loads:
        check_layout(load, source.config)
    for layout in loads:
        world = layout.world_size
        args = (ckpt_dir, hf_dir, layout, extra_state)
        if world == 1:
            with process_group():
                total += _verify_rank(*args)
            continue
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        with tempfile.TemporaryDirectory() as tmp:
            store = os.path.join(tmp, "store")
            procs = [ctx.Process(target=_rank_main, args=(r, world, store, args, results)) for r in range(world)]
            for p in procs:
                p.start()
            outcomes = [results.get(timeout=600) for _ in procs]
            for p in procs:
                p.join()
        errors = [f"rank {r}: {err}" for r, _, err in outcomes if err]
        if errors:
            msg = f"loading {ckpt_dir} at tp={layout.tp} ep={layout.ep} failed: " + "; ".join(errors)
            raise CheckpointFormatError(msg)
        total += sum(n for _, n, _ in outcomes)
    return total


def megatron_to_hf(ckpt_dir: str | Path, hf_config: dict[str, Any], out_dir: str | Path) -> Path:
    """Round trip: load the full tensors (TP1/EP1) layer by layer and write them back under HF names."""
    from safetensors.torch import save_file

    ckpt_dir, out = Path(ckpt_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    layout = Layout()
    plan = build_plan(hf_config, layout, extra_state=False)
    weight_map: dict[str, str] = {}
    total = 0
    with process_group():
        for n, (_layer, tensors) in enumerate(_groups(plan).items()):
            ssd: dict[str, Any] = {}
            for t in tensors:
                ssd.update(local_sharded(t, layout, 0, 0))
            loaded = _load(ssd, ckpt_dir)
            hf: dict[str, torch.Tensor] = {}
            for t in tensors:
                if t.kind == "swiglu":
                    gate, up = loaded[t.key].chunk(2)
                    hf[t.sources[0]], hf[t.sources[1]] = gate.contiguous(), up.contiguous()
                elif t.kind in ("experts_fc1", "experts_fc2"):
                    for e in range(t.global_shape[0]):
                        p = f"{t.sources[0]}experts.{e}."
                        if t.kind == "experts_fc1":
                            gate, up = loaded[f"{t.key}{e}"].chunk(2)
                            hf[p + "gate_proj.weight"], hf[p + "up_proj.weight"] = gate.contiguous(), up.contiguous()
                        else:
                            hf[p + "down_proj.weight"] = loaded[f"{t.key}{e}"]
                else:
                    hf[t.sources[0]] = loaded[t.key]
            file = f"model-{n + 1:05d}.safetensors"
            save_file(hf, str(out / file), metadata=dict(PT_METADATA))
            total += sum(x.numel() * x.element_size() for x in hf.values())
            weight_map.update(dict.fromkeys(hf, file))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    cfg = dict(hf_config)
    cfg.pop("quantization_config", None)
    cfg["num_nextn_predict_layers"] = 0
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out
