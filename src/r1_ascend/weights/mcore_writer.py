"""Write a Megatron-core ``torch_dist`` checkpoint from an HF checkpoint, one tensor at a time.

The chunks of each virtual rank go to ``__{rank}_0.distcp`` through PyTorch DCP's own ``FileSystemWriter`` (so the
byte format is DCP's), driven by a resolver that reads and converts one HF tensor when DCP asks for the chunk;
``.metadata`` (the DCP metadata plus mcore's ``mcore_data``), ``common.pt`` and ``metadata.json`` complete the
directory as ``megatron.core.dist_checkpointing.save`` would. Peak memory per process is about two copies of the
largest HF tensor, independent of the model size; ``metadata.json`` is written last, so an interrupted run never
looks like a checkpoint.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.filesystem import _write_item as dcp_write_item
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

from r1_ascend.atomic import atomic_open, atomic_write_text, temp_glob
from r1_ascend.parallel import Layout
from r1_ascend.weights.errors import CheckpointFormatError
from r1_ascend.weights.manifest import MEGATRON_MANIFEST, MegatronManifest
from r1_ascend.weights.mcore_plan import DistTensor, MegatronPlan, Piece, build_plan, empty_extra_state
from r1_ascend.weights.outdir import fingerprint, prepare_output
from r1_ascend.weights.progress import Progress
from r1_ascend.weights.source import HFCheckpoint
from r1_ascend.weights.workers import mp_context, worker_pool

log = logging.getLogger(__name__)

MCORE_METADATA = {
    "sharded_backend": "torch_dist",
    "sharded_backend_version": 1,
    "common_backend": "torch",
    "common_backend_version": 1,
}


def check_plan_against_source(plan: MegatronPlan, ckpt: HFCheckpoint) -> None:
    """Every non-MTP HF tensor is used exactly once, with the shape the config implies."""
    ckpt.check_architecture(what="Megatron conversion source")
    available = set(ckpt.names(include_mtp=False))
    missing = sorted(plan.consumed - available)
    unused = sorted(available - plan.consumed)
    if missing or unused:
        msg = (
            f"{ckpt.path} does not match its config.json: missing {missing[:5]}, not mapped {unused[:5]}. "
            "Is this a DeepSeek-V3-architecture checkpoint with a complete download?"
        )
        raise CheckpointFormatError(msg)
    for t in plan.tensors:
        for p in t.pieces:
            shape = ckpt.entry(p.source).shape
            rows_ok = p.rows[1] <= shape[0]
            cols_ok = p.cols is None or (len(shape) == 2 and p.cols[1] <= shape[1])
            if not (rows_ok and cols_ok):
                msg = f"{p.source} has shape {shape}, too small for {t.key} chunk {p.offsets}+{p.sizes}"
                raise CheckpointFormatError(msg)


def _write_item(t: DistTensor, p: Piece) -> WriteItem:
    return WriteItem(
        index=MetadataIndex(t.key, torch.Size(p.offsets)),
        type=WriteItemType.SHARD,
        tensor_data=TensorWriteData(
            chunk=ChunkStorageMetadata(offsets=torch.Size(p.offsets), sizes=torch.Size(p.sizes)),
            properties=TensorProperties(dtype=t.dtype),
            size=torch.Size(t.global_shape),
        ),
    )


class _LazyResolver:
    """Stands in for DCP's SavePlanner during ``write_data``: produces each chunk only when it is written."""

    def __init__(self, ckpt: HFCheckpoint, pieces: dict[tuple[str, tuple[int, ...]], tuple[DistTensor, Piece]], bar):
        self.ckpt, self.pieces, self.bar = ckpt, pieces, bar
        self._cached: tuple[str, torch.Tensor] | None = None

    def _source(self, name: str) -> torch.Tensor:
        # one-tensor cache: consecutive chunks (TP splits, gate/up halves) of one source reuse its dequantisation
        if self._cached is None or self._cached[0] != name:
            self._cached = None
            self._cached = (name, self.ckpt.tensor(name))
        return self._cached[1]

    def resolve_data(self, item: WriteItem) -> Any:
        if item.type == WriteItemType.BYTE_IO:
            return empty_extra_state()
        t, p = self.pieces[(item.index.fqn, tuple(item.index.offset))]
        if p.cols is None:
            self._cached = None
            chunk = self.ckpt.rows(p.source, *p.rows)  # only these rows are read (and dequantised)
        else:  # a column split (TP of o_proj / fc2): the whole source once, cached for the other TP ranks
            chunk = self._source(p.source)[p.rows[0] : p.rows[1], p.cols[0] : p.cols[1]]
        chunk = chunk.to(t.dtype).reshape(p.sizes).contiguous()
        if self.bar is not None:
            self.bar(chunk.numel() * chunk.element_size())
        return chunk

    def skip(self, items: list[WriteItem]) -> None:
        """Count items already on disk (a resumed rank file) as done, without reading their sources."""
        if self.bar is None:
            return
        for item in items:
            if item.type != WriteItemType.BYTE_IO:
                t, p = self.pieces[(item.index.fqn, tuple(item.index.offset))]
                self.bar(math.prod(p.sizes) * torch.empty((), dtype=t.dtype).element_size())


def rank_items(plan: MegatronPlan) -> dict[int, list[WriteItem]]:
    out: dict[int, list[WriteItem]] = {}
    for rank, (pieces, extras) in sorted(plan.by_rank().items()):
        items = [WriteItem(index=MetadataIndex(e.unique_key), type=WriteItemType.BYTE_IO) for e in extras]
        items += [_write_item(t, p) for t, p in pieces]
        out[rank] = items
    return out


def item_writer() -> Any:
    """``(stream, data, item, storage_key) -> WriteResult`` over torch's private DCP item writer.

    Its signature changed between the torch on the NPU image (2.5.1: ``(stream, data, write_item, storage_key)``)
    and newer releases (``(transforms, stream, data, write_item, storage_key, serialization_format)``); both
    write the same ``torch.save`` record, so pick the call by signature and fail loudly on anything else.
    """
    params = list(inspect.signature(dcp_write_item).parameters)
    if params == ["stream", "data", "write_item", "storage_key"]:
        return dcp_write_item
    if params == ["transforms", "stream", "data", "write_item", "storage_key", "serialization_format"]:
        from torch.distributed.checkpoint.filesystem import SerializationFormat, _StorageWriterTransforms

        transforms = _StorageWriterTransforms(None)
        return lambda stream, data, item, key: dcp_write_item(
            transforms, stream, data, item, key, SerializationFormat.TORCH_SAVE
        )
    msg = (
        f"torch {torch.__version__}: torch.distributed.checkpoint.filesystem._write_item has parameters {params}, "
        "which the Megatron checkpoint writer does not know; use torch 2.5.1 (the NPU image) or 2.13.0 (CPU tests)"
    )
    raise CheckpointFormatError(msg)


def results_path(dst: Path, rank: int) -> Path:
    """Sidecar holding the DCP WriteResults of a finished rank file (the metadata needs them)."""
    return dst / f".__{rank}_0.results.pt"


def finished_rank_results(dst: Path, rank: int, items: list[WriteItem]) -> list[Any] | None:
    """The WriteResults of a rank file finished by an earlier run, or None if it must be (re)written.

    A rank file counts as finished when it was renamed into place, its sidecar lists exactly the items this plan
    puts in that rank, and the file is exactly as long as the records the sidecar describes.
    """
    path, sidecar = dst / f"__{rank}_0.distcp", results_path(dst, rank)
    if not (path.is_file() and sidecar.is_file()):
        return None
    try:
        results = torch.load(sidecar, weights_only=False)
    except Exception:  # a torn or foreign sidecar: rewrite the rank rather than trust it
        return None
    if sorted(str(r.index) for r in results) != sorted(str(i.index) for i in items):
        return None
    end = max((r.storage_data.offset + r.storage_data.length for r in results), default=0)
    return results if path.stat().st_size == end else None


def write_rank_file(dst: Path, rank: int, items: list[WriteItem], resolver: _LazyResolver) -> list[Any]:
    """One ``__{rank}_0.distcp`` in DCP's byte format (``torch.save`` per item, offsets in the metadata).

    DCP's ``FileSystemWriter.write_data`` keeps a reference to every tensor it wrote until the file is closed,
    which would hold a whole rank in memory; this loop writes the same records with torch's own item writer
    and drops each tensor as soon as it is on disk. The file is written under a temporary name and renamed when
    complete, then its WriteResults are saved next to it, so a rerun after a kill keeps every finished rank file.
    """
    name = f"__{rank}_0.distcp"
    done = finished_rank_results(dst, rank, items)
    if done is not None:
        resolver.skip(items)
        return done
    write_one = item_writer()
    results = []
    with atomic_open(dst / name) as stream:
        for item in items:
            data = resolver.resolve_data(item)
            results.append(write_one(stream, data, item, name))
            del data
    with atomic_open(results_path(dst, rank)) as sidecar:
        torch.save(results, sidecar)
    resolver._cached = None
    return results


_WORKER_QUEUE: list[Any] = []


def _set_worker_queue(queue: Any) -> None:
    _WORKER_QUEUE[:] = [queue]


def _write_ranks(src: str, dst: str, layout: Layout, extra_state: bool, ranks: list[int]) -> list[Any]:
    """Worker: write the files of ``ranks``; returns DCP WriteResults for the metadata."""
    queue = _WORKER_QUEUE[0] if _WORKER_QUEUE else None
    ckpt = HFCheckpoint(src)
    plan = build_plan(ckpt.config, layout, extra_state=extra_state)
    pieces = {(t.key, p.offsets): (t, p) for t in plan.tensors for p in t.pieces}
    items = rank_items(plan)
    report = queue.put if queue is not None else None
    resolver = _LazyResolver(ckpt, pieces, report)
    results: list[Any] = []
    for rank in ranks:
        results.extend(write_rank_file(Path(dst), rank, items[rank], resolver))
    return results


def build_metadata(plan: MegatronPlan) -> Metadata:
    state: dict[str, Any] = {}
    for t in plan.tensors:
        chunks = [ChunkStorageMetadata(torch.Size(p.offsets), torch.Size(p.sizes)) for p in t.pieces]
        state[t.key] = TensorStorageMetadata(TensorProperties(dtype=t.dtype), torch.Size(t.global_shape), chunks)
    for e in plan.extra_states:
        state[e.unique_key] = BytesStorageMetadata()
    metadata = Metadata(state_dict_metadata=state)
    metadata.mcore_data = {t.key: {} for t in plan.tensors}  # what MCoreSavePlanner records for plain tensors
    return metadata


@dataclass
class MegatronResult:
    out_dir: Path
    tensors: int
    extra_states: int
    bytes_written: int
    seconds: float
    skipped: bool = False


def convert_hf_to_megatron(
    src: str | Path,
    dst: str | Path,
    layout: Layout | None = None,
    *,
    workers: int = 1,
    overwrite: bool = False,
    extra_state: bool = True,
    progress: bool = True,
) -> MegatronResult:
    """HF (BF16, or FP8 dequantised on the fly) -> Megatron-core torch_dist checkpoint directory."""
    start = time.monotonic()
    layout = layout or Layout()
    given_src, given_dst = Path(src), Path(dst)
    src, dst = given_src.resolve(), given_dst.resolve()
    ckpt = HFCheckpoint(src)
    plan = build_plan(ckpt.config, layout, extra_state=extra_state)
    check_plan_against_source(plan, ckpt)
    manifest = MegatronManifest(
        source=str(src),
        source_config_sha256=fingerprint(src / "config.json"),
        layout=layout,
        num_layers=int(ckpt.config["num_hidden_layers"]),
        extra_state=extra_state,
    )
    resuming = prepare_output(
        dst, MEGATRON_MANIFEST, manifest.to_json(), overwrite=overwrite, source=given_src, shown_out=given_dst
    )
    total_bytes = sum(t.numel * torch.empty((), dtype=t.dtype).element_size() for t in plan.tensors)
    if resuming:
        if (dst / "metadata.json").exists() and (dst / ".metadata").exists():
            log.info("%s is already a complete conversion of %s; nothing to do", dst, src)
            return MegatronResult(dst, len(plan.tensors), len(plan.extra_states), 0, 0.0, skipped=True)
        for stale in [*dst.glob(temp_glob("__*.distcp")), *dst.glob(".metadata*"), dst / "common.pt"]:
            stale.unlink(missing_ok=True)  # partial files of a killed run; finished rank files are kept and reused
    items = rank_items(plan)
    ranks = sorted(items)
    bar = Progress("to-megatron", total_bytes, enabled=progress)
    if workers <= 1:
        ckpt_pieces = {(t.key, p.offsets): (t, p) for t in plan.tensors for p in t.pieces}
        resolver = _LazyResolver(ckpt, ckpt_pieces, bar.add)
        results = []
        for rank in ranks:
            results.extend(write_rank_file(dst, rank, items[rank], resolver))
    else:
        results = _write_parallel(str(src), str(dst), layout, extra_state, plan, ranks, workers, bar)
    finisher = FileSystemWriter(str(dst), single_file_per_rank=True, sync_files=True)
    finisher.set_up_storage_writer(True)
    finisher.finish(build_metadata(plan), [results])
    from r1_ascend.weights.mcore_verify import check_megatron_inventory

    check_megatron_inventory(dst, plan)  # before metadata.json, which marks the checkpoint complete
    with atomic_open(dst / "common.pt") as common:
        torch.save({}, common)
    atomic_write_text(dst / "metadata.json", json.dumps(MCORE_METADATA))
    for sidecar in dst.glob(".__*_0.results.pt"):
        sidecar.unlink()  # the metadata now holds what they recorded
    bar.finish()
    return MegatronResult(dst, len(plan.tensors), len(plan.extra_states), total_bytes, time.monotonic() - start)


def _write_parallel(src, dst, layout, extra_state, plan, ranks, workers, bar) -> list[Any]:
    sizes = {r: 0 for r in ranks}
    for t in plan.tensors:
        for p in t.pieces:
            sizes[p.rank] += math.prod(p.sizes)
    buckets: list[list[int]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for r in sorted(ranks, key=lambda r: -sizes[r]):
        i = loads.index(min(loads))
        buckets[i].append(r)
        loads[i] += sizes[r]
    queue = mp_context().Queue()
    results: list[Any] = []
    with worker_pool(workers, _set_worker_queue, (queue,)) as pool:
        futures = [pool.submit(_write_ranks, src, dst, layout, extra_state, b) for b in buckets if b]
        pending = set(futures)
        while pending:
            pending = {f for f in pending if not f.done()}
            while not queue.empty():
                bar.add(queue.get())
            time.sleep(0.2)
        for f in futures:
            results.extend(f.result())
    while not queue.empty():
        bar.add(queue.get())
    os.sync()
    return results
