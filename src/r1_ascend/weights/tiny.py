"""Synthetic DeepSeek-V3-shaped FP8 checkpoints for tests, the CPU quickstart and benchmarks.

Same tensor names, dtypes, FP8 block scales and config keys as the real checkpoint, with dimensions that are not
multiples of 128 (partial scale blocks), an MTP layer at index ``num_hidden_layers`` and some ``_scale_inv`` tensors
deliberately stored in a different shard from their weight, so every lookup path of the converters is exercised.
Shards are written with safetensors' own writer so the converters are never tested against their own output.

The routers route like a trained MoE's (:mod:`r1_ascend.weights.router_balance`): router weights with a spread that
makes routing depend on the token, token embeddings that lead the residual stream (:data:`INIT_STD`), and, when
``make_tiny`` is given calibration prompts, expert biases that balance the load on them (without prompts the bias
is 0).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from r1_ascend.weights.fp8 import FP8_DTYPE, SCALE_SUFFIX, quantize_fp8_blockwise, scale_shape
from r1_ascend.weights.inventory import TensorSpec, checkpoint_specs
from r1_ascend.weights.inventory import layer_specs as _layer_specs
from r1_ascend.weights.router_balance import PromptSet, balanced_biases, router_init_std
from r1_ascend.weights.safetensors_io import DTYPE_SIZE, PT_METADATA

log = logging.getLogger(__name__)

TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 320,
    "intermediate_size": 448,
    "moe_intermediate_size": 96,
    "num_hidden_layers": 3,
    "first_k_dense_replace": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "q_lora_rank": 96,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "num_nextn_predict_layers": 1,
}


def deepseek_v3_config(**overrides: Any) -> dict[str, Any]:
    """A config.json shaped like DeepSeek-V3's (FP8 quantization_config, MTP on); sizes from ``overrides``."""
    cfg: dict[str, Any] = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "aux_loss_alpha": 0.001,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "ep_size": 1,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": 163840,  # rope_scaling factor x original_max_position_embeddings, as V3
        "moe_layer_freq": 1,
        "norm_topk_prob": True,
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-6,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
            "type": "yarn",
        },
        "rope_theta": 10000,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "seq_aux": True,
        "tie_word_embeddings": False,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.46.3",
        "use_cache": True,
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
        },
    }
    cfg.update(TINY_CONFIG)
    cfg.update(overrides)
    return cfg


#: The router's weight (experts x hidden), drawn with router_init_std instead of 0.02.
ROUTER_SUFFIX = ".mlp.gate.weight"
#: Standard deviations other than 0.02, by tensor name. The token embedding is drawn at 1.0, so the residual stream
#: (which every layer adds its small output to) is led by the token itself: routing then depends on the token, and
#: it stays put while the rehearsal trains at its toy learning rate. With N(0, 0.02) embeddings one Adam step at the
#: rehearsal's lr (3e-3, every weight moves by about lr) shifts every token's hidden state the same way, and the
#: routers sent all tokens of a layer to a few experts within two steps even with the router weights frozen
#: (docs/launch.md, "Toy task"). The RMS norm in front of every layer makes the scale itself invisible to it.
INIT_STD: dict[str, float] = {"model.embed_tokens.weight": 1.0}


def _generator(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def make_tensors(spec: TensorSpec, seed: int, *, fast: bool) -> dict[str, torch.Tensor]:
    """The tensor (and its scale for FP8) for ``spec``; deterministic in (seed, name).

    ``fast`` draws FP8 bytes directly (no NaN codes) instead of quantising a Gaussian: same format, ~10x quicker,
    used for multi-GB benchmark checkpoints. Router weights get :func:`router_init_std`; the router's expert bias
    (the only float32 tensor) is 0 here and set by :func:`make_tiny` from calibration prompts.
    """
    gen = _generator(seed, spec.name)
    if spec.kind == "norm":
        return {spec.name: torch.ones(spec.shape, dtype=torch.bfloat16)}
    if spec.kind == "f32":
        return {spec.name: torch.zeros(spec.shape, dtype=torch.float32)}
    if spec.kind == "bf16":
        std = router_init_std(spec.shape[1]) if spec.name.endswith(ROUTER_SUFFIX) else INIT_STD.get(spec.name, 0.02)
        return {spec.name: (torch.randn(spec.shape, generator=gen) * std).to(torch.bfloat16)}
    if fast:
        raw = torch.randint(0, 256, spec.shape, generator=gen, dtype=torch.uint8)
        raw[(raw & 0x7F) == 0x7F] = 0  # 0x7F / 0xFF are the only NaN codes of e4m3fn
        weight = raw.view(FP8_DTYPE)
        scale = torch.rand(scale_shape(spec.shape), generator=gen, dtype=torch.float32) * 1e-4 + 1e-5
    else:
        weight, scale = quantize_fp8_blockwise(torch.randn(spec.shape, generator=gen) * 0.02)
    return {spec.name: weight, spec.name + SCALE_SUFFIX: scale}


def bf16_state_dict(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """The tensors (HF names, MTP layers left out) the FP8 -> BF16 conversion makes of ``make_tiny(config, seed)``'s
    checkpoint before its expert biases are set: FP8 weights dequantised exactly as the converter does."""
    from r1_ascend.weights.fp8 import dequantize_fp8_blockwise

    state = {}
    for spec in checkpoint_specs(config, mtp=False):
        made = make_tensors(spec, seed, fast=False)
        weight = made[spec.name]
        if spec.kind == "fp8":
            weight = dequantize_fp8_blockwise(weight, made[spec.name + SCALE_SUFFIX], name=spec.name)
        state[spec.name] = weight
    return state


@dataclass
class TinyCheckpoint:
    """What ``make_tiny`` wrote: useful for tests that need to know where scales were moved."""

    path: Path
    config: dict[str, Any]
    weight_map: dict[str, str]
    moved_scales: list[str] = field(default_factory=list)
    total_size: int = 0


def _entry_bytes(spec: TensorSpec) -> int:
    n = 1
    for d in spec.shape:
        n *= d
    size = n * DTYPE_SIZE[spec.dtype]
    if spec.kind == "fp8":
        rows, cols = scale_shape(spec.shape)
        size += rows * cols * 4
    return size


def make_tiny(
    out_dir: str | Path,
    *,
    seed: int = 0,
    max_shard_bytes: int = 400_000,
    config_overrides: dict[str, Any] | None = None,
    fast: bool = False,
    move_scales_every: int = 7,
    routing_prompts: Sequence[PromptSet] = (),
) -> TinyCheckpoint:
    """Write a DeepSeek-V3-shaped FP8 checkpoint (config, index, shards, tokenizer stub) into ``out_dir``.

    Every ``move_scales_every``-th FP8 weight gets its ``_scale_inv`` stored in the next shard. ``routing_prompts``
    (sets of token-id sequences) balance each MoE layer's expert bias on them, as training would
    (:func:`r1_ascend.weights.router_balance.balanced_biases`, run on the BF16 model the conversion will produce);
    without them the bias is 0. Not with ``fast``, whose FP8 bytes are not a model.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = deepseek_v3_config(**(config_overrides or {}))
    if routing_prompts and fast:
        msg = "routing_prompts balance a model's routers; fast=True draws FP8 bytes that are no model"
        raise ValueError(msg)
    balanced = balanced_biases(cfg, bf16_state_dict(cfg, seed), routing_prompts) if routing_prompts else {}
    specs = checkpoint_specs(cfg)
    shards: list[list[TensorSpec]] = [[]]
    used = 0
    for spec in specs:
        size = _entry_bytes(spec)
        if shards[-1] and used + size > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(spec)
        used += size
    n = len(shards)
    names = [f"model-{i + 1:05d}-of-{n:06d}.safetensors" for i in range(n)]
    # name -> shard index; scales start next to their weight, some are then moved to the next shard.
    placement: dict[str, int] = {}
    moved: list[str] = []
    fp8_count = 0
    for i, shard in enumerate(shards):
        for spec in shard:
            placement[spec.name] = i
            if spec.kind == "fp8":
                target = i
                if n > 1 and fp8_count % move_scales_every == 0:
                    target = (i + 1) % n
                    moved.append(spec.name + SCALE_SUFFIX)
                placement[spec.name + SCALE_SUFFIX] = target
                fp8_count += 1
    by_shard: list[list[TensorSpec]] = [[] for _ in range(n)]
    for spec in specs:
        by_shard[placement[spec.name]].append(spec)
    pending_scales: dict[int, dict[str, torch.Tensor]] = {i: {} for i in range(n)}
    total = 0
    # A scale moved to shard i+1 is produced while writing shard i; shard 0 may receive one from the last shard,
    # so the last shard's tensors that belong elsewhere are generated up front (they are tiny).
    for spec in by_shard[n - 1]:
        if spec.kind == "fp8" and placement[spec.name + SCALE_SUFFIX] != n - 1:
            scale_name = spec.name + SCALE_SUFFIX
            pending_scales[placement[scale_name]][scale_name] = make_tensors(spec, seed, fast=fast)[scale_name]
    for i in range(n):
        tensors: dict[str, torch.Tensor] = dict(pending_scales.pop(i))
        for spec in by_shard[i]:
            made = {spec.name: balanced[spec.name]} if spec.name in balanced else make_tensors(spec, seed, fast=fast)
            tensors[spec.name] = made[spec.name]
            if spec.kind == "fp8":
                scale_name = spec.name + SCALE_SUFFIX
                target = placement[scale_name]
                if target == i:
                    tensors[scale_name] = made[scale_name]
                elif target > i:
                    pending_scales[target][scale_name] = made[scale_name]
        save_file(tensors, str(out / names[i]), metadata=dict(PT_METADATA))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors
    weight_map = {name: names[i] for name, i in sorted(placement.items())}
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096}) + "\n")
    log.info("wrote a %d-shard synthetic DeepSeek-V3 FP8 checkpoint (%d bytes) to %s", n, total, out)
    return TinyCheckpoint(out, cfg, weight_map, moved, total)


def config_for_size(target_bytes: int) -> dict[str, Any]:
    """Config overrides whose FP8 checkpoint is about ``target_bytes`` (benchmarks): grows experts and layers."""
    base = {
        "hidden_size": 1000,
        "moe_intermediate_size": 700,
        "intermediate_size": 2900,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "q_lora_rank": 300,
        "kv_lora_rank": 200,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32,
        "v_head_dim": 64,
        "vocab_size": 4000,
        "n_routed_experts": 16,
        "num_hidden_layers": 2,
    }
    per_layer = sum(_entry_bytes(s) for s in _layer_specs(deepseek_v3_config(**base), 1, mtp=False))
    base["num_hidden_layers"] = max(2, round(target_bytes / per_layer) - 1)
    return base
