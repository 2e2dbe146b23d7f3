"""Which HF tensor slice goes to which chunk of which Megatron-core dist-checkpoint tensor (pure Python).

Keys, global shapes and dtypes follow the sharded state dict of megatron-core 0.12.1's ``GPTModel`` with the
Transformer-Engine decoder-block spec that verl 0.6.1 builds for DeepSeek-V3 (MLA with ``qk_layernorm``,
grouped-GEMM MoE, SwiGLU, list-valued ``moe_layer_freq`` so layer keys carry the *global* layer number). A
dist checkpoint stores global tensors, so the TP/PP/EP given here only decides how the data is chunked and which
virtual rank file holds each chunk; verl can load the result at any other layout. Which HF tensors make which
Megatron tensor is the project's one mapping, ``r1_ascend.patches.rules.mcore_mapping`` (the weight-sync check
predicts verl's export with it too); this module only chunks it.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from r1_ascend.parallel import Layout, LayoutError
from r1_ascend.patches.rules.mcore_mapping import MappedTensor, mapped_tensors
from r1_ascend.weights.errors import WeightsError

#: Largest chunk written for a replicated or row-split tensor (bounds the writer's memory; see _row_pieces).
MAX_PIECE_BYTES = 256 << 20


def check_layout(layout: Layout, cfg: dict[str, Any]) -> None:
    """Refuse a layout the model cannot take, naming every reason at once (nothing is written before this)."""
    sizes = (("tp", layout.tp), ("pp", layout.pp), ("ep", layout.ep))
    problems = [f"{k}={v} must be at least 1" for k, v in sizes if v < 1]
    if not problems:
        problems += _layout_problems(layout, cfg)
    if problems:
        msg = (
            f"layout tp={layout.tp} pp={layout.pp} ep={layout.ep}"
            + (f" pp_layers={list(layout.pp_layers)}" if layout.pp_layers else "")
            + " does not fit the model: "
            + "; ".join(problems)
            + ". Pick sizes that divide these dimensions."
        )
        raise WeightsError(msg)


def _layout_problems(layout: Layout, cfg: dict[str, Any]) -> list[str]:
    out = []
    tp = layout.tp
    divisible_by_tp = {
        "num_attention_heads (attention heads are split across TP ranks)": cfg["num_attention_heads"],
        "vocab_size (embedding and output layer rows)": cfg["vocab_size"],
        "moe_intermediate_size (expert FFN)": cfg["moe_intermediate_size"],
        "moe_intermediate_size * n_shared_experts (shared experts)": cfg["moe_intermediate_size"]
        * cfg["n_shared_experts"],
        "kv_lora_rank + qk_rope_head_dim (linear_kv_down_proj rows)": cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"],
    }
    if cfg.get("q_lora_rank"):
        divisible_by_tp["q_lora_rank (linear_q_down_proj rows)"] = cfg["q_lora_rank"]
    if cfg["first_k_dense_replace"]:
        divisible_by_tp["intermediate_size (dense FFN)"] = cfg["intermediate_size"]
    for what, n in divisible_by_tp.items():
        if n % tp:
            out.append(f"tp={tp} does not divide {what} = {n}")
    if cfg["n_routed_experts"] % layout.ep:
        out.append(f"ep={layout.ep} does not divide n_routed_experts = {cfg['n_routed_experts']}")
    try:
        layout.stage_layers(cfg["num_hidden_layers"])
    except LayoutError as exc:
        out.append(str(exc))
    return out


@dataclass(frozen=True)
class Piece:
    """One stored chunk: ``source`` rows/cols land at ``offsets`` (size ``sizes``) of the global tensor."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    source: str
    rows: tuple[int, int]
    cols: tuple[int, int] | None
    rank: int


@dataclass
class DistTensor:
    key: str
    global_shape: tuple[int, ...]
    dtype: torch.dtype
    pieces: list[Piece] = field(default_factory=list)
    layer: int | None = None
    # how the global tensor is built from HF (used by the loaders/verifiers):
    # replicated | rows | cols (TP split axis) | swiglu | experts_fc1 | experts_fc2
    kind: str = "replicated"
    sources: tuple[str, ...] = ()

    @property
    def numel(self) -> int:
        return math.prod(self.global_shape)


@dataclass(frozen=True)
class ExtraState:
    """A Transformer-Engine ``_extra_state`` ShardedObject (empty: no FP8 training state)."""

    key: str
    offset: tuple[int, ...]
    shape: tuple[int, ...]
    rank: int
    layer: int | None = None

    @property
    def unique_key(self) -> str:
        return f"{self.key}/shard_{'.'.join(map(str, self.offset))}_{'.'.join(map(str, self.shape))}"


def empty_extra_state() -> io.BytesIO:
    """An empty TE extra state as mcore stores ShardedObjects: ``torch.save`` of the list of their data.

    ``set_extra_state(None)`` is a no-op in Transformer Engine, so loading it leaves a fresh module unchanged.
    """
    buf = io.BytesIO()
    torch.save([None], buf)
    buf.seek(0)
    return buf


@dataclass
class MegatronPlan:
    tensors: list[DistTensor]
    extra_states: list[ExtraState]
    layout: Layout
    consumed: set[str]

    def by_rank(self) -> dict[int, tuple[list[tuple[DistTensor, Piece]], list[ExtraState]]]:
        out: dict[int, tuple[list[tuple[DistTensor, Piece]], list[ExtraState]]] = {}
        for t in self.tensors:
            for p in t.pieces:
                out.setdefault(p.rank, ([], []))[0].append((t, p))
        for e in self.extra_states:
            out.setdefault(e.rank, ([], []))[1].append(e)
        return out

    def total_numel(self) -> int:
        return sum(t.numel for t in self.tensors)


def _split(n: int, parts: int, what: str) -> Iterator[tuple[int, int, int]]:
    if n % parts:
        msg = f"{what} has size {n}, not divisible by the parallel size {parts}"
        raise WeightsError(msg)
    step = n // parts
    for i in range(parts):
        yield i, i * step, (i + 1) * step


class _Builder:
    def __init__(self, cfg: dict[str, Any], layout: Layout, extra_state: bool):
        self.cfg, self.layout, self.extra_state = cfg, layout, extra_state
        self.tensors: list[DistTensor] = []
        self.extras: list[ExtraState] = []
        self.consumed: set[str] = set()

    def _add(
        self, key: str, shape: tuple[int, ...], dtype: torch.dtype, layer: int | None, kind: str, sources: tuple
    ) -> DistTensor:
        t = DistTensor(key, shape, dtype, layer=layer, kind=kind, sources=sources)
        self.tensors.append(t)
        return t

    def _row_pieces(self, t: DistTensor, src: str, r0: int, r1: int, rank: int) -> None:
        """Rows [r0, r1) as one chunk, or several when larger than MAX_PIECE_BYTES (the embedding, lm_head):
        a dist checkpoint may store a global tensor in any chunks, and the writer holds one chunk at a time."""
        row_bytes = max(1, math.prod(t.global_shape[1:]) * t.dtype.itemsize)
        step = max(1, MAX_PIECE_BYTES // row_bytes)
        for a in range(r0, r1, step):
            b = min(r1, a + step)
            offsets = (a,) + (0,) * (len(t.global_shape) - 1)
            t.pieces.append(Piece(offsets, (b - a, *t.global_shape[1:]), src, (a, b), None, rank))

    def replicated(self, key: str, src: str, shape: tuple[int, ...], stage: int, layer: int | None, dtype=None):
        """A tensor every TP/EP rank holds whole: stored once, by the stage's first rank."""
        t = self._add(key, shape, dtype or torch.bfloat16, layer, "replicated", (src,))
        self._row_pieces(t, src, 0, shape[0], self.layout.rank(stage, 0, 0))
        self.consumed.add(src)

    def split_rows(self, key: str, src: str, shape: tuple[int, int], stage: int, ep_rank: int, layer: int | None):
        t = self._add(key, shape, torch.bfloat16, layer, "rows", (src,))
        for tp, r0, r1 in _split(shape[0], self.layout.tp, key):
            self._row_pieces(t, src, r0, r1, self.layout.rank(stage, ep_rank, tp))
        self.consumed.add(src)

    def split_cols(self, key: str, src: str, shape: tuple[int, int], stage: int, layer: int | None):
        t = self._add(key, shape, torch.bfloat16, layer, "cols", (src,))
        for tp, c0, c1 in _split(shape[1], self.layout.tp, key):
            rank = self.layout.rank(stage, 0, tp)
            t.pieces.append(Piece((0, c0), (shape[0], c1 - c0), src, (0, shape[0]), (c0, c1), rank))
        self.consumed.add(src)

    def swiglu(self, key: str, gate: str, up: str, ffn: int, hidden: int, stage: int, layer: int):
        """fc1 = [gate; up]; TP rank t holds [gate_t; up_t], stored as two chunks like mcore's swiglu factory."""
        t = self._add(key, (2 * ffn, hidden), torch.bfloat16, layer, "swiglu", (gate, up))
        for tp, r0, r1 in _split(ffn, self.layout.tp, key):
            rank = self.layout.rank(stage, 0, tp)
            t.pieces.append(Piece((r0, 0), (r1 - r0, hidden), gate, (r0, r1), None, rank))
            t.pieces.append(Piece((ffn + r0, 0), (r1 - r0, hidden), up, (r0, r1), None, rank))
        self.consumed.update((gate, up))

    def experts(self, t: MappedTensor, stage: int) -> None:
        """Grouped experts: expert ``e`` on EP rank ``e // (E / ep)``, its rows (fc1: gate then up) or columns (fc2)
        split over TP."""
        layout = self.layout
        per_ep, mf = t.shape[0] // layout.ep, self.cfg["moe_intermediate_size"]
        dist = self._add(t.key, t.shape, _DTYPES[t.dtype], t.layer, t.kind, t.sources)
        by_expert: dict[int, list] = {}
        for source in t.hf_boxes():
            by_expert.setdefault(source.offset[0], []).append(source)
        for e, sources in by_expert.items():
            for tp, r0, r1 in _split(mf, layout.tp, t.key):
                rank = layout.rank(stage, e // per_ep, tp)
                for source in sources:
                    if t.kind == "experts_fc1":
                        offsets, sizes = (e, source.offset[1] + r0, 0), (1, r1 - r0, t.shape[2])
                        dist.pieces.append(Piece(offsets, sizes, source.name, (r0, r1), None, rank))
                    else:
                        offsets, sizes = (e, 0, r0), (1, t.shape[1], r1 - r0)
                        dist.pieces.append(Piece(offsets, sizes, source.name, (0, t.shape[1]), (r0, r1), rank))
            self.consumed.update(source.name for source in sources)

    def extra(self, key: str, stage: int, layer: int | None, offset=(0,), shape=(1,), ep_rank: int = 0):
        if self.extra_state:
            self.extras.append(ExtraState(key, offset, shape, self.layout.rank(stage, ep_rank, 0), layer))


def build_plan(cfg: dict[str, Any], layout: Layout, *, extra_state: bool = True) -> MegatronPlan:
    """The full plan for a DeepSeek-V3-shaped HF config (MTP layers are not part of the Megatron model): each
    tensor of the project's HF <-> Megatron mapping (``r1_ascend.patches.rules.mcore_mapping``) chunked by
    ``layout``."""
    check_layout(layout, cfg)
    if cfg.get("tie_word_embeddings"):
        msg = "tied embeddings are not DeepSeek-V3; this converter maps embed_tokens and lm_head separately"
        raise WeightsError(msg)
    if cfg["n_routed_experts"] % layout.ep:
        msg = f"n_routed_experts={cfg['n_routed_experts']} is not divisible by ep={layout.ep}"
        raise WeightsError(msg)
    stages = layout.stage_layers(cfg["num_hidden_layers"])
    stage_of = [s for s, count in enumerate(stages) for _ in range(count)]
    last = layout.pp - 1
    b = _Builder(cfg, layout, extra_state)
    for t in mapped_tensors(cfg):
        s = stage_of[t.layer] if t.layer is not None else (0 if t.key.startswith("embedding.") else last)
        dtype = _DTYPES[t.dtype]
        if t.kind == "replicated":
            b.replicated(t.key, t.sources[0], t.shape, s, t.layer, dtype)
        elif t.kind == "rows":
            b.split_rows(t.key, t.sources[0], t.shape, s, 0, t.layer)
        elif t.kind == "cols":
            b.split_cols(t.key, t.sources[0], t.shape, s, t.layer)
        elif t.kind == "swiglu":
            b.swiglu(t.key, t.sources[0], t.sources[1], t.shape[0] // 2, t.shape[1], s, t.layer)
        else:
            b.experts(t, s)
    for layer in range(cfg["num_hidden_layers"]):
        _layer_extras(b, cfg, layer, stage_of[layer])
    return MegatronPlan(b.tensors, b.extras, layout, b.consumed)


_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def _layer_extras(b: _Builder, cfg: dict[str, Any], layer: int, s: int) -> None:
    """The Transformer-Engine ``_extra_state`` objects of one decoder layer, in the order its modules hold them."""
    sa, mm = f"decoder.layers.{layer}.self_attention.", f"decoder.layers.{layer}.mlp."
    q_modules = ("linear_q_down_proj", "linear_q_up_proj") if cfg.get("q_lora_rank") else ("linear_q_proj",)
    for module in (*q_modules, "linear_kv_down_proj", "linear_kv_up_proj", "core_attention", "linear_proj"):
        b.extra(f"{sa}{module}._extra_state", s, layer)
    if layer < cfg["first_k_dense_replace"]:
        b.extra(mm + "linear_fc1._extra_state", s, layer)
        b.extra(mm + "linear_fc2._extra_state", s, layer)
        return
    b.extra(mm + "shared_experts.linear_fc1._extra_state", s, layer)
    b.extra(mm + "shared_experts.linear_fc2._extra_state", s, layer)
    experts, per_ep = cfg["n_routed_experts"], cfg["n_routed_experts"] // b.layout.ep
    for e in range(experts):
        for fc in ("linear_fc1", "linear_fc2"):
            b.extra(f"{mm}experts.experts.{fc}._extra_state", s, layer, (e,), (experts,), e // per_ep)
