"""``check-model --layers N``: the first N decoder layers of both checkpoints, for models too large to load whole.

A layer's computation depends only on the layers before it, so the first N layers plus the embedding, the final
norm and the output layer form a complete, smaller model whose logits must agree between the two implementations
exactly as the full model's do. For DeepSeek-V3 N = first_k_dense_replace + 1 (4) covers every kind of layer: the
dense ones and one MoE layer with group-limited routing, about 15 B of the 671 B parameters.

Megatron side: verl builds DeepSeek-V3 with a list-valued ``moe_layer_freq``, so megatron-core 0.12.1's
``TransformerBlock.sharded_state_dict`` treats the layers as non-homogeneous and keys every layer by its global
number (``decoder.layers.<L>.*``, no stacked layer axis). A model built with N layers asks for the keys of layers
0..N-1 with the checkpoint's own shapes, and ``dist_checkpointing.load`` (``ASSUME_OK_UNEXPECTED``, as verl's loader
calls it) reads only the requested entries: the other layers stay on disk. This module checks that premise against
the checkpoint's metadata before loading, so a stacked or incomplete checkpoint is a clear error instead of a DCP
traceback. HF side: the tensors the truncated ``DeepseekV3ForCausalLM`` needs, read one by one with safetensors'
lazy ``safe_open`` through the index.
"""

from __future__ import annotations

import copy
import json
import math
import re
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r1_ascend.weights.errors import CheckpointFormatError, WeightsError
from r1_ascend.weights.progress import Progress

INDEX_NAME = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_DIST_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.")
_GB = 1e9
#: The process without the models: torch, megatron-core, verl and transformers imported (0.7 GB measured) + margin.
_BASELINE_BYTES = 1.5e9


class LayerSelectionError(WeightsError):
    """``--layers`` asks for layers the model or a checkpoint does not have."""


def default_layers(hf_config: Mapping[str, Any]) -> int:
    """The dense layers plus one MoE layer: the smallest prefix with every kind of layer in it."""
    return min(int(hf_config.get("first_k_dense_replace", 0)) + 1, int(hf_config["num_hidden_layers"]))


def resolve_layers(requested: int | None, hf_config: Mapping[str, Any]) -> int:
    """``requested`` checked against the config's layer count; None means :func:`default_layers`."""
    total = int(hf_config["num_hidden_layers"])
    layers = default_layers(hf_config) if requested is None else requested
    if layers < 1:
        msg = f"--layers {layers}: at least one decoder layer is needed (the model has {total})"
        raise LayerSelectionError(msg)
    if layers > total:
        msg = f"--layers {layers}: the model has only {total} decoder layers (config.json num_hidden_layers)"
        raise LayerSelectionError(msg)
    return layers


@dataclass(frozen=True)
class LoadEstimate:
    """What a layer-truncated check reads and holds, from the config alone (before anything is allocated)."""

    layers: int
    parameters: int
    stored_bytes: int  # read from each checkpoint (BF16 weights, FP32 router bias)
    model_bytes: int  # one model's parameters in the compute dtype

    @property
    def peak_bytes(self) -> int:
        """Both models resident; reads are one tensor (HF) or one stored chunk (DCP) at a time on top."""
        return 2 * self.model_bytes

    def describe(self, dtype_name: str) -> str:
        plan = 1.1 * self.peak_bytes + _BASELINE_BYTES
        return (
            f"check-model --layers {self.layers}: {_count(self.parameters)} parameters; reads "
            f"{_bytes(self.stored_bytes)} from each checkpoint; the two {dtype_name} models hold "
            f"{_bytes(self.peak_bytes)}; plan for {_bytes(plan)} of free RAM"
        )


def _count(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def _bytes(n: float) -> str:
    return f"{n / _GB:.1f} GB" if n >= _GB else f"{n / 1e6:.1f} MB"


def estimate(hf_config: Mapping[str, Any], layers: int, dtype_bytes: int) -> LoadEstimate:
    """Parameters and bytes of the first ``layers`` layers plus embedding, final norm and output layer."""
    from r1_ascend.weights.inventory import checkpoint_specs

    specs = checkpoint_specs({**hf_config, "num_hidden_layers": layers}, mtp=False)
    params = sum(math.prod(spec.shape) for spec in specs)
    stored = sum(math.prod(spec.shape) * (4 if spec.kind == "f32" else 2) for spec in specs)
    return LoadEstimate(layers, params, stored, params * dtype_bytes)


def truncated_config(hf_config: Any, layers: int) -> Any:
    """A copy of the transformers config with only the first ``layers`` decoder layers (MTP stays off)."""
    out = copy.deepcopy(hf_config)
    out.num_hidden_layers = layers
    return out


# --- Megatron dist checkpoint -----------------------------------------------------------------------------------


def dist_metadata(dist_ckpt: Path) -> Any:
    """The checkpoint's DCP metadata (``.metadata``): keys and global shapes, no tensor data."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        return FileSystemReader(str(dist_ckpt)).read_metadata()
    except (OSError, EOFError, ValueError) as exc:
        msg = f"{dist_ckpt}: cannot read the DCP metadata (.metadata): {exc}"
        raise CheckpointFormatError(msg) from exc


def dist_layers(metadata: Any, dist_ckpt: Path) -> set[int]:
    """Global layer numbers stored in the checkpoint; refuses a stacked-layer layout."""
    keys = metadata.state_dict_metadata
    stacked = sorted(k for k in keys if k.startswith("decoder.layers.") and not _DIST_LAYER_RE.match(k))
    if stacked:
        msg = (
            f"{dist_ckpt} stores decoder layers stacked along a layer axis ({stacked[0]!r}, ...): that is megatron's "
            "layout for homogeneous layers, while verl builds DeepSeek-V3 with per-layer keys (list-valued "
            "moe_layer_freq). The run's actor cannot load it either; convert again with r1-ascend convert-weights "
            "to-megatron"
        )
        raise CheckpointFormatError(msg)
    return {int(m.group(1)) for k in keys if (m := _DIST_LAYER_RE.match(k))}


def check_dist_layers(dist_ckpt: Path, layers: int) -> Any:
    """The checkpoint holds layers 0..layers-1; returns its metadata for :func:`check_dist_keys`."""
    metadata = dist_metadata(dist_ckpt)
    present = dist_layers(metadata, dist_ckpt)
    missing = [i for i in range(layers) if i not in present]
    if missing:
        have = f"layers 0..{max(present)} ({len(present)} in all)" if present else "no decoder layers"
        msg = f"{dist_ckpt} lacks decoder layer(s) {missing} needed by --layers {layers}; it has {have}"
        raise LayerSelectionError(msg)
    return metadata


def _requested(sharded: Any) -> Iterator[tuple[str, tuple[int, ...] | None]]:
    """(stored key, global shape or None for objects) of every entry a sharded state dict asks for."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, ShardedTensorFactory

    items = nested_values(sharded) if isinstance(sharded, (dict, list)) else [sharded]
    for item in items:
        if isinstance(item, ShardedTensorFactory):
            yield from _requested(item.build())
        elif isinstance(item, ShardedTensor):
            yield item.key, tuple(item.global_shape)
        elif isinstance(item, ShardedObject):
            yield item.unique_key, None


def check_dist_keys(sharded_state_dict: Any, metadata: Any, dist_ckpt: Path) -> int:
    """Every entry the truncated model asks for is stored with that global shape; returns the bytes to read."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    stored = metadata.state_dict_metadata
    missing, wrong, sizes = [], [], {}
    for key, shape in _requested(sharded_state_dict):
        entry = stored.get(key)
        if entry is None:
            missing.append(key)
        elif shape is not None and isinstance(entry, TensorStorageMetadata):
            if tuple(entry.size) != shape:
                wrong.append(f"{key} is {list(entry.size)} in the checkpoint, the model has {list(shape)}")
            sizes[key] = entry.size.numel() * entry.properties.dtype.itemsize  # once per key, not per shard
    if missing or wrong:
        msg = (
            f"{dist_ckpt} does not match the model's first layers: missing {sorted(set(missing))[:6]}, "
            f"mis-shaped {wrong[:4]}. Was it converted from this HF checkpoint (r1-ascend convert-weights)?"
        )
        raise CheckpointFormatError(msg)
    return sum(sizes.values())


def load_dist_layers(actor: list[Any], dist_ckpt: Path, layers: int, metadata: Any) -> None:
    """verl's loader on the truncated actor, after checking what it will ask the checkpoint for."""
    from verl.utils.megatron_utils import unwrap_model
    from verl.utils.model import load_mcore_dist_weights

    nbytes = check_dist_keys(unwrap_model(actor[0]).sharded_state_dict(), metadata, dist_ckpt)
    note(f"check-model: reading layers 0..{layers - 1} of {dist_ckpt} ({nbytes / _GB:.2f} GB) through verl's loader")
    start = time.monotonic()
    load_mcore_dist_weights(actor, str(dist_ckpt), is_value_model=False)
    note(f"check-model: Megatron weights loaded in {time.monotonic() - start:.1f} s")


# --- HF safetensors ---------------------------------------------------------------------------------------------


def weight_map(hf_dir: Path) -> dict[str, str]:
    """Tensor name -> shard file, from the index (or the single ``model.safetensors``)."""
    from safetensors import safe_open

    index = hf_dir / INDEX_NAME
    if index.is_file():
        try:
            return dict(json.loads(index.read_text(encoding="utf-8"))["weight_map"])
        except (json.JSONDecodeError, KeyError) as exc:
            msg = f"{index} is not a safetensors index ({exc})"
            raise CheckpointFormatError(msg) from exc
    if (hf_dir / SINGLE_FILE).is_file():
        with safe_open(str(hf_dir / SINGLE_FILE), framework="pt") as f:
            return dict.fromkeys(f.keys(), SINGLE_FILE)
    msg = f"{hf_dir} has neither {INDEX_NAME} nor {SINGLE_FILE}"
    raise CheckpointFormatError(msg)


def _missing_layers_message(hf_dir: Path, missing: list[str], layers: int) -> str:
    return (
        f"{hf_dir} lacks {len(missing)} tensor(s) the first {layers} layers need: {missing[:6]}"
        f"{f' and {len(missing) - 6} more' if len(missing) > 6 else ''}; is the download complete (index and every "
        "shard)?"
    )


def check_hf_layers(hf_dir: Path, hf_config: Mapping[str, Any], layers: int) -> None:
    """The index lists every tensor of layers 0..layers-1, the embedding, final norm and output layer."""
    from r1_ascend.weights.inventory import checkpoint_specs

    where = weight_map(hf_dir)
    needed = checkpoint_specs({**hf_config, "num_hidden_layers": layers}, mtp=False)
    missing = [spec.name for spec in needed if spec.name not in where]
    if missing:
        raise LayerSelectionError(_missing_layers_message(hf_dir, missing, layers))


def load_hf_layers(hf_dir: Path, config: Any, dtype: Any) -> Any:
    """transformers' ``DeepseekV3ForCausalLM`` with ``config``'s (truncated) layers, weights read tensor by tensor.

    Built without random initialisation (every persistent tensor is then read from the checkpoint, or it is an
    error), in the compute dtype directly, so the peak is the model plus one tensor.
    """
    from safetensors import safe_open
    from transformers import DeepseekV3ForCausalLM
    from transformers.modeling_utils import no_init_weights

    where = weight_map(hf_dir)
    with no_init_weights():
        model = DeepseekV3ForCausalLM._from_config(config, torch_dtype=dtype)
    targets = model.state_dict()
    missing = sorted(n for n in targets if n not in where)
    if missing:
        raise LayerSelectionError(_missing_layers_message(hf_dir, missing, config.num_hidden_layers))
    by_file: dict[str, list[str]] = {}
    for name in targets:
        by_file.setdefault(where[name], []).append(name)
    total = sum(t.numel() * t.element_size() for t in targets.values())
    progress = Progress("check-model: HF weights", total)
    for file in sorted(by_file):
        with safe_open(str(hf_dir / file), framework="pt") as f:
            stored = set(f.keys())
            for name in by_file[file]:
                _copy_tensor(f, stored, name, targets[name], hf_dir / file)
                progress.add(targets[name].numel() * targets[name].element_size())
    progress.finish()
    return model


def peak_rss_gb() -> float:
    """This process's peak resident size so far (Linux reports kilobytes)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / _GB


def _copy_tensor(handle: Any, stored: set[str], name: str, target: Any, shard: Path) -> None:
    if name not in stored:
        msg = f"{INDEX_NAME} places {name!r} in {shard.name}, but that shard does not contain it"
        raise CheckpointFormatError(msg)
    tensor = handle.get_tensor(name)
    if tensor.element_size() == 1:
        msg = f"{shard}: {name} is stored as {tensor.dtype}; --hf-dir must be the BF16 checkpoint (convert-weights)"
        raise CheckpointFormatError(msg)
    if tuple(tensor.shape) != tuple(target.shape):
        msg = f"{shard}: {name} has shape {list(tensor.shape)}, the model expects {list(target.shape)}"
        raise CheckpointFormatError(msg)
    target.copy_(tensor)


def note(message: str) -> None:
    """Progress on stderr, so stdout stays the JSON result."""
    print(message, file=sys.stderr, flush=True)
