"""Which part of which HF tensor each tensor of vLLM's DeepSeek-V3 model holds on this rank (weight-sync check).

Written against the parameter layout of vLLM 0.9.1 and vllm-ascend 0.9.1 (``vllm_ascend/models/deepseek_v2.py``,
``vllm/model_executor/layers/{linear,vocab_parallel_embedding}.py``, ``fused_moe/layer.py``, ``vllm_ascend/ops/
{fused_moe,lmhead}.py``, ``vllm_ascend/attention/mla_v1.py``), from the classes' shapes and parallel sizes, never
from their weight loaders, so a loader that misplaces a tensor disagrees with it:

- ``ColumnParallelLinear`` (``q_b_proj``, ``kv_b_proj``): rows ``[r * O / tp, (r + 1) * O / tp)`` of its tensor;
- ``MergedColumnParallelLinear`` (``gate_up_proj`` of the dense MLP and the shared experts): the same rows of
  ``gate_proj`` then of ``up_proj`` (vLLM's stacked mapping ``gate_up_proj = gate_proj || up_proj``); vllm-ascend's
  replicated variant (``CustomDeepseekV2MergedReplicatedLinear``) holds both whole;
- ``RowParallelLinear`` (``o_proj``, ``down_proj``): columns ``[r * I / tp, (r + 1) * I / tp)``;
- ``ReplicatedLinear`` (``q_a_proj``, ``kv_a_proj_with_mqa``, the router ``gate``), norms, the router's
  ``e_score_correction_bias``: whole;
- ``VocabParallelEmbedding`` / vllm-ascend's ``CustomParallelLMHead`` (over its LM-head group): vocabulary rows
  ``[r * P / tp, ...)`` up to the real vocabulary (``P``: padded to ``padding_size``), the padding rows hold none;
- ``FusedMoE`` (``AscendFusedMoE``): EP rank ``e`` holds experts ``[e * E / ep, (e + 1) * E / ep)`` in slots
  ``0..E/ep-1``; slot ``j``'s ``w13_weight[j]`` is ``gate_proj || up_proj`` (rows ``[t * I / mtp, ...)`` of each,
  ``t`` the MoE's TP rank), ``w2_weight[j]`` columns ``[t * I / mtp, ...)`` of ``down_proj``; its expert map must
  say so too;
- MLA (``AscendMLAImpl.process_weights_after_loading``): ``W_UK_T[h, n, l] = kv_b_proj[(h0 + h) * (N + V) + n, l]``
  and ``W_UV[h, l, v] = kv_b_proj[(h0 + h) * (N + V) + N + v, l]`` over the layer's heads ``h0 + h``.

Every parameter of the model must fall under one of these rules (else :class:`OwnershipError`), so a parameter no
sync writes cannot go unchecked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

#: vLLM's stacked parameters of DeepSeek (``DeepseekV2ForCausalLM.load_weights``' ``stacked_params_mapping``).
MERGED = {"gate_up_proj": ("gate_proj", "up_proj")}
#: The MLA matrices vllm-ascend derives from ``kv_b_proj`` (``rollout_memory.MLA_DERIVED_MATRICES``).
MLA_MATRICES = ("W_UK_T", "W_UV")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class OwnershipError(RuntimeError):
    """vLLM's model has a parameter or layout this rule does not cover: the check cannot vouch for it."""


@dataclass(frozen=True)
class Region:
    """A region of an HF tensor: its rows ``rows`` (None: a 1-D tensor), of each ``period`` of them (one head's
    rows) those in ``take``, and its columns ``cols``. Views of it have the leading axes ``[groups, take]`` when
    grouped, else ``[rows]``, and the columns last."""

    rows: tuple[int, int] | None
    cols: tuple[int, int]
    period: int = 0
    take: tuple[int, int] = (0, 0)

    @property
    def shape(self) -> tuple[int, ...]:
        cols = self.cols[1] - self.cols[0]
        if self.rows is None:
            return (cols,)
        count = self.rows[1] - self.rows[0]
        if self.period:
            return (count // self.period, self.take[1] - self.take[0], cols)
        return (count, cols)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def of(self, tensor: torch.Tensor) -> torch.Tensor:
        """This region of an HF-shaped ``tensor`` (a view)."""
        if self.rows is None:
            return tensor[self.cols[0] : self.cols[1]]
        part = tensor[self.rows[0] : self.rows[1], self.cols[0] : self.cols[1]]
        if self.period:
            return part.unflatten(0, (-1, self.period))[:, self.take[0] : self.take[1]]
        return part

    def row_weights(self, rows: torch.Tensor | None) -> torch.Tensor | None:
        """This region of the tensor's row weights (``a``), shaped as a view's leading axes."""
        if self.rows is None or rows is None:
            return None
        part = rows[self.rows[0] : self.rows[1]]
        return part.unflatten(0, (-1, self.period))[:, self.take[0] : self.take[1]] if self.period else part

    def col_weights(self, cols: torch.Tensor) -> torch.Tensor:
        return cols[self.cols[0] : self.cols[1]]

    def describe(self) -> str:
        cols = f"cols {self.cols[0]}:{self.cols[1]}"
        if self.rows is None:
            return cols
        rows = f"rows {self.rows[0]}:{self.rows[1]}"
        if self.period:
            rows += f" (of every {self.period}, {self.take[0]}:{self.take[1]})"
        return f"{rows}, {cols}"


def whole(shape: tuple[int, ...]) -> Region:
    if len(shape) == 1:
        return Region(None, (0, shape[0]))
    if len(shape) != 2:
        msg = f"an HF tensor of shape {shape}: the rule covers 1-D and 2-D tensors only"
        raise OwnershipError(msg)
    return Region((0, shape[0]), (0, shape[1]))


def split(shape: tuple[int, ...], axis: int, parts: int, limit: int | None = None) -> list[Region]:
    """``shape`` cut into ``parts`` equal blocks along ``axis`` (rows 0, columns 1), the last ones cut at ``limit``
    (the real vocabulary of a padded embedding; empty blocks dropped)."""
    size = shape[axis] if limit is None else None
    if size is not None and size % parts:
        msg = f"an HF tensor of shape {shape} does not split into {parts} equal blocks along axis {axis}"
        raise OwnershipError(msg)
    return [r for r in (block(shape, axis, index, parts, limit) for index in range(parts)) if r is not None]


def block(shape: tuple[int, ...], axis: int, index: int, parts: int, limit: int | None = None) -> Region | None:
    """Block ``index`` of :func:`split` (None when the limit leaves it empty)."""
    if limit is None:
        step = shape[axis] // parts
        low, high = index * step, (index + 1) * step
    else:  # padded rows: ``shape[axis]`` is the padded size of each block
        low, high = index * shape[axis], min((index + 1) * shape[axis], limit)
        if low >= high:
            return None
    if len(shape) == 1:
        return Region(None, (low, high))
    full = whole(shape)  # the other axis whole (and only 1-D and 2-D tensors)
    if axis == 0:
        return Region((low, high), full.cols)
    return Region(full.rows, (low, high))


@dataclass(frozen=True)
class Slot:
    """One engine tensor (or a part of it) and the region of the HF tensor it must hold.

    ``locate(context)`` returns the engine's tensor view, shaped as ``region``, when it is checked (after the load
    and vLLM's post-processing): ``context`` maps a decoder layer to its MLA implementation object (the forward
    context's ``AscendMLAImpl``). ``primary``: part of this rank's share of the HF tensor (False for a derived copy:
    the MLA matrices)."""

    hf: str
    region: Region
    engine: str
    locate: Callable[[Mapping[int, Any]], torch.Tensor]
    dtype: torch.dtype
    primary: bool = True


@dataclass
class Ownership:
    """This rank's slots, and for every HF tensor the engine holds anywhere how it is shared among the rollout ranks
    (the regions, one per rank that holds a part; they partition the tensor)."""

    slots: list[Slot]
    partition: dict[str, list[Region]]
    shapes: dict[str, tuple[int, ...]]  # every HF tensor's shape, as the rule reads it
    expert_maps: list[tuple[str, Any, dict[int, int]]]  # (prefix, FusedMoE module, expected global -> local slot)

    def share(self, hf: str, shape: tuple[int, ...], regions: list[Region]) -> None:
        self.shapes[hf] = shape
        self.partition[hf] = regions

    def primary(self, hf: str) -> Slot | None:
        found = [slot for slot in self.slots if slot.hf == hf and slot.primary]
        if len(found) > 1:
            engines = [s.engine for s in found]
            msg = f"{hf}: the rule gives this rank {len(found)} shares of it ({engines}); expected one"
            raise OwnershipError(msg)
        return found[0] if found else None


def _param(module: torch.nn.Module, name: str, index: tuple = ()) -> Callable[[Mapping[int, Any]], torch.Tensor]:
    """The parameter's data when read (a later post-processing may have replaced the parameter object)."""
    return lambda _context: getattr(module, name).data[index] if index else getattr(module, name).data


def ownership(model: torch.nn.Module, hf_config: Any) -> Ownership:
    """The rule applied to ``model`` (vLLM's DeepSeek-V2/V3 class, built on this rank), with ``hf_config`` its HF
    config (``model.config``)."""
    from vllm.model_executor.layers.fused_moe import FusedMoE
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    out = Ownership([], {}, {}, [])
    covered: set[str] = set()
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        # a parameter two modules hold (the router's bias, which FusedMoE keeps too) under its first name only
        own = {k: v for k, v in module.named_parameters(recurse=False) if id(v) not in seen}
        seen.update(id(v) for v in own.values())
        if not own:
            continue
        if isinstance(module, FusedMoE):
            _experts(out, prefix, module, hf_config)
            covered.update(f"{prefix}.{name}" for name in ("w13_weight", "w2_weight"))
            own = {k: v for k, v in own.items() if k not in ("w13_weight", "w2_weight")}
        elif isinstance(module, VocabParallelEmbedding):
            _vocab(out, prefix, module)
            covered.add(f"{prefix}.weight")
            own.pop("weight")
        elif isinstance(module, LinearBase) and "weight" in own:
            _linear(out, prefix, module)
            covered.add(f"{prefix}.weight")
            own.pop("weight")
        for name, param in own.items():  # norms, the router's expert bias: whole
            full = f"{prefix}.{name}" if prefix else name
            region = whole(tuple(param.shape))
            out.slots.append(Slot(full, region, full, _param(module, name), param.dtype))
            out.share(full, tuple(param.shape), [region])
            covered.add(full)
    uncovered = [name for name, _ in model.named_parameters() if name not in covered]
    if uncovered:
        msg = f"no ownership rule covers vLLM's parameters {uncovered[:8]}; the weight check cannot vouch for them"
        raise OwnershipError(msg)
    _mla(out, model, hf_config)
    return out


def _tp_rank() -> int:
    from vllm.distributed import get_tensor_model_parallel_rank

    return int(get_tensor_model_parallel_rank())


def _linear(out: Ownership, prefix: str, module: Any) -> None:
    from vllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        ReplicatedLinear,
        RowParallelLinear,
    )

    weight = module.weight
    rows, cols = int(module.output_size), int(module.input_size)
    if isinstance(module, MergedColumnParallelLinear) or (
        isinstance(module, ReplicatedLinear) and hasattr(module, "output_sizes")
    ):
        leaf = prefix.rsplit(".", 1)[-1]
        if leaf not in MERGED or len(MERGED[leaf]) != len(module.output_sizes):
            msg = f"{prefix}: a merged linear ({type(module).__name__}) the rule has no HF names for"
            raise OwnershipError(msg)
        tp = int(module.tp_size) if isinstance(module, MergedColumnParallelLinear) else 1
        rank = _tp_rank() if tp > 1 else 0
        offset = 0
        for hf_leaf, size in zip(MERGED[leaf], module.output_sizes, strict=True):
            hf = f"{prefix.rsplit('.', 1)[0]}.{hf_leaf}.weight"
            shape = (int(size), cols)
            region = block(shape, 0, rank, tp)
            local = shape[0] // tp
            engine = f"{prefix}.weight[{offset}:{offset + local}]"
            locate = _param(module, "weight", (slice(offset, offset + local),))
            out.slots.append(Slot(hf, region, engine, locate, weight.dtype))
            out.share(hf, shape, split(shape, 0, tp))
            offset += local
        _check_shape(prefix, weight, (offset, cols))
        return
    hf = f"{prefix}.weight"
    if isinstance(module, ColumnParallelLinear):
        tp, axis = int(module.tp_size), 0
    elif isinstance(module, RowParallelLinear):
        tp, axis = int(module.tp_size), 1
        if int(module.tp_rank) != (_tp_rank() if tp > 1 else 0):
            msg = f"{prefix}: its tp_rank {module.tp_rank} is not vLLM's TP rank {_tp_rank()}"
            raise OwnershipError(msg)
    elif isinstance(module, ReplicatedLinear):
        tp, axis = 1, 0
    else:
        msg = f"{prefix}: no ownership rule for {type(module).__module__}.{type(module).__qualname__}"
        raise OwnershipError(msg)
    shape = (rows, cols)
    rank = _tp_rank() if tp > 1 else 0
    region = block(shape, axis, rank, tp)
    assert region is not None
    _check_shape(prefix, weight, region.shape)
    out.slots.append(Slot(hf, region, f"{prefix}.weight", _param(module, "weight"), weight.dtype))
    out.share(hf, shape, split(shape, axis, tp))


def _vocab(out: Ownership, prefix: str, module: Any) -> None:
    vocab, tp, padding = int(module.org_vocab_size), int(module.tp_size), int(module.padding_size)
    if int(module.num_embeddings) != vocab:
        msg = f"{prefix}: {module.num_embeddings - vocab} added (LoRA) vocabulary rows; the rule has none"
        raise OwnershipError(msg)
    rank = _vocab_rank(module) if tp > 1 else 0
    per = -(-vocab // padding) * padding // tp
    hidden = int(module.embedding_dim)
    region = block((per, hidden), 0, rank, tp, limit=vocab)
    indices = module.shard_indices
    expected = region.rows if region is not None else (rank * per, rank * per)
    if (int(indices.org_vocab_start_index), int(indices.org_vocab_end_index)) != expected:
        msg = (
            f"{prefix}: vLLM shards the vocabulary rows {indices.org_vocab_start_index}:"
            f"{indices.org_vocab_end_index} onto this rank, the rule {expected[0]}:{expected[1]}"
        )
        raise OwnershipError(msg)
    hf = f"{prefix}.weight"
    out.share(hf, (vocab, hidden), split((per, hidden), 0, tp, limit=vocab))
    if region is not None:
        rows = region.rows[1] - region.rows[0]
        engine = f"{prefix}.weight[0:{rows}]"
        locate = _param(module, "weight", (slice(0, rows),))
        out.slots.append(Slot(hf, region, engine, locate, module.weight.dtype))


def _vocab_rank(module: Any) -> int:
    """The rank in the group the embedding is sharded over: vllm-ascend's LM-head group for its LM head."""
    from vllm_ascend.ops.lmhead import CustomParallelLMHead

    if isinstance(module, CustomParallelLMHead):
        from vllm_ascend.distributed.parallel_state import get_lmhead_group

        return int(get_lmhead_group().rank_in_group)
    return _tp_rank()


def _experts(out: Ownership, prefix: str, module: Any, hf_config: Any) -> None:
    experts, ep, ep_rank = int(module.global_num_experts), int(module.ep_size), int(module.ep_rank)
    tp, tp_rank = int(module.tp_size), int(module.tp_rank)
    inter, hidden = int(hf_config.moe_intermediate_size), int(hf_config.hidden_size)
    if experts % ep or inter % tp:
        msg = f"{prefix}: {experts} experts over EP {ep}, intermediate {inter} over TP {tp} do not split evenly"
        raise OwnershipError(msg)
    local, part = experts // ep, inter // tp
    _check_shape(f"{prefix}.w13_weight", module.w13_weight, (local, 2 * part, hidden))
    _check_shape(f"{prefix}.w2_weight", module.w2_weight, (local, hidden, part))
    base = prefix.removesuffix(".experts") + ".experts"
    first = ep_rank * local
    for expert in range(experts):
        names = {proj: f"{base}.{expert}.{proj}.weight" for proj in ("gate_proj", "up_proj", "down_proj")}
        out.share(names["gate_proj"], (inter, hidden), split((inter, hidden), 0, tp))
        out.share(names["up_proj"], (inter, hidden), split((inter, hidden), 0, tp))
        out.share(names["down_proj"], (hidden, inter), split((hidden, inter), 1, tp))
        if not first <= expert < first + local:
            continue
        slot = expert - first
        dtype = module.w13_weight.dtype
        for half, proj in enumerate(("gate_proj", "up_proj")):
            rows = (half * part, (half + 1) * part)
            region = block((inter, hidden), 0, tp_rank, tp)
            engine = f"{prefix}.w13_weight[{slot}, {rows[0]}:{rows[1]}]"
            locate = _param(module, "w13_weight", (slot, slice(*rows)))
            out.slots.append(Slot(names[proj], region, engine, locate, dtype))
        region = block((hidden, inter), 1, tp_rank, tp)
        engine, locate = f"{prefix}.w2_weight[{slot}]", _param(module, "w2_weight", (slot,))
        out.slots.append(Slot(names["down_proj"], region, engine, locate, module.w2_weight.dtype))
    out.expert_maps.append((prefix, module, {expert: expert - first for expert in range(first, first + local)}))


def expert_map_problems(prefix: str, module: Any, expected: Mapping[int, int]) -> list[str]:
    """Where the MoE layer's expert map (which slot its kernels route each global expert to) leaves the rule."""
    expert_map = getattr(module, "expert_map", None)
    experts = int(module.global_num_experts)
    found = list(range(experts)) if expert_map is None else [int(v) for v in expert_map.tolist()]
    problems = []
    for expert in range(experts):
        want = expected.get(expert, -1)
        if found[expert] != want:
            problems.append(f"{prefix} routes expert {expert} to slot {found[expert]}, the rule to {want}")
    return problems


def _mla(out: Ownership, model: torch.nn.Module, hf_config: Any) -> None:
    """The derived MLA matrices of every layer: the heads of this rank's ``kv_b_proj`` rows."""
    nope, value = int(hf_config.qk_nope_head_dim), int(hf_config.v_head_dim)
    lora, heads = int(hf_config.kv_lora_rank), int(hf_config.num_attention_heads)
    period = nope + value
    for slot in list(out.slots):
        if not slot.hf.endswith(".self_attn.kv_b_proj.weight"):
            continue
        layer = layer_of(slot.hf)
        if slot.region.rows is None or layer is None:
            msg = f"{slot.hf}: a kv_b_proj weight outside a decoder layer or without rows"
            raise OwnershipError(msg)
        first, count = slot.region.rows[0] // period, (slot.region.rows[1] - slot.region.rows[0]) // period
        for matrix, take in (("W_UK_T", (0, nope)), ("W_UV", (nope, period))):
            region = Region(slot.region.rows, (0, lora), period, take)
            out.slots.append(
                Slot(
                    slot.hf,
                    region,
                    f"{matrix} of layer {layer} (heads {first}:{first + count})",
                    _mla_locator(layer, matrix, first, count, heads),
                    slot.dtype,
                    primary=False,
                )
            )


def _mla_locator(layer: int, matrix: str, first: int, count: int, heads: int) -> Callable[[Mapping[int, Any]], Any]:
    def locate(context: Mapping[int, Any]) -> torch.Tensor:
        impl = context.get(layer)
        if impl is None:
            msg = f"no MLA implementation object for layer {layer} in the engine's forward context"
            raise OwnershipError(msg)
        value = getattr(impl, matrix, None)
        if value is None:
            msg = f"the engine's {matrix} of layer {layer} is not computed (released and not re-derived)"
            raise MissingTensorError(msg)
        held = int(impl.num_heads)
        offset = first if held == heads else 0  # an impl over the whole kv_b_proj (the CPU engine) or its TP share
        if held not in (heads, count):
            msg = f"layer {layer}'s MLA impl holds {held} heads; expected {count} (its TP share) or all {heads}"
            raise OwnershipError(msg)
        part = value[offset : offset + count]
        return part if matrix == "W_UK_T" else part.transpose(1, 2)

    return locate


class MissingTensorError(RuntimeError):
    """An engine tensor the rule expects is absent (a released matrix never re-derived)."""


def layer_of(name: str) -> int | None:
    match = _LAYER.search(name)
    return int(match.group(1)) if match else None


def mla_context(forward_context: Mapping[str, Any]) -> dict[int, Any]:
    """Decoder layer -> the MLA implementation object of the engine's forward context (vLLM's attention layers,
    ``model.layers.N.self_attn.attn``) that carries the derived matrices."""
    found: dict[int, Any] = {}
    for name, attention in forward_context.items():
        impl = getattr(attention, "impl", None)
        layer = layer_of(name)
        if impl is not None and layer is not None and all(hasattr(impl, m) for m in MLA_MATRICES):
            found[layer] = impl
    return found


def _check_shape(name: str, tensor: torch.Tensor, expected: Iterable[int]) -> None:
    if tuple(tensor.shape) != tuple(expected):
        msg = (
            f"{name} has shape {tuple(tensor.shape)}, the rule for vLLM 0.9.1's layout expects {tuple(expected)}: "
            "the engine lays it out differently (a quantized or transposed expert layout), update the rule"
        )
        raise OwnershipError(msg)
