"""Device memory that stays allocated in both phases: what the offloading rollout does not release, and HCCL buffers.

The offloading rollout (patch vllm_rollout_offload) frees the rollout's parameter storage and KV cache during
training and nothing else. What stays, per die (formulas; BF16 = 2 bytes; see docs/launch.md "Resident memory"):

- model buffers (non-parameter tensors, never released): the rotary cos/sin cache, about
  max_position_embeddings x rotary dim x 2 bytes (vLLM shares one cache per rotary configuration);
- persistent model-runner tensors (vllm-ascend ``NPUModelRunner.__init__``): int32/int64 index buffers sized by
  max_num_batched_tokens and max_num_seqs (input ids, positions, slot mapping, query/sequence lengths, about
  24 bytes per token) and the causal attention mask built for max_model_len (max_model_len^2 x 2 bytes);
- graph memory: TorchAir keeps each compiled decode graph's static workspace; its size is not derivable from the
  config. vllm-ascend logs it at capture (``capture_model``: free memory before minus after). Assumed here:
  ``TORCHAIR_GRAPH_ASSUMED_BYTES`` per captured batch size (replace it with the logged figure after a first run);
- HCCL buffers: every HCCL communicator a die joins holds a buffer of ``HCCL_BUFFSIZE`` MB (default 200) for
  collective input and one for output (counted as 2 x HCCL_BUFFSIZE; vendor description, not measured here).
  Communicators stay alive for the whole run; one per process group with more than one rank that runs a
  collective: Megatron TP, PP (p2p), DP, CP, EP, expert-TP, expert-DP and the embedding group, plus the world
  group, and vLLM's TP, DP and EP groups.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from r1_ascend.launch.model_info import BF16_BYTES, ModelInfo
from r1_ascend.parallel import Layout

MIB = 1024**2
#: HCCL's default per-communicator buffer size when HCCL_BUFFSIZE is unset (MB).
HCCL_BUFFSIZE_DEFAULT_MB = 200
#: Assumed static memory of one captured TorchAir decode graph (not derivable from the config; see module doc).
TORCHAIR_GRAPH_ASSUMED_BYTES = 1024**3
#: Index buffers of the model runner per token of max_num_batched_tokens (input ids, positions, slot mapping...).
RUNNER_BYTES_PER_TOKEN = 24


def hccl_buffsize_mb(env: Mapping[str, str]) -> int:
    raw = env.get("HCCL_BUFFSIZE")
    if raw is None or raw == "":
        return HCCL_BUFFSIZE_DEFAULT_MB
    try:
        value = int(raw)
    except ValueError:
        msg = f"HCCL_BUFFSIZE={raw!r} is not a whole number of MB; unset it (default 200) or give e.g. 200"
        raise ValueError(msg) from None
    if value <= 0:
        msg = f"HCCL_BUFFSIZE={value} must be a positive number of MB"
        raise ValueError(msg)
    return value


def hccl_communicators(train: Layout, rollout_tp: int, rollout_dp: int) -> list[str]:
    """Process groups of more than one rank that one die joins and runs collectives on."""
    groups = {
        "world": train.world,
        "megatron TP": train.tp,
        "megatron PP": train.pp,
        "megatron DP": train.dp,
        "megatron CP": train.cp,
        "megatron EP": train.ep,
        "megatron expert-TP": train.expert_tp,
        "megatron expert-DP": train.expert_dp,
        "megatron embedding": 2 if train.pp > 1 else 1,
        "vLLM TP": rollout_tp,
        "vLLM DP": rollout_dp,
        "vLLM EP": rollout_tp * rollout_dp,
    }
    return [name for name, size in groups.items() if size > 1]


def resident_rows(
    *,
    model: ModelInfo,
    rollout: Any,
    train: Layout,
    rollout_tp: int,
    rollout_dp: int,
    env: Mapping[str, str],
) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """``(rollout-side rows, HCCL rows)``: what the offloading rollout keeps during training, and the HCCL buffers."""
    max_len = int(rollout.max_model_len or int(rollout.prompt_length) + int(rollout.response_length))
    rotary_dim = int(model.config.get("qk_rope_head_dim") or model.hidden // int(model.config["num_attention_heads"]))
    positions = model.max_position_embeddings or max_len
    buffers = positions * rotary_dim * BF16_BYTES
    runner = int(rollout.max_num_batched_tokens) * RUNNER_BYTES_PER_TOKEN + max_len * max_len * BF16_BYTES
    rows: list[tuple[str, float]] = [
        ("rollout buffers kept (rotary cache)", float(buffers)),
        ("rollout runner tensors kept (index buffers, attention mask)", float(runner)),
    ]
    additional = ((rollout.engine_kwargs or {}).get("vllm") or {}).get("additional_config") or {}
    torchair = additional.get("torchair_graph_config") or {}
    if torchair.get("enabled", False) and not rollout.enforce_eager:
        sizes = len(torchair.get("graph_batch_sizes") or [1])
        rows.append(
            (f"TorchAir graph memory kept ({sizes} graph(s), assumed)", float(sizes * TORCHAIR_GRAPH_ASSUMED_BYTES))
        )
    communicators = hccl_communicators(train, rollout_tp, rollout_dp)
    size = hccl_buffsize_mb(env)
    hccl = [
        (
            f"HCCL buffers ({len(communicators)} communicators x 2 x HCCL_BUFFSIZE {size} MB)",
            2.0 * len(communicators) * size * MIB,
        )
    ]
    return rows, hccl
