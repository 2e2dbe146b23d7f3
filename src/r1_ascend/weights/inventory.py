"""The tensor inventory a DeepSeek-V3 ``config.json`` implies, and the check of a checkpoint against it.

An index can only say which tensors a download *claims* to hold. The architecture says which it *must* hold: every
decoder layer (dense for the first ``first_k_dense_replace``, MoE after), every routed expert, the MLA and MoE parts,
the MTP layers (``num_nextn_predict_layers`` of them, numbered from ``num_hidden_layers``), embedding, final norm
and ``lm_head``; in an FP8 checkpoint every quantised weight has a ``_scale_inv`` of the ceil-divided block shape.
Every conversion step checks its input and its output against this list, so a missing or unexpected tensor is an
error that names it instead of a checkpoint that silently lacks a weight.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from r1_ascend.weights.errors import CheckpointFormatError
from r1_ascend.weights.fp8 import SCALE_SUFFIX, scale_shape

_SHOWN = 8  # names listed per category in an error message


@dataclass(frozen=True)
class TensorSpec:
    """One HF tensor of the checkpoint: ``kind`` is fp8 (gets a scale), bf16, norm (ones) or f32 (router bias)."""

    name: str
    shape: tuple[int, ...]
    kind: str

    @property
    def dtype(self) -> str:
        return {"fp8": "F8_E4M3", "bf16": "BF16", "norm": "BF16", "f32": "F32"}[self.kind]


def layer_specs(cfg: Mapping[str, Any], layer: int, *, mtp: bool) -> list[TensorSpec]:
    """The tensors of decoder layer ``layer`` (an MTP layer when ``mtp``), scales excluded."""
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    qn, qr, vd = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    ql, kvl = cfg.get("q_lora_rank"), cfg["kv_lora_rank"]
    p = f"model.layers.{layer}."
    specs = [TensorSpec(p + "input_layernorm.weight", (h,), "norm")]
    a = p + "self_attn."
    if ql:
        specs += [
            TensorSpec(a + "q_a_proj.weight", (ql, h), "fp8"),
            TensorSpec(a + "q_a_layernorm.weight", (ql,), "norm"),
            TensorSpec(a + "q_b_proj.weight", (nh * (qn + qr), ql), "fp8"),
        ]
    else:
        specs.append(TensorSpec(a + "q_proj.weight", (nh * (qn + qr), h), "fp8"))
    specs += [
        TensorSpec(a + "kv_a_proj_with_mqa.weight", (kvl + qr, h), "fp8"),
        TensorSpec(a + "kv_a_layernorm.weight", (kvl,), "norm"),
        TensorSpec(a + "kv_b_proj.weight", (nh * (qn + vd), kvl), "fp8"),
        TensorSpec(a + "o_proj.weight", (h, nh * vd), "fp8"),
        TensorSpec(p + "post_attention_layernorm.weight", (h,), "norm"),
    ]
    m = p + "mlp."
    if layer < cfg["first_k_dense_replace"] and not mtp:
        f = cfg["intermediate_size"]
        specs += [
            TensorSpec(m + "gate_proj.weight", (f, h), "fp8"),
            TensorSpec(m + "up_proj.weight", (f, h), "fp8"),
            TensorSpec(m + "down_proj.weight", (h, f), "fp8"),
        ]
    else:
        e, mf, s = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["n_shared_experts"]
        specs += [
            TensorSpec(m + "gate.weight", (e, h), "bf16"),
            TensorSpec(m + "gate.e_score_correction_bias", (e,), "f32"),
        ]
        for i in range(e):
            specs += [
                TensorSpec(f"{m}experts.{i}.gate_proj.weight", (mf, h), "fp8"),
                TensorSpec(f"{m}experts.{i}.up_proj.weight", (mf, h), "fp8"),
                TensorSpec(f"{m}experts.{i}.down_proj.weight", (h, mf), "fp8"),
            ]
        specs += [
            TensorSpec(m + "shared_experts.gate_proj.weight", (mf * s, h), "fp8"),
            TensorSpec(m + "shared_experts.up_proj.weight", (mf * s, h), "fp8"),
            TensorSpec(m + "shared_experts.down_proj.weight", (h, mf * s), "fp8"),
        ]
    if mtp:
        v = cfg["vocab_size"]
        specs += [
            TensorSpec(p + "enorm.weight", (h,), "norm"),
            TensorSpec(p + "hnorm.weight", (h,), "norm"),
            TensorSpec(p + "eh_proj.weight", (h, 2 * h), "bf16"),
            TensorSpec(p + "embed_tokens.weight", (v, h), "bf16"),
            TensorSpec(p + "shared_head.norm.weight", (h,), "norm"),
            TensorSpec(p + "shared_head.head.weight", (v, h), "bf16"),
        ]
    return specs


def mtp_layers(cfg: Mapping[str, Any]) -> int:
    return int(cfg.get("num_nextn_predict_layers") or 0)


def checkpoint_specs(cfg: Mapping[str, Any], *, mtp: bool = True) -> list[TensorSpec]:
    """Every tensor of a DeepSeek-V3-shaped FP8 checkpoint (scales excluded), in the upstream file order."""
    v, h = cfg["vocab_size"], cfg["hidden_size"]
    specs = [TensorSpec("model.embed_tokens.weight", (v, h), "bf16")]
    n_layers = cfg["num_hidden_layers"]
    for layer in range(n_layers + (mtp_layers(cfg) if mtp else 0)):
        specs += layer_specs(cfg, layer, mtp=layer >= n_layers)
    specs += [TensorSpec("model.norm.weight", (h,), "norm"), TensorSpec("lm_head.weight", (v, h), "bf16")]
    return specs


def expected_tensors(cfg: Mapping[str, Any], *, fp8: bool, mtp: bool) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (safetensors dtype, shape): FP8 weights with their scales, or everything dequantised to BF16."""
    _check_config(cfg)
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for spec in checkpoint_specs(cfg, mtp=mtp):
        if spec.kind == "fp8" and fp8:
            out[spec.name] = ("F8_E4M3", spec.shape)
            out[spec.name + SCALE_SUFFIX] = ("F32", scale_shape(spec.shape))  # type: ignore[arg-type]
        else:
            out[spec.name] = ("BF16" if spec.kind == "fp8" else spec.dtype, spec.shape)
    return out


_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "first_k_dense_replace",
    "num_attention_heads",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "intermediate_size",
    "moe_intermediate_size",
    "n_routed_experts",
    "n_shared_experts",
)


def _check_config(cfg: Mapping[str, Any]) -> None:
    missing = [k for k in _REQUIRED if not isinstance(cfg.get(k), int)]
    if missing:
        msg = (
            f"config.json lacks integer {missing}; expected a DeepSeek-V3-architecture config "
            "(model_type deepseek_v3). Use the config.json that came with the checkpoint."
        )
        raise CheckpointFormatError(msg)
    if cfg.get("moe_layer_freq", 1) != 1:
        msg = f"moe_layer_freq={cfg['moe_layer_freq']}: only 1 (every layer after the dense ones is MoE) is supported"
        raise CheckpointFormatError(msg)


def _names(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def check_inventory(
    have: Mapping[str, tuple[str, tuple[int, ...]]],
    expected: Mapping[str, tuple[str, tuple[int, ...]]],
    where: str,
    *,
    fix: str = "re-download or re-convert the checkpoint",
) -> None:
    """Raise naming every missing, unexpected or mis-shaped tensor of ``have`` (name -> (dtype, shape))."""
    missing = sorted(set(expected) - set(have))
    extra = sorted(set(have) - set(expected))
    wrong = sorted(
        f"{n} is {have[n][0]} {list(have[n][1])}, expected {expected[n][0]} {list(expected[n][1])}"
        for n in set(have) & set(expected)
        if (have[n][0], tuple(have[n][1])) != (expected[n][0], tuple(expected[n][1]))
    )
    if not (missing or extra or wrong):
        return
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing: {_names(missing)}")
    if extra:
        parts.append(f"{len(extra)} not in the architecture: {_names(extra)}")
    if wrong:
        parts.append(f"{len(wrong)} with the wrong dtype or shape: " + "; ".join(wrong[:_SHOWN]))
    msg = f"{where} does not match the tensor inventory its config.json implies: " + "; ".join(parts) + f". {fix}."
    raise CheckpointFormatError(msg)


def has_mtp(names: Any, cfg: Mapping[str, Any]) -> bool:
    """Whether any tensor of an MTP layer is present (the layers numbered from num_hidden_layers)."""
    first = int(cfg["num_hidden_layers"])
    prefixes = tuple(f"model.layers.{first + i}." for i in range(max(mtp_layers(cfg), 1)))
    return any(n.startswith(prefixes) for n in names)
