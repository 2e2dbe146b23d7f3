"""What the preflight needs to know about a model, read from its HF ``config.json`` (no transformers import).

Parameter counts follow the HF tensor inventory: for DeepSeek-V3 they give exactly 671,026,419,200 main-model
parameters (docs/weights.md), which a test checks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r1_ascend.launch.smoke_model import SMOKE_STRUCTURE

BF16_BYTES = 2


class ModelConfigError(ValueError):
    """The model directory or its config.json cannot be used."""


@dataclass(frozen=True)
class ModelInfo:
    path: Path | None
    config: dict[str, Any]

    # --- identity / structure --------------------------------------------------------------------------------
    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", "?"))

    @property
    def num_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def hidden(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def vocab(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def is_mla(self) -> bool:
        return self.config.get("kv_lora_rank") is not None

    @property
    def num_experts(self) -> int:
        """Routed experts per MoE layer (0 for a dense model)."""
        return int(self.config.get("n_routed_experts") or self.config.get("num_experts") or 0)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_dense_layers(self) -> int:
        if not self.is_moe:
            return self.num_layers
        return min(int(self.config.get("first_k_dense_replace", 0)), self.num_layers)

    @property
    def max_position_embeddings(self) -> int | None:
        value = self.config.get("max_position_embeddings")
        return int(value) if value is not None else None

    @property
    def mtp_layers(self) -> int:
        return int(self.config.get("num_nextn_predict_layers", 0) or 0)

    @property
    def has_quantization(self) -> bool:
        return bool(self.config.get("quantization_config"))

    # --- parameter counts --------------------------------------------------------------------------------------
    def _attention_params(self) -> int:
        c, h = self.config, self.hidden
        heads = int(c["num_attention_heads"])
        norms = 2 * h  # input_layernorm + post_attention_layernorm
        if self.is_mla:
            q_lora, kv_lora = c.get("q_lora_rank"), int(c["kv_lora_rank"])
            nope, rope, v = int(c["qk_nope_head_dim"]), int(c["qk_rope_head_dim"]), int(c["v_head_dim"])
            if q_lora is None:
                q = heads * (nope + rope) * h
            else:
                q = int(q_lora) * h + int(q_lora) + heads * (nope + rope) * int(q_lora)
            kv = (kv_lora + rope) * h + kv_lora + heads * (nope + v) * kv_lora
            return q + kv + h * heads * v + norms
        head_dim = int(c.get("head_dim") or h // heads)
        kv_heads = int(c.get("num_key_value_heads") or heads)
        bias = bool(c.get("attention_bias", self.model_type.startswith("qwen2")))
        qkv = (heads + 2 * kv_heads) * head_dim * h + ((heads + 2 * kv_heads) * head_dim if bias else 0)
        return qkv + heads * head_dim * h + norms

    def _expert_params(self) -> int:
        return 3 * self.hidden * int(self.config["moe_intermediate_size"])

    def expert_params_per_moe_layer(self) -> int:
        """Routed-expert parameters of one MoE layer (the part expert parallelism splits)."""
        return self.num_experts * self._expert_params() if self.is_moe else 0

    def non_expert_params_per_layer(self, moe: bool) -> int:
        attention = self._attention_params()
        if not moe:
            return attention + 3 * self.hidden * int(self.config["intermediate_size"])
        shared = int(self.config.get("n_shared_experts", 0) or 0) * self._expert_params()
        router = self.num_experts * self.hidden + self.num_experts  # gate weight + e_score_correction_bias
        return attention + shared + router

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def head_params(self) -> int:
        """lm_head (0 when tied to the embedding) + final norm."""
        tied = bool(self.config.get("tie_word_embeddings", False))
        return (0 if tied else self.vocab * self.hidden) + self.hidden

    def total_params(self) -> int:
        """Main-model parameters (MTP layers excluded: they are not trained)."""
        moe_layers = self.num_layers - self.num_dense_layers
        total = self.num_dense_layers * self.non_expert_params_per_layer(moe=False)
        if moe_layers:
            total += moe_layers * (self.non_expert_params_per_layer(moe=True) + self.expert_params_per_moe_layer())
        return total + self.embedding_params() + self.head_params()

    def is_moe_layer(self, layer: int) -> bool:
        return self.is_moe and layer >= self.num_dense_layers

    # --- KV cache ------------------------------------------------------------------------------------------------
    def kv_cache_bytes_per_token(self, tp: int) -> int:
        """KV-cache bytes one token occupies on one rollout die (BF16).

        MLA caches the compressed latent plus the RoPE key, ``(kv_lora_rank + qk_rope_head_dim)`` values per layer,
        replicated on every tensor-parallel rank; standard attention caches K and V per KV head, split over TP
        (at least one head per rank).
        """
        if self.is_mla:
            per_layer = int(self.config["kv_lora_rank"]) + int(self.config["qk_rope_head_dim"])
            return per_layer * self.num_layers * BF16_BYTES
        heads = int(self.config["num_attention_heads"])
        head_dim = int(self.config.get("head_dim") or self.hidden // heads)
        kv_heads = int(self.config.get("num_key_value_heads") or heads)
        per_rank = max(1, -(-kv_heads // tp))
        return 2 * per_rank * head_dim * self.num_layers * BF16_BYTES


def load_model_info(model_dir: str | Path) -> ModelInfo:
    path = Path(model_dir).expanduser()
    config_file = path / "config.json"
    if not path.is_dir():
        msg = f"model directory {path} does not exist (actor_rollout_ref.model.path / MODEL_PATH)"
        raise ModelConfigError(msg)
    if not config_file.is_file():
        msg = f"{path} has no config.json; actor_rollout_ref.model.path must be an HF model directory"
        raise ModelConfigError(msg)
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        msg = f"cannot read {config_file}: {exc}"
        raise ModelConfigError(msg) from exc
    missing = [k for k in ("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads") if k not in config]
    if missing:
        msg = f"{config_file} lacks {', '.join(missing)}; is it a decoder-only LLM config?"
        raise ModelConfigError(msg)
    return ModelInfo(path, config)


#: The models the shipped run configurations are for, with the config.json values the layout checks need, so the
#: preflight can check them before MODEL_PATH exists (values from the models' published config.json). The smoke
#: model's attention dimensions depend on ``quickstart --model-dims``, so only its expert structure is listed.
KNOWN_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "grpo_deepseekv3_671b": (
        "DeepSeek-V3",
        {
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "kv_lora_rank": 512,
            "n_routed_experts": 256,
            "architectures": ["DeepseekV3ForCausalLM"],
            "num_experts_per_tok": 8,
            "n_group": 8,
            "topk_group": 4,
        },
    ),
    "grpo_deepseekv3_smoke": (
        "DeepSeek-V3 smoke model",
        {
            "architectures": ["DeepseekV3ForCausalLM"],
            **{
                k: SMOKE_STRUCTURE[k]
                for k in ("num_hidden_layers", "n_routed_experts", "num_experts_per_tok", "n_group", "topk_group")
            },
        },
    ),
    "grpo_qwen25_7b": (
        "Qwen2.5-7B",
        {"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "n_routed_experts": 0},
    ),
}


def known_model(config_name: str) -> tuple[str, dict[str, Any]] | None:
    """``(label, config.json subset)`` of the model a shipped run configuration is for, or None."""
    return KNOWN_MODELS.get(config_name)
