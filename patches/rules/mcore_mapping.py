"""DeepSeek-V3's one mapping between Hugging Face tensors and megatron-core's dist-checkpoint tensors (pure Python).

Each megatron-core tensor is named by its dist-checkpoint key (``GPTModel.sharded_state_dict()`` of megatron-core
0.12.1 with the Transformer-Engine spec verl 0.6.1 builds: global layer numbers, the experts of a layer as one
``[experts, ...]`` tensor) and holds one or more HF tensors, each a box of it:

- ``replicated`` / ``rows`` / ``cols``: one HF tensor, the whole tensor (``rows`` / ``cols``: the axis tensor
  parallelism splits);
- ``swiglu``: ``linear_fc1`` = ``[gate_proj; up_proj]`` along the rows;
- ``experts_fc1``: ``[experts, 2 * moe_intermediate, hidden]``, expert ``e`` holding ``[gate_proj_e; up_proj_e]``;
- ``experts_fc2``: ``[experts, hidden, moe_intermediate]``, expert ``e`` holding ``down_proj_e``.

The converter (``r1_ascend.weights.mcore_plan``, ``to_hf``) writes and reads checkpoints with it; the weight-sync
check (``verl_weight_sync_check``) predicts what verl's export must emit from the actor's own shards with it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

KINDS = ("replicated", "rows", "cols", "swiglu", "experts_fc1", "experts_fc2")


@dataclass(frozen=True)
class MappedTensor:
    """One megatron-core dist-checkpoint tensor and the HF tensors it is made of."""

    key: str
    shape: tuple[int, ...]  # global shape
    dtype: str  # "bfloat16" | "float32"
    layer: int | None  # global decoder layer (None: embedding, final norm, output layer)
    kind: str  # one of KINDS
    sources: tuple[str, ...]  # HF names; for the experts the layer's "model.layers.L.mlp." prefix

    def hf_boxes(self) -> Iterator[HFSource]:
        """Every HF tensor this tensor holds, with where it sits in it."""
        if self.kind in ("replicated", "rows", "cols"):
            yield HFSource(self.sources[0], self, (0,) * len(self.shape), self.shape)
        elif self.kind == "swiglu":
            half = self.shape[0] // 2
            for index, name in enumerate(self.sources):
                yield HFSource(name, self, (index * half, 0), (half, self.shape[1]))
        elif self.kind == "experts_fc1":
            half = self.shape[1] // 2
            for expert in range(self.shape[0]):
                for index, proj in enumerate(("gate_proj", "up_proj")):
                    name = f"{self.sources[0]}experts.{expert}.{proj}.weight"
                    yield HFSource(name, self, (expert, index * half, 0), (half, self.shape[2]), lead=1)
        elif self.kind == "experts_fc2":
            for expert in range(self.shape[0]):
                name = f"{self.sources[0]}experts.{expert}.down_proj.weight"
                yield HFSource(name, self, (expert, 0, 0), self.shape[1:], lead=1)
        else:
            msg = f"{self.key}: unknown kind {self.kind!r}; expected one of {KINDS}"
            raise ValueError(msg)


@dataclass(frozen=True)
class HFSource:
    """An HF tensor ``name`` of ``shape``: the box of ``tensor`` starting at ``offset`` (global coordinates), with
    ``lead`` leading axes of size 1 (the expert axis) that the HF tensor does not have."""

    name: str
    tensor: MappedTensor
    offset: tuple[int, ...]
    shape: tuple[int, ...]
    lead: int = 0

    @property
    def box_shape(self) -> tuple[int, ...]:
        """The box's shape in the global tensor (the HF shape with the leading axes of size 1)."""
        return (1,) * self.lead + self.shape

    def intersect(self, offset: tuple[int, ...], shape: tuple[int, ...]) -> tuple[tuple[slice, ...], ...] | None:
        """Where a shard of the global tensor (``offset``, ``shape``, global coordinates) overlaps this HF tensor:
        ``(hf_index, shard_index)``, slices of the HF tensor and of the shard; None when they do not overlap."""
        hf_index, shard_index = [], []
        for axis, (start, size) in enumerate(zip(self.offset, self.box_shape, strict=True)):
            low, high = max(start, offset[axis]), min(start + size, offset[axis] + shape[axis])
            if low >= high:
                return None
            if axis >= self.lead:
                hf_index.append(slice(low - start, high - start))
            shard_index.append(slice(low - offset[axis], high - offset[axis]))
        return tuple(hf_index), tuple(shard_index)


def mapped_tensors(cfg: Mapping[str, Any]) -> list[MappedTensor]:
    """Every megatron-core tensor of a DeepSeek-V3-shaped HF config, in model order (the MTP layers are not part of
    the Megatron model)."""
    h, v, n_layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    nh, ql, kvl = cfg["num_attention_heads"], cfg.get("q_lora_rank"), cfg["kv_lora_rank"]
    qn, qr, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    experts, mf, shared = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["n_shared_experts"]
    out: list[MappedTensor] = []

    def add(key: str, shape: tuple[int, ...], layer: int | None, kind: str, *sources: str, dtype: str = "bfloat16"):
        out.append(MappedTensor(key, shape, dtype, layer, kind, sources))

    add("embedding.word_embeddings.weight", (v, h), None, "rows", "model.embed_tokens.weight")
    for layer in range(n_layers):
        hf, mc = f"model.layers.{layer}.", f"decoder.layers.{layer}."
        att, sa = hf + "self_attn.", mc + "self_attention."
        add(mc + "input_layernorm.weight", (h,), layer, "replicated", hf + "input_layernorm.weight")
        if ql:
            add(sa + "linear_q_down_proj.weight", (ql, h), layer, "rows", att + "q_a_proj.weight")
            add(sa + "linear_q_up_proj.layer_norm_weight", (ql,), layer, "replicated", att + "q_a_layernorm.weight")
            add(sa + "linear_q_up_proj.weight", (nh * (qn + qr), ql), layer, "rows", att + "q_b_proj.weight")
        else:
            add(sa + "linear_q_proj.weight", (nh * (qn + qr), h), layer, "rows", att + "q_proj.weight")
        add(sa + "linear_kv_down_proj.weight", (kvl + qr, h), layer, "rows", att + "kv_a_proj_with_mqa.weight")
        add(sa + "linear_kv_up_proj.layer_norm_weight", (kvl,), layer, "replicated", att + "kv_a_layernorm.weight")
        add(sa + "linear_kv_up_proj.weight", (nh * (qn + vd), kvl), layer, "rows", att + "kv_b_proj.weight")
        add(sa + "linear_proj.weight", (h, nh * vd), layer, "cols", att + "o_proj.weight")
        mlp, mm = hf + "mlp.", mc + "mlp."
        post_norm = hf + "post_attention_layernorm.weight"
        if layer < cfg["first_k_dense_replace"]:
            f = cfg["intermediate_size"]
            add(mm + "linear_fc1.layer_norm_weight", (h,), layer, "replicated", post_norm)
            add(mm + "linear_fc1.weight", (2 * f, h), layer, "swiglu", mlp + "gate_proj.weight", mlp + "up_proj.weight")
            add(mm + "linear_fc2.weight", (h, f), layer, "cols", mlp + "down_proj.weight")
            continue
        add(mc + "pre_mlp_layernorm.weight", (h,), layer, "replicated", post_norm)
        add(mm + "router.weight", (experts, h), layer, "replicated", mlp + "gate.weight")
        bias = mlp + "gate.e_score_correction_bias"
        add(mm + "router.expert_bias", (experts,), layer, "replicated", bias, dtype="float32")
        se, sm = mlp + "shared_experts.", mm + "shared_experts."
        gate, up = se + "gate_proj.weight", se + "up_proj.weight"
        add(sm + "linear_fc1.weight", (2 * mf * shared, h), layer, "swiglu", gate, up)
        add(sm + "linear_fc2.weight", (h, mf * shared), layer, "cols", se + "down_proj.weight")
        ex = mm + "experts.experts."
        add(ex + "linear_fc1.weight", (experts, 2 * mf, h), layer, "experts_fc1", mlp)
        add(ex + "linear_fc2.weight", (experts, h, mf), layer, "experts_fc2", mlp)
    add("decoder.final_layernorm.weight", (h,), None, "replicated", "model.norm.weight")
    add("output_layer.weight", (v, h), None, "rows", "lm_head.weight")
    return out


def by_key(cfg: Mapping[str, Any]) -> dict[str, MappedTensor]:
    """:func:`mapped_tensors` by dist-checkpoint key."""
    return {tensor.key: tensor for tensor in mapped_tensors(cfg)}


def hf_sources(cfg: Mapping[str, Any]) -> dict[str, HFSource]:
    """Every HF tensor of the Megatron model (no MTP layer): where it sits in which megatron-core tensor."""
    return {source.name: source for tensor in mapped_tensors(cfg) for source in tensor.hf_boxes()}
