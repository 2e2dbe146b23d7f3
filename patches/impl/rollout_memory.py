"""Free and restore a vLLM rollout's device memory by hand: parameter storage, KV caches, MLA absorbed matrices.

Used by ``rollout_vllm.NPUOffloadVLLMRollout``; kept apart so each operation can be tested on plain torch modules.
The objects handled mirror vLLM 0.9.1 / vllm-ascend 0.9.1:

- the model: ``NPUModelRunner.get_model()`` (an ``nn.Module``; parameters via ``named_parameters()``);
- attention layers: ``vllm_config.compilation_config.static_forward_context[layer_name]`` (``vllm.attention.Attention``)
  with ``.kv_cache`` (a list, one entry per virtual engine) and ``.impl``;
- the runner's own list ``NPUModelRunner.kv_caches`` (``bind_kv_cache`` refuses to bind into a non-empty list);
- ``AscendAttentionBackendImpl.key_cache/value_cache`` (non-MLA; cached on first forward and never refreshed);
- ``AscendMLAImpl.W_UV`` / ``W_UK_T`` (MLA; derived from ``kv_b_proj`` by ``process_weights_after_loading``).

Nothing here keeps a host copy: parameter storage is resized to zero and later re-allocated uninitialised, to be
refilled by the weight sync.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

#: Matrices vllm-ascend 0.9.1 ``AscendMLAImpl.process_weights_after_loading`` derives from ``kv_b_proj``.
MLA_DERIVED_MATRICES = ("W_UV", "W_UK_T")
#: Attributes where the non-MLA ``AscendAttentionBackendImpl`` caches the KV tensors it was first called with.
IMPL_KV_CACHE_ATTRS = ("key_cache", "value_cache")


@dataclass(frozen=True)
class HeldStorage:
    """A parameter whose device storage was released, and the byte size to re-allocate."""

    name: str
    tensor: torch.Tensor
    nbytes: int


def storage_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (nested lists/tuples allowed; shared storage counted once)."""
    seen: set[int] = set()
    total = 0
    for tensor in _flatten(tensors):
        storage = tensor.untyped_storage()
        if storage.nbytes() == 0 or storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def release_parameter_storage(model: torch.nn.Module) -> list[HeldStorage]:
    """Resize every parameter's storage to zero bytes; return what must be re-allocated.

    The ``Parameter`` objects, their shapes and any views stay valid, so vLLM's weight loaders and layer references
    keep working. Reading a released parameter is undefined (kernels do not bound-check storage): callers must
    restore first, which the rollout enforces before loading weights and before generating.
    """
    held: list[HeldStorage] = []
    seen: set[int] = set()
    for name, param in model.named_parameters():
        storage = param.untyped_storage()
        nbytes = storage.nbytes()
        if nbytes == 0 or storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        held.append(HeldStorage(name, param, nbytes))
        storage.resize_(0)
    return held


def restore_parameter_storage(held: Iterable[HeldStorage]) -> int:
    """Re-allocate (uninitialised) the storages released by ``release_parameter_storage``; return bytes allocated."""
    total = 0
    for item in held:
        item.tensor.untyped_storage().resize_(item.nbytes)
        total += item.nbytes
    return total


def attention_layers(forward_context: Mapping[str, Any], layer_names: Iterable[str]) -> list[tuple[str, Any]]:
    """The attention layers named by the KV-cache configs, looked up in vLLM's static forward context."""
    layers = []
    for name in layer_names:
        layer = forward_context.get(name)
        if layer is None or not hasattr(layer, "kv_cache"):
            msg = (
                f"KV-cache layer {name!r} is not an attention layer of the static forward context "
                f"(known: {sorted(forward_context)[:5]}...); the engine's KV-cache configs do not match its model"
            )
            raise RuntimeError(msg)
        layers.append((name, layer))
    return layers


def free_kv_caches(runner: Any, layers: Iterable[tuple[str, Any]]) -> int:
    """Drop every reference vLLM keeps to the KV-cache tensors; return the bytes they occupied."""
    layers = list(layers)
    freed = storage_bytes([runner.kv_caches, *(layer.kv_cache for _, layer in layers)])
    for _, layer in layers:
        layer.kv_cache = [torch.tensor([]) for _ in layer.kv_cache]
        impl = getattr(layer, "impl", None)
        for attr in IMPL_KV_CACHE_ATTRS:
            if impl is not None and hasattr(impl, attr):
                setattr(impl, attr, None)
    runner.kv_caches = []
    return freed


def mla_impls(forward_context: Mapping[str, Any]) -> list[Any]:
    """Attention impls that cache MLA matrices derived from the weights (vllm-ascend ``AscendMLAImpl``)."""
    impls = []
    for layer in forward_context.values():
        impl = getattr(layer, "impl", None)
        if callable(getattr(impl, "process_weights_after_loading", None)) and all(
            hasattr(impl, attr) for attr in MLA_DERIVED_MATRICES
        ):
            impls.append(impl)
    return impls


def drop_mla_matrices(impls: Iterable[Any]) -> int:
    """Release the derived MLA matrices (they are recomputed after the next weight load); return bytes freed."""
    impls = list(impls)
    freed = storage_bytes(getattr(impl, attr) for impl in impls for attr in MLA_DERIVED_MATRICES)
    for impl in impls:
        for attr in MLA_DERIVED_MATRICES:
            setattr(impl, attr, None)
    return freed


def recompute_mla_matrices(impls: Iterable[Any], act_dtype: torch.dtype) -> int:
    """Re-derive ``W_UV``/``W_UK_T`` from the freshly loaded ``kv_b_proj``, as vLLM's loader does after loading."""
    count = 0
    for impl in impls:
        for attr in MLA_DERIVED_MATRICES:
            setattr(impl, attr, None)
        impl.process_weights_after_loading(act_dtype)
        count += 1
    return count


def _flatten(items: Iterable[Any]) -> Iterable[torch.Tensor]:
    for item in items:
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, (list, tuple)):
            yield from _flatten(item)
        elif item is not None:
            msg = f"expected tensors or nested lists/tuples of tensors, got {type(item).__name__}"
            raise TypeError(msg)
