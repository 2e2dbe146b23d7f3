"""Read an HF safetensors checkpoint one tensor at a time (memory-mapped), dequantising FP8 on the fly.

Scales are always resolved through the index, so a ``_scale_inv`` stored in another shard is found; a FP8 weight
without a scale is an error, never silently kept as FP8.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from r1_ascend.weights.errors import CheckpointFormatError
from r1_ascend.weights.fp8 import SCALE_SUFFIX, dequantize_fp8_blockwise, dequantize_rows
from r1_ascend.weights.safetensors_io import DTYPE_TO_TORCH, Header, TensorEntry, read_header

INDEX_NAME = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")


def layer_index(name: str) -> int | None:
    match = _LAYER_RE.match(name)
    return int(match.group(1)) if match else None


def is_mtp_tensor(name: str, num_hidden_layers: int) -> bool:
    """MTP layers sit after the main stack (index >= num_hidden_layers; 61 for DeepSeek-V3)."""
    idx = layer_index(name)
    return idx is not None and idx >= num_hidden_layers


def load_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        msg = f"{path} not found; expected an HF checkpoint directory with config.json and {INDEX_NAME}"
        raise CheckpointFormatError(msg) from exc
    except json.JSONDecodeError as exc:
        msg = f"{path} is not valid JSON ({exc}); re-download it"
        raise CheckpointFormatError(msg) from exc


class HFCheckpoint:
    """An HF checkpoint directory: index, shard headers (validated against file sizes), lazy tensor reads."""

    def __init__(self, path: str | Path, *, max_open: int = 4):
        self.path = Path(path)
        if not self.path.is_dir():
            msg = f"{self.path} is not a directory; pass the HF checkpoint directory"
            raise CheckpointFormatError(msg)
        self.config = load_json(self.path / "config.json")
        index_path = self.path / INDEX_NAME
        if index_path.exists():
            index = load_json(index_path)
            if "weight_map" not in index:
                msg = f"{index_path} has no 'weight_map'; it is not a safetensors index"
                raise CheckpointFormatError(msg)
            self.weight_map: dict[str, str] = dict(index["weight_map"])
        elif (self.path / SINGLE_FILE).exists():
            self.weight_map = dict.fromkeys(read_header(self.path / SINGLE_FILE).entries, SINGLE_FILE)
        else:
            msg = f"{self.path} has neither {INDEX_NAME} nor {SINGLE_FILE}"
            raise CheckpointFormatError(msg)
        self.headers: dict[str, Header] = {}
        for file in sorted(set(self.weight_map.values())):
            shard = self.path / file
            if not shard.exists():
                msg = f"{shard} is listed in {INDEX_NAME} but missing; the download is incomplete"
                raise CheckpointFormatError(msg)
            self.headers[file] = read_header(shard)
        for name, file in self.weight_map.items():
            if name not in self.headers[file].entries:
                msg = f"{INDEX_NAME} places {name!r} in {file}, but that shard does not contain it"
                raise CheckpointFormatError(msg)
        self._handles: OrderedDict[str, int] = OrderedDict()
        self._max_open = max_open

    @property
    def num_hidden_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def files(self) -> list[str]:
        return sorted(self.headers)

    def entry(self, name: str) -> TensorEntry:
        return self.headers[self.weight_map[name]].entries[name]

    def inventory(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """name -> (dtype, shape) of every indexed tensor, for the architecture check."""
        return {n: (self.entry(n).dtype, self.entry(n).shape) for n in self.weight_map}

    @property
    def quantized(self) -> bool:
        """Holds block-FP8 weights (any F8_E4M3 tensor)."""
        return any(self.entry(n).dtype == "F8_E4M3" for n in self.weight_map)

    def check_architecture(self, *, mtp: bool | None = None, what: str = "checkpoint") -> None:
        """Check the indexed tensors against the config's inventory (FP8 or BF16 as stored).

        ``mtp`` None accepts the MTP layers either complete or absent (a BF16 copy may have dropped them).
        """
        from r1_ascend.weights.inventory import check_inventory, expected_tensors, has_mtp

        if mtp is None:
            mtp = has_mtp(self.weight_map, self.config)
        expected = expected_tensors(self.config, fp8=self.quantized, mtp=mtp)
        check_inventory(self.inventory(), expected, f"{what} {self.path}")

    def is_fp8(self, name: str) -> bool:
        return self.entry(name).dtype == "F8_E4M3"

    def names(self, *, include_scales: bool = False, include_mtp: bool = True) -> list[str]:
        out = []
        for name in self.weight_map:
            if not include_scales and name.endswith(SCALE_SUFFIX):
                continue
            if not include_mtp and is_mtp_tensor(name, self.num_hidden_layers):
                continue
            out.append(name)
        return out

    def _fd(self, file: str) -> int:
        fd = self._handles.pop(file, None)
        if fd is None:
            fd = os.open(self.path / file, os.O_RDONLY)
            while len(self._handles) >= self._max_open:
                os.close(self._handles.popitem(last=False)[1])
        self._handles[file] = fd
        return fd

    def read_into(self, name: str, offset: int, buffer: memoryview) -> None:
        """Fill ``buffer`` with the stored bytes of ``name`` from byte ``offset`` on (plain reads, no mmap).

        Reading into private memory instead of mapping the shard keeps the process's resident size at the
        buffers it holds: mapped shard pages would count towards RSS (4.3 GB per V3 shard) until unmapped.
        """
        if name not in self.weight_map:
            msg = f"tensor {name!r} not found in {self.path / INDEX_NAME}"
            raise CheckpointFormatError(msg)
        file = self.weight_map[name]
        entry = self.headers[file].entries[name]
        start = self.headers[file].data_start + entry.begin + offset
        if offset + len(buffer) > entry.nbytes:
            msg = f"internal error: read past the end of {name!r}"
            raise RuntimeError(msg)
        fd, done = self._fd(file), 0
        while done < len(buffer):
            n = os.preadv(fd, [buffer[done:]], start + done)
            if n == 0:
                msg = f"{self.path / file} ended while reading {name!r}; the shard is truncated, re-download it"
                raise CheckpointFormatError(msg)
            done += n

    def raw(self, name: str) -> torch.Tensor:
        """The tensor exactly as stored (FP8 stays FP8)."""
        if name not in self.weight_map:
            msg = f"tensor {name!r} not found in {self.path / INDEX_NAME}"
            raise CheckpointFormatError(msg)
        entry = self.entry(name)
        return self._read(name, entry.shape, 0, entry.nbytes)

    def _read(self, name: str, shape: tuple[int, ...], offset: int, nbytes: int) -> torch.Tensor:
        data = torch.empty(nbytes, dtype=torch.uint8)
        if nbytes:
            self.read_into(name, offset, memoryview(data.numpy()))
        return data.view(DTYPE_TO_TORCH[self.entry(name).dtype]).reshape(shape)

    def raw_rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) of a stored tensor, read without loading the rest."""
        entry = self.entry(name)
        row_bytes = entry.nbytes // entry.shape[0] if entry.shape and entry.shape[0] else 0
        return self._read(name, (stop - start, *entry.shape[1:]), start * row_bytes, (stop - start) * row_bytes)

    def scale_name(self, name: str) -> str:
        scale = name + SCALE_SUFFIX
        if scale not in self.weight_map:
            msg = (
                f"FP8 tensor {name!r} has no {scale!r} in {INDEX_NAME}; without it the weight cannot be "
                "dequantised. Re-download the checkpoint (index and all shards)."
            )
            raise CheckpointFormatError(msg)
        return scale

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor in its high-precision form: FP8 weights dequantised to BF16, everything else as stored."""
        if self.is_fp8(name):
            return dequantize_fp8_blockwise(self.raw(name), self.raw(self.scale_name(name)), name=name)
        return self.raw(name)

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows of ``tensor(name)``, reading and dequantising only those rows."""
        if self.is_fp8(name):
            codes = self.raw_rows(name, start, stop)
            scale = self.raw(self.scale_name(name))
            out = torch.empty(tuple(codes.shape), dtype=torch.bfloat16)
            return dequantize_rows(codes, scale, start, out)
        return self.raw_rows(name, start, stop)

    def close(self) -> None:
        while self._handles:
            os.close(self._handles.popitem()[1])

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
