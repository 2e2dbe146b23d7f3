"""FP8 -> BF16 for a whole HF checkpoint: streaming, parallel over shards, atomic per shard, resumable.

Each output shard keeps its input file name and tensor assignment (scales dropped, FP8 -> BF16, everything else
byte-identical). Its header is computed from the input header, then tensors are dequantised and written one at a
time into a temp file that is renamed when complete; a rerun skips shards whose header and size already match.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from r1_ascend.atomic import BackgroundCommit, atomic_open_background, atomic_write_json, remove_stale_temps
from r1_ascend.weights.errors import AlreadyBF16Error, CheckpointFormatError
from r1_ascend.weights.fp8 import BLOCK, SCALE_SUFFIX, check_scale_shape, dequantize_rows
from r1_ascend.weights.inventory import check_inventory, expected_tensors
from r1_ascend.weights.outdir import copy_side_files, fingerprint, prepare_output
from r1_ascend.weights.progress import Progress
from r1_ascend.weights.safetensors_io import (
    PT_METADATA,
    StreamingWriter,
    TensorEntry,
    encode_header,
    ordered_layout,
    read_header,
)
from r1_ascend.weights.source import INDEX_NAME, HFCheckpoint, is_mtp_tensor, load_json
from r1_ascend.weights.workers import mp_context, worker_pool

log = logging.getLogger(__name__)

MANIFEST = ".r1-ascend-fp8-to-bf16.json"
_SIDE_FILE_SKIP = {INDEX_NAME}


@dataclass(frozen=True)
class ShardPlan:
    """One output shard: its file name, header layout and the input bytes it reads."""

    file: str
    layout: list[TensorEntry]
    input_bytes: int

    @property
    def header(self) -> bytes:
        return encode_header(self.layout, PT_METADATA)

    @property
    def file_size(self) -> int:
        return len(self.header) + (self.layout[-1].end if self.layout else 0)


def plan_shards(ckpt: HFCheckpoint, *, drop_mtp: bool) -> list[ShardPlan]:
    """Output layout per input shard; checks that every FP8 weight has a scale and every scale a weight."""
    for name in ckpt.weight_map:
        if name.endswith(SCALE_SUFFIX):
            base = name[: -len(SCALE_SUFFIX)]
            if base not in ckpt.weight_map or not ckpt.is_fp8(base):
                msg = f"{name!r} has no FP8 weight {base!r} next to it in {INDEX_NAME}; the index is inconsistent"
                raise CheckpointFormatError(msg)
        elif ckpt.is_fp8(name):
            ckpt.scale_name(name)
    plans = []
    for file in ckpt.files:
        entries = []
        input_bytes = 0
        for entry in ckpt.headers[file].entries.values():
            if ckpt.weight_map.get(entry.name) != file:
                continue  # present in the shard but not indexed there: ignored like transformers does
            input_bytes += entry.nbytes
            if entry.name.endswith(SCALE_SUFFIX):
                continue
            if drop_mtp and is_mtp_tensor(entry.name, ckpt.num_hidden_layers):
                continue
            if entry.dtype == "F8_E5M2":
                msg = (
                    f"{file}: tensor {entry.name!r} is float8 e5m2; DeepSeek-V3 checkpoints are block-scaled e4m3 "
                    f"(float8_e4m3fn with weight_scale_inv). This is not a checkpoint fp8-to-bf16 can convert exactly."
                )
                raise CheckpointFormatError(msg)
            dtype = "BF16" if entry.dtype == "F8_E4M3" else entry.dtype
            entries.append((entry.name, dtype, entry.shape))
        plans.append(ShardPlan(file, ordered_layout(entries), input_bytes))
    return plans


def shard_is_complete(path: Path, plan: ShardPlan) -> bool:
    """Cheap resume check: the file has exactly the expected header and length."""
    if not path.exists() or path.stat().st_size != plan.file_size:
        return False
    with path.open("rb") as f:
        return f.read(len(plan.header)) == plan.header


_WORKER_STATE: dict[str, Any] = {}


def _worker_init(queue: Any, work: Any = None) -> None:
    _WORKER_STATE["queue"] = queue
    _WORKER_STATE["work"] = work


def _checkpoint(src: str) -> HFCheckpoint:
    cached = _WORKER_STATE.get("ckpt")
    if cached is None or str(cached.path) != src:
        cached = HFCheckpoint(src)
        _WORKER_STATE["ckpt"] = cached
    return cached


#: Bytes read per step: bounds a worker's buffers (FP8 codes + BF16 output + lookup indices) to ~100 MB.
BAND_BYTES = 16 << 20


class _Buffers:
    """Reusable per-process buffers, grown on demand and never shrunk: memory stays flat across tensors."""

    def __init__(self) -> None:
        self._bufs: dict[str, torch.Tensor] = {}

    def get(self, key: str, n: int, dtype: torch.dtype) -> torch.Tensor:
        buf = self._bufs.get(key)
        if buf is None or buf.numel() < n:
            buf = self._bufs[key] = torch.empty(max(n, 1), dtype=dtype)
        return buf[:n]


def _bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.view(torch.uint8).numpy())


def stream_tensor(ckpt: HFCheckpoint, name: str, writer: StreamingWriter, bufs: _Buffers) -> None:
    """Write one output tensor band by band: FP8 dequantised, everything else copied byte for byte."""
    src = ckpt.entry(name)
    if src.dtype != "F8_E4M3":
        writer.begin(name, src.dtype, src.shape)
        buf = bufs.get("copy", min(src.nbytes, BAND_BYTES), torch.uint8)
        for off in range(0, src.nbytes, BAND_BYTES):
            chunk = buf[: min(BAND_BYTES, src.nbytes - off)]
            ckpt.read_into(name, off, _bytes(chunk))
            writer.write_chunk(_bytes(chunk))
        writer.end()
        return
    rows, cols = src.shape
    scale = ckpt.raw(ckpt.scale_name(name))
    check_scale_shape((rows, cols), scale, name, BLOCK)
    band = max(BLOCK, (BAND_BYTES // max(cols, 1)) // BLOCK * BLOCK)
    codes = bufs.get("codes", min(band, rows) * cols, torch.uint8)
    out = bufs.get("bf16", min(band, rows) * cols, torch.bfloat16)
    writer.begin(name, "BF16", src.shape)
    for r0 in range(0, rows, band):
        r1 = min(rows, r0 + band)
        n = (r1 - r0) * cols
        ckpt.read_into(name, r0 * cols, _bytes(codes[:n]))
        dequantize_rows(codes[:n].view(r1 - r0, cols), scale, r0, out[:n].view(r1 - r0, cols))
        writer.write_chunk(_bytes(out[:n]))
    writer.end()


def _start_writeback(f: Any, since: int) -> int:
    """Hand the bytes written since ``since`` to the kernel for write-back now (DONTNEED starts it without
    waiting), so the disk works while the next tensor is computed, the closing fsync finds little left to do and
    the output does not crowd the page cache. Returns the new file position."""
    f.flush()
    pos = f.tell()
    if hasattr(os, "posix_fadvise") and pos > since:
        os.posix_fadvise(f.fileno(), since, pos - since, os.POSIX_FADV_DONTNEED)
    return pos


def _write_shard(ckpt: HFCheckpoint, dst: str, plan: ShardPlan, report: Any) -> BackgroundCommit:
    """Write every tensor of one shard into its temp file; returns with the fsync and rename under way."""
    bufs = _WORKER_STATE.setdefault("buffers", _Buffers())
    queue = _WORKER_STATE.get("queue")
    with atomic_open_background(Path(dst) / plan.file) as (f, commit):
        writer = StreamingWriter(f, plan.layout, PT_METADATA)
        written = 0
        for entry in plan.layout:
            stream_tensor(ckpt, entry.name, writer, bufs)
            written = _start_writeback(f, written)
            src_bytes = ckpt.entry(entry.name).nbytes
            if ckpt.is_fp8(entry.name):
                src_bytes += ckpt.entry(ckpt.scale_name(entry.name)).nbytes
            if report is not None:
                report(src_bytes)
            elif queue is not None:
                queue.put(src_bytes)
        writer.close_check()
    return commit


def convert_shards(src: str, dst: str, plans: Iterable[ShardPlan], report: Any = None) -> int:
    """Write shards one after another, each atomically; returns the bytes written.

    A shard's fsync and rename run on a background thread while the next shard is converted
    (``atomic_open_background``); at most one finished shard waits for its fsync at a time, and all of them are in
    place when this returns, also when it raises.
    """
    ckpt = _checkpoint(src)
    written = 0
    pending: list[BackgroundCommit] = []
    try:
        for plan in plans:
            pending.append(_write_shard(ckpt, dst, plan, report))
            if len(pending) > 1:
                pending.pop(0).wait()
            written += plan.file_size
    except BaseException:
        for commit in pending:  # let every started file finish (or clean up) before reporting the first error
            with contextlib.suppress(BaseException):
                commit.wait()
        raise
    for commit in pending:
        commit.wait()
    return written


def _convert_queued(src: str, dst: str) -> int:
    """Worker task: convert shards taken from the shared work queue until its end marker."""
    work = _WORKER_STATE["work"]
    return convert_shards(src, dst, iter(work.get, None))


def bf16_config(config: dict[str, Any]) -> dict[str, Any]:
    """The weights are no longer FP8: a kept quantization_config would make HF/vLLM re-quantise-load them."""
    out = dict(config)
    out.pop("quantization_config", None)
    out["torch_dtype"] = "bfloat16"
    return out


@dataclass
class ConversionResult:
    out_dir: Path
    shards_written: int
    shards_skipped: int
    bytes_written: int
    seconds: float
    input_bytes: int


def convert_fp8_to_bf16(
    src: str | Path,
    dst: str | Path,
    *,
    workers: int = 1,
    drop_mtp: bool = False,
    overwrite: bool = False,
    verify: bool = False,
    progress: bool = True,
) -> ConversionResult:
    """Dequantise every FP8 weight of ``src`` into ``dst`` (see module docstring for the guarantees)."""
    start = time.monotonic()
    given_src, given_dst = Path(src), Path(dst)
    src, dst = given_src.resolve(), given_dst.resolve()
    if src == dst:
        msg = "source and output directories are the same; the converter never modifies its input"
        raise CheckpointFormatError(msg)
    ckpt = HFCheckpoint(src)
    e5m2 = [n for n in ckpt.weight_map if ckpt.entry(n).dtype == "F8_E5M2"]
    if e5m2:
        plan_shards(ckpt, drop_mtp=drop_mtp)  # raises its e5m2 message
    if not ckpt.quantized:
        msg = (
            f"{src} holds no FP8 weights: it is already a BF16 checkpoint, so there is nothing to dequantise and "
            "nothing was written. Use it as it is: `r1-ascend convert-weights fix-config` on it (or a copy), then "
            "`to-megatron`."
        )
        raise AlreadyBF16Error(msg)
    ckpt.check_architecture(mtp=True, what="FP8 input")
    _WORKER_STATE["ckpt"] = ckpt  # this run's parsed headers; forked workers inherit them
    plans = plan_shards(ckpt, drop_mtp=drop_mtp)
    manifest = {
        "step": "fp8-to-bf16",
        "source": str(src),
        "source_index_sha256": fingerprint(src / INDEX_NAME) if (src / INDEX_NAME).exists() else None,
        "drop_mtp": drop_mtp,
    }
    resuming = prepare_output(dst, MANIFEST, manifest, overwrite=overwrite, source=given_src, shown_out=given_dst)
    if resuming:
        removed = remove_stale_temps(dst)
        log.info("resuming into %s (%d stale temp files removed)", dst, removed)
    todo = [p for p in plans if p.layout and not shard_is_complete(dst / p.file, p)]
    skipped = sum(1 for p in plans if p.layout) - len(todo)
    total_input = sum(p.input_bytes for p in plans)
    bar = Progress("fp8-to-bf16", total_input, enabled=progress)
    bar.skip(total_input - sum(p.input_bytes for p in todo))
    if skipped:
        log.info("%d shards already complete, %d to convert", skipped, len(todo))
    written = 0
    if workers <= 1 or len(todo) <= 1:
        with _one_torch_thread():
            written = convert_shards(str(src), str(dst), todo, report=bar.add)
    else:
        written = _run_parallel(str(src), str(dst), todo, workers, bar)
    _write_index_and_side_files(src, dst, plans, ckpt.config, mtp=not drop_mtp)
    bar.finish()
    result = ConversionResult(dst, len(todo), skipped, written, time.monotonic() - start, total_input)
    if verify:
        verify_bf16(src, dst, drop_mtp=drop_mtp, progress=progress)
    return result


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    """Convert in this process with one intra-op thread, as a worker does: torch's default of one per core only
    spins here (same wall time, about twice the CPU) and is many times slower when other jobs share the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _run_parallel(src: str, dst: str, todo: list[ShardPlan], workers: int, bar: Progress) -> int:
    """Each worker takes shards from one queue (biggest first, so the tail is short) and keeps converting while its
    previous shard is fsynced; a worker's task ends when the queue does and its last shard is in place."""
    ctx = mp_context()
    queue, work = ctx.Queue(), ctx.Queue()
    for plan in sorted(todo, key=lambda p: -p.input_bytes):
        work.put(plan)
    for _ in range(workers):
        work.put(None)
    written = 0
    with worker_pool(workers, _worker_init, (queue, work)) as pool:
        futures = {pool.submit(_convert_queued, src, dst) for _ in range(workers)}
        while futures:
            done, futures = wait(futures, timeout=0.5, return_when=FIRST_COMPLETED)
            while not queue.empty():
                bar.add(queue.get())
            for fut in done:
                written += fut.result()
    while not queue.empty():
        bar.add(queue.get())
    return written


def check_output_inventory(dst: Path, files: list[str], config: dict[str, Any], *, mtp: bool) -> None:
    """The written shards (their headers, as a reader sees them) hold exactly the BF16 inventory of the config."""
    have: dict[str, tuple[str, tuple[int, ...]]] = {}
    for file in files:
        have.update({n: (e.dtype, e.shape) for n, e in read_header(dst / file).entries.items()})
    expected = expected_tensors(config, fp8=False, mtp=mtp)
    check_inventory(have, expected, f"BF16 output {dst}", fix="rerun with --overwrite")


def _write_index_and_side_files(
    src: Path, dst: Path, plans: list[ShardPlan], config: dict[str, Any], *, mtp: bool
) -> None:
    """The index is the completion marker: written only after the shards pass the architecture check."""
    check_output_inventory(dst, [p.file for p in plans if p.layout], config, mtp=mtp)
    weight_map = {e.name: p.file for p in plans for e in p.layout}
    total = sum(e.nbytes for p in plans for e in p.layout)
    copy_side_files(src, dst, skip=_SIDE_FILE_SKIP)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    atomic_write_json(dst / INDEX_NAME, index)
    atomic_write_json(dst / "config.json", bf16_config(config))


def verify_bf16(src: str | Path, dst: str | Path, *, drop_mtp: bool = False, progress: bool = True) -> int:
    """Re-read every output tensor and compare it bit for bit with a fresh dequantisation of the source."""
    source, output = HFCheckpoint(src), HFCheckpoint(dst)
    output.check_architecture(mtp=not drop_mtp, what="BF16 output")
    expected = set(source.names(include_mtp=not drop_mtp))
    got = set(output.names(include_scales=True))
    if expected != got:
        missing, extra = sorted(expected - got)[:5], sorted(got - expected)[:5]
        msg = f"{dst}: tensor set differs from the source (missing {missing}, unexpected {extra})"
        raise CheckpointFormatError(msg)
    index = load_json(Path(dst) / INDEX_NAME)
    total = sum(output.entry(n).nbytes for n in got)
    if index.get("metadata", {}).get("total_size") != total:
        msg = f"{dst}/{INDEX_NAME}: metadata.total_size is {index.get('metadata')}, expected {total}"
        raise CheckpointFormatError(msg)
    for file, header in output.headers.items():
        if (header.metadata or {}).get("format") != "pt":
            msg = f"{dst}/{file}: safetensors metadata {header.metadata} lacks format=pt (transformers needs it)"
            raise CheckpointFormatError(msg)
    bar = Progress("verify", sum(output.entry(n).nbytes for n in got), enabled=progress)
    for name in sorted(got):
        want, have = source.tensor(name), output.raw(name)
        if want.dtype != have.dtype or want.shape != have.shape or not _bit_equal(want, have):
            msg = f"{dst}: tensor {name!r} differs from the dequantised source"
            raise CheckpointFormatError(msg)
        bar.add(output.entry(name).nbytes)
    bar.finish()
    return len(got)


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.element_size() == 1:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(view), b.contiguous().view(view))
