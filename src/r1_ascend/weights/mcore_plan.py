"""Which HF tensor slice goes to which chunk of which Megatron-core dist-checkpoint tensor (pure Python).

Keys, global shapes and dtypes follow the sharded state dict of megatron-core 0.12.1's ``GPTModel`` with the
Transformer-Engine decoder-block spec that verl 0.6.1 builds for DeepSeek-V3 (MLA with ``qk_layernorm``,
grouped-GEMM MoE, SwiGLU, list-valued ``moe_layer_freq`` so layer keys carry the *global* layer number). A
dist checkpoint stores global tensors, so the TP/PP/EP given here only decides how the data is chunked and which
virtual rank file holds each chunk; verl can load the result at any other layout.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from r1_ascend.parallel import Layout, LayoutError
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

    def extra(self, key: str, stage: int, layer: int | None, offset=(0,), shape=(1,), ep_rank: int = 0):
        if self.extra_state:
            self.extras.append(ExtraState(key, offset, shape, self.layout.rank(stage, ep_rank, 0), layer))


def build_plan(cfg: dict[str, Any], layout: Layout, *, extra_state: bool = True) -> MegatronPlan:
    """The full plan for a DeepSeek-V3-shaped HF config (MTP layers are not part of the Megatron model)."""
    h, v, n_layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    nh, ql, kvl = cfg["num_attention_heads"], cfg.get("q_lora_rank"), cfg["kv_lora_rank"]
    qn, qr, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    e_total, mf, shared = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["n_shared_experts"]
    check_layout(layout, cfg)
    if cfg.get("tie_word_embeddings"):
        msg = "tied embeddings are not DeepSeek-V3; this converter maps embed_tokens and lm_head separately"
        raise WeightsError(msg)
    if e_total % layout.ep:
        msg = f"n_routed_experts={e_total} is not divisible by ep={layout.ep}"
        raise WeightsError(msg)
    stages = layout.stage_layers(n_layers)
    stage_of = [s for s, count in enumerate(stages) for _ in range(count)]
    b = _Builder(cfg, layout, extra_state)
    b.split_rows("embedding.word_embeddings.weight", "model.embed_tokens.weight", (v, h), 0, 0, None)
    per_ep = e_total // layout.ep
    for layer in range(n_layers):
        s = stage_of[layer]
        hf, mc = f"model.layers.{layer}.", f"decoder.layers.{layer}."
        att, sa = hf + "self_attn.", mc + "self_attention."
        b.replicated(mc + "input_layernorm.weight", hf + "input_layernorm.weight", (h,), s, layer)
        if ql:
            b.split_rows(sa + "linear_q_down_proj.weight", att + "q_a_proj.weight", (ql, h), s, 0, layer)
            b.replicated(sa + "linear_q_up_proj.layer_norm_weight", att + "q_a_layernorm.weight", (ql,), s, layer)
            b.split_rows(sa + "linear_q_up_proj.weight", att + "q_b_proj.weight", (nh * (qn + qr), ql), s, 0, layer)
            q_modules = ("linear_q_down_proj", "linear_q_up_proj")
        else:
            b.split_rows(sa + "linear_q_proj.weight", att + "q_proj.weight", (nh * (qn + qr), h), s, 0, layer)
            q_modules = ("linear_q_proj",)
        b.split_rows(sa + "linear_kv_down_proj.weight", att + "kv_a_proj_with_mqa.weight", (kvl + qr, h), s, 0, layer)
        b.replicated(sa + "linear_kv_up_proj.layer_norm_weight", att + "kv_a_layernorm.weight", (kvl,), s, layer)
        b.split_rows(sa + "linear_kv_up_proj.weight", att + "kv_b_proj.weight", (nh * (qn + vd), kvl), s, 0, layer)
        b.split_cols(sa + "linear_proj.weight", att + "o_proj.weight", (h, nh * vd), s, layer)
        for module in (*q_modules, "linear_kv_down_proj", "linear_kv_up_proj", "core_attention", "linear_proj"):
            b.extra(f"{sa}{module}._extra_state", s, layer)
        mlp, mm = hf + "mlp.", mc + "mlp."
        post_norm = hf + "post_attention_layernorm.weight"
        if layer < cfg["first_k_dense_replace"]:
            f = cfg["intermediate_size"]
            b.replicated(mm + "linear_fc1.layer_norm_weight", post_norm, (h,), s, layer)
            b.swiglu(mm + "linear_fc1.weight", mlp + "gate_proj.weight", mlp + "up_proj.weight", f, h, s, layer)
            b.split_cols(mm + "linear_fc2.weight", mlp + "down_proj.weight", (h, f), s, layer)
            b.extra(mm + "linear_fc1._extra_state", s, layer)
            b.extra(mm + "linear_fc2._extra_state", s, layer)
            continue
        b.replicated(mc + "pre_mlp_layernorm.weight", post_norm, (h,), s, layer)
        b.replicated(mm + "router.weight", mlp + "gate.weight", (e_total, h), s, layer)
        b.replicated(
            mm + "router.expert_bias", mlp + "gate.e_score_correction_bias", (e_total,), s, layer, dtype=torch.float32
        )
        se, sm = mlp + "shared_experts.", mm + "shared_experts."
        b.swiglu(sm + "linear_fc1.weight", se + "gate_proj.weight", se + "up_proj.weight", mf * shared, h, s, layer)
        b.split_cols(sm + "linear_fc2.weight", se + "down_proj.weight", (h, mf * shared), s, layer)
        b.extra(sm + "linear_fc1._extra_state", s, layer)
        b.extra(sm + "linear_fc2._extra_state", s, layer)
        ex = mm + "experts.experts."
        fc1 = b._add(ex + "linear_fc1.weight", (e_total, 2 * mf, h), torch.bfloat16, layer, "experts_fc1", (mlp,))
        fc2 = b._add(ex + "linear_fc2.weight", (e_total, h, mf), torch.bfloat16, layer, "experts_fc2", (mlp,))
        for e in range(e_total):
            ep_rank = e // per_ep
            gate, up, down = (f"{mlp}experts.{e}.{p}_proj.weight" for p in ("gate", "up", "down"))
            for tp, r0, r1 in _split(mf, layout.tp, fc1.key):
                rank = layout.rank(s, ep_rank, tp)
                fc1.pieces.append(Piece((e, r0, 0), (1, r1 - r0, h), gate, (r0, r1), None, rank))
                fc1.pieces.append(Piece((e, mf + r0, 0), (1, r1 - r0, h), up, (r0, r1), None, rank))
                fc2.pieces.append(Piece((e, 0, r0), (1, h, r1 - r0), down, (0, h), (r0, r1), rank))
            b.consumed.update((gate, up, down))
            b.extra(ex + "linear_fc1._extra_state", s, layer, (e,), (e_total,), ep_rank)
            b.extra(ex + "linear_fc2._extra_state", s, layer, (e,), (e_total,), ep_rank)
    last = layout.pp - 1
    b.replicated("decoder.final_layernorm.weight", "model.norm.weight", (h,), last, None)
    b.split_rows("output_layer.weight", "lm_head.weight", (v, h), last, 0, None)
    return MegatronPlan(b.tensors, b.extras, layout, b.consumed)
