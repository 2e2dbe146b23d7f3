"""The shape of the smoke-test model: DeepSeek-V3's structure (MLA, dense then MoE layers, shared expert, grouped
routing) with 4 layers and 16 routed experts, so the smoke config's layouts (actor PP2 EP8, rollout EP16 on one
16-die node) divide it like the 671B layouts divide DeepSeek-V3. Also the one definition of the small inputs built
from it: its tiny BF16 config (preflight tests, rehearsal) and the shipped sample the smoke data comes from.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any

SMOKE_STRUCTURE: dict[str, Any] = {
    "num_hidden_layers": 4,
    "first_k_dense_replace": 1,
    "n_routed_experts": 16,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
}

#: DeepSeek-V3's own dimensions (attention, FFN, vocabulary), for a smoke model whose kernels see real shapes on the
#: NPU (~5.7 B parameters with SMOKE_STRUCTURE). The CPU quickstart uses the tiny dimensions instead.
DEEPSEEK_V3_DIMS: dict[str, Any] = {
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "max_position_embeddings": 163840,
}

#: Megatron layout the smoke checkpoint is chunked for (it loads at any layout; this keeps rank files small).
SMOKE_CONVERT_LAYOUT = {"pp": 2, "ep": 8, "pp_layers": (2, 2)}


def smoke_overrides(dims: str) -> dict[str, Any]:
    if dims == "tiny":
        return dict(SMOKE_STRUCTURE)
    if dims == "deepseek-v3":
        return {**SMOKE_STRUCTURE, **DEEPSEEK_V3_DIMS, "num_hidden_layers": 4, "first_k_dense_replace": 1}
    msg = f"unknown model dimensions {dims!r}; use 'tiny' (CPU) or 'deepseek-v3' (NPU smoke run)"
    raise ValueError(msg)


def smoke_model_config(**overrides: Any) -> dict[str, Any]:
    """The smoke model's BF16 ``config.json`` with the tiny dimensions (MTP and FP8 quantization off), as the
    preflight tests and the CPU rehearsal load it; ``overrides`` replace any key."""
    from r1_ascend.weights.tiny import deepseek_v3_config

    config = deepseek_v3_config(**SMOKE_STRUCTURE, num_nextn_predict_layers=0)
    config.pop("quantization_config")
    config.update(overrides)
    return config


def sample_path() -> Path:
    """The shipped DeepScaleR sample the quickstart, the rehearsal and the tiny tokenizer start from."""
    return Path(str(files("r1_ascend.data").joinpath("sample", "deepscaler_sample.json")))
