"""Read safetensors headers and write safetensors files one tensor at a time.

safetensors' Python API serialises a whole dict at once, so an output shard would have to sit in memory. The
format is simple (8-byte little-endian header length, JSON header padded to 8 bytes, raw little-endian bytes), so
the header is computed up front from the input header and the data streamed tensor by tensor; peak memory is then
one tensor, not one shard.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

from r1_ascend.weights.errors import CheckpointFormatError

DTYPE_TO_TORCH: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
TORCH_TO_DTYPE: dict[torch.dtype, str] = {v: k for k, v in DTYPE_TO_TORCH.items()}
DTYPE_SIZE: dict[str, int] = {k: torch.empty((), dtype=v).element_size() for k, v in DTYPE_TO_TORCH.items()}
# Metadata transformers checks for (`metadata.get("format") == "pt"`); without it some versions refuse to load.
PT_METADATA: dict[str, str] = {"format": "pt"}
_MAX_HEADER = 100_000_000


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as described by a safetensors header."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int = 0
    end: int = 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZE[self.dtype]


@dataclass(frozen=True)
class Header:
    """A parsed safetensors header plus the sizes needed to detect truncation."""

    path: Path
    entries: dict[str, TensorEntry]
    metadata: dict[str, str] | None
    data_start: int

    @property
    def expected_file_size(self) -> int:
        return self.data_start + max((e.end for e in self.entries.values()), default=0)

    @property
    def data_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())


def read_header(path: str | os.PathLike[str], *, check_size: bool = True) -> Header:
    """Parse a safetensors header and, by default, check the file holds every byte the header promises."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            raw_len = f.read(8)
            if len(raw_len) < 8:
                msg = f"{path}: {size} bytes, too short for a safetensors file (needs an 8-byte header length)"
                raise CheckpointFormatError(msg)
            (hlen,) = struct.unpack("<Q", raw_len)
            if hlen > _MAX_HEADER or 8 + hlen > size:
                msg = (
                    f"{path}: header length {hlen} does not fit in the {size}-byte file; the file is truncated "
                    "or not safetensors. Re-download or re-copy it."
                )
                raise CheckpointFormatError(msg)
            header = json.loads(f.read(hlen))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        msg = f"{path}: cannot read a safetensors header ({exc}); re-download or re-copy the file"
        raise CheckpointFormatError(msg) from exc
    metadata = header.pop("__metadata__", None)
    entries: dict[str, TensorEntry] = {}
    for name, info in header.items():
        if info.get("dtype") not in DTYPE_TO_TORCH:
            msg = f"{path}: tensor {name!r} has unsupported dtype {info.get('dtype')!r}"
            raise CheckpointFormatError(msg)
        begin, end = info["data_offsets"]
        entries[name] = TensorEntry(name, info["dtype"], tuple(info["shape"]), begin, end)
        if end - begin != entries[name].nbytes:
            msg = f"{path}: tensor {name!r} spans {end - begin} bytes but shape and dtype need {entries[name].nbytes}"
            raise CheckpointFormatError(msg)
    result = Header(path, entries, metadata, 8 + hlen)
    if check_size and size < result.expected_file_size:
        msg = (
            f"{path} is truncated: {size} bytes on disk, the header describes {result.expected_file_size}. "
            "The download or copy was interrupted; re-download or re-copy this shard."
        )
        raise CheckpointFormatError(msg)
    return result


def ordered_layout(entries: Iterable[tuple[str, str, tuple[int, ...]]]) -> list[TensorEntry]:
    """Assign data offsets: widest dtypes first (keeps every tensor aligned), input order otherwise."""
    items = list(entries)
    order = sorted(range(len(items)), key=lambda i: (-DTYPE_SIZE[items[i][1]], i))
    out: list[TensorEntry] = []
    offset = 0
    for i in order:
        name, dtype, shape = items[i]
        entry = TensorEntry(name, dtype, tuple(shape))
        out.append(TensorEntry(name, dtype, tuple(shape), offset, offset + entry.nbytes))
        offset += entry.nbytes
    return out


def encode_header(layout: list[TensorEntry], metadata: dict[str, str] | None = None) -> bytes:
    """Header bytes (length prefix included), padded with spaces to a multiple of 8 like safetensors does."""
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    for e in layout:
        header[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [e.begin, e.end]}
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """Raw little-endian bytes of a CPU tensor without an extra copy when it is already contiguous."""
    flat = tensor.detach().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


class StreamingWriter:
    """Write one safetensors file whose header is fixed in advance; tensors must arrive in layout order."""

    def __init__(self, stream: BinaryIO, layout: list[TensorEntry], metadata: dict[str, str] | None = PT_METADATA):
        self._stream = stream
        self._layout = layout
        self._next = 0
        stream.write(encode_header(layout, metadata))

    def write(self, name: str, tensor: torch.Tensor) -> int:
        entry = self._layout[self._next]
        if name != entry.name:
            msg = f"internal error: wrote {name!r} where the header expects {entry.name!r}"
            raise RuntimeError(msg)
        dtype = TORCH_TO_DTYPE.get(tensor.dtype)
        if dtype != entry.dtype or tuple(tensor.shape) != entry.shape:
            msg = (
                f"tensor {name!r} is {dtype} {tuple(tensor.shape)}, header promised {entry.dtype} {entry.shape}; "
                "the source changed during conversion"
            )
            raise CheckpointFormatError(msg)
        self._stream.write(tensor_bytes(tensor))
        self._next += 1
        return entry.nbytes

    def begin(self, name: str, dtype: str, shape: tuple[int, ...]) -> None:
        """Start the next tensor, to be written in pieces with ``write_chunk`` and closed with ``end``."""
        entry = self._layout[self._next]
        if (name, dtype, tuple(shape)) != (entry.name, entry.dtype, entry.shape):
            msg = f"internal error: wrote {name!r} {dtype} {shape} where the header expects {entry}"
            raise RuntimeError(msg)
        self._pending = entry.nbytes

    def write_chunk(self, data: memoryview) -> None:
        self._stream.write(data)
        self._pending -= data.nbytes

    def end(self) -> None:
        if self._pending:
            msg = f"internal error: {self._layout[self._next].name!r} is {self._pending} bytes short"
            raise RuntimeError(msg)
        self._next += 1

    def close_check(self) -> None:
        if self._next != len(self._layout):
            msg = f"internal error: {len(self._layout) - self._next} tensors left unwritten"
            raise RuntimeError(msg)
