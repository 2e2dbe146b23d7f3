"""Make a BF16 DeepSeek-V3 checkpoint acceptable to verl's Megatron path and to the NPU rollout.

Edits (and nothing else): delete ``quantization_config``, set ``num_nextn_predict_layers`` to 0 (verl asserts it),
``torch_dtype`` to bfloat16; drop the MTP layer's tensors (index ``num_hidden_layers``) from the shards and the
index. Shards are rewritten first, the index next, the config last, each atomically, so a crash at any point leaves
a directory the command can simply be rerun on. The FP8 index is never copied over the rewritten one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import safe_open

from r1_ascend.atomic import atomic_open, atomic_write_json
from r1_ascend.weights.errors import CheckpointFormatError
from r1_ascend.weights.inventory import check_inventory, expected_tensors
from r1_ascend.weights.outdir import copy_side_files
from r1_ascend.weights.safetensors_io import (
    PT_METADATA,
    StreamingWriter,
    ordered_layout,
    read_header,
)
from r1_ascend.weights.source import INDEX_NAME, is_mtp_tensor, load_json

log = logging.getLogger(__name__)

NEVER_COPIED = {INDEX_NAME, "config.json"}


def fixed_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config the NPU stack accepts; all other keys unchanged."""
    out = dict(config)
    out.pop("quantization_config", None)
    out["num_nextn_predict_layers"] = 0
    out["torch_dtype"] = "bfloat16"
    return out


@dataclass
class FixResult:
    mtp_tensors_dropped: int
    shards_rewritten: int
    shards_removed: int
    side_files_copied: list[str]


def _rewrite_without(path: Path, drop: set[str]) -> bool:
    """Stream ``path`` into a temp file without ``drop``; returns False (and deletes it) if nothing is left."""
    header = read_header(path)
    keep = [(e.name, e.dtype, e.shape) for e in header.entries.values() if e.name not in drop]
    if not keep:
        path.unlink()
        return False
    layout = ordered_layout(keep)
    with safe_open(str(path), framework="pt", device="cpu") as reader, atomic_open(path) as f:
        writer = StreamingWriter(f, layout, header.metadata or PT_METADATA)
        for entry in layout:
            writer.write(entry.name, reader.get_tensor(entry.name))
        writer.close_check()
    return True


def _check_main_inventory(
    root: Path, config: dict[str, Any], weight_map: dict[str, str], headers: dict, mtp: set[str]
) -> None:
    """Before touching anything: the tensors that stay (all but MTP) are exactly the BF16 architecture."""
    have: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, file in weight_map.items():
        if name in mtp:
            continue
        if file not in headers or name not in headers[file].entries:
            msg = (
                f"{INDEX_NAME} places {name!r} in {file}, but {root / file} does not hold it; re-convert the checkpoint"
            )
            raise CheckpointFormatError(msg)
        entry = headers[file].entries[name]
        have[name] = (entry.dtype, entry.shape)
    check_inventory(have, expected_tensors(config, fp8=False, mtp=False), f"BF16 checkpoint {root}")


def fix_checkpoint(path: str | Path, *, copy_side_files_from: str | Path | None = None) -> FixResult:
    """Apply the config edits and drop MTP tensors in place (idempotent)."""
    root = Path(path)
    config = load_json(root / "config.json")
    n_layers = int(config["num_hidden_layers"])
    index_path = root / INDEX_NAME
    index = load_json(index_path)
    weight_map: dict[str, str] = index["weight_map"]
    headers = {file: read_header(root / file) for file in sorted(set(weight_map.values())) if (root / file).exists()}
    fp8 = [
        n for f, h in headers.items() for n, e in h.entries.items() if e.dtype == "F8_E4M3" and weight_map.get(n) == f
    ]
    if fp8:
        msg = (
            f"{root} still holds FP8 weights (e.g. {fp8[0]!r}); removing quantization_config would make them be "
            "read as BF16. Run `r1-ascend convert-weights fp8-to-bf16` first and fix the BF16 output."
        )
        raise CheckpointFormatError(msg)
    mtp = {n for n in weight_map if is_mtp_tensor(n, n_layers)}
    _check_main_inventory(root, config, weight_map, headers, mtp)
    rewritten = removed = 0
    for file, header in headers.items():
        drop = mtp & set(header.entries)
        if drop:
            if _rewrite_without(root / file, drop):
                rewritten += 1
            else:
                removed += 1
    new_map = {n: f for n, f in weight_map.items() if n not in mtp}
    total = 0
    for file in sorted(set(new_map.values())):
        header = read_header(root / file)
        missing = [n for n, f in new_map.items() if f == file and n not in header.entries]
        if missing:
            msg = f"{root / file} lacks {missing[:3]} listed in {INDEX_NAME}; the checkpoint is incomplete"
            raise CheckpointFormatError(msg)
        total += sum(e.nbytes for n, e in header.entries.items() if new_map.get(n) == file)
    new_index = {"metadata": {**index.get("metadata", {}), "total_size": total}, "weight_map": new_map}
    atomic_write_json(index_path, new_index)
    copied = []
    if copy_side_files_from is not None:
        copied = copy_side_files(Path(copy_side_files_from), root, skip=NEVER_COPIED)
    atomic_write_json(root / "config.json", fixed_config(config))
    log.info("config fixed; %d MTP tensors dropped (%d shards rewritten, %d removed)", len(mtp), rewritten, removed)
    return FixResult(len(mtp), rewritten, removed, copied)
