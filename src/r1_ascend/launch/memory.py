"""A rough per-die device-memory estimate for the rollout and the training update, under the offload settings.

Formulas (BF16 = 2 bytes; "params/die" = the parameters one die holds):

- rollout weights: (non-expert params / rollout TP + routed-expert params / rollout EP) x 2, with rollout
  EP = TP x VLLM_DP_SIZE = world size;
- KV cache: sequences per vLLM DP rank (capped by max_num_seqs) x max_model_len x bytes per token, where MLA stores
  (kv_lora_rank + qk_rope_head_dim) x layers x 2 bytes per token on every TP rank (DeepSeek-V3: 70,272 B) and
  standard attention 2 x ceil(kv_heads / TP) x head_dim x layers x 2 bytes;
- rollout workspace (rough): max_num_batched_tokens x hidden x 2 x 16 + max_num_seqs x vocab / TP x 8 + 1 GiB;
- training weights and gradients: params of the largest pipeline stage on one die (non-expert / TP + experts /
  (EP x expert-TP)) x 2 each;
- Adam states (FP32 master + two moments = 12 bytes/param), sharded by the distributed optimizer over the dense and
  expert data-parallel groups; 0 on the device with MindSpeed's swap optimizer (states live in host memory);
- activations (rough): full recompute keeps one hidden state per layer per in-flight micro-batch (1F1B: up to PP
  micro-batches on the first stage), plus one layer's working set 34 x tokens x hidden bytes / TP (Korthikanti et al.
  with flash attention) and the routed tokens of an MoE layer; the last stage adds FP32 logits and their gradient,
  8 x tokens x vocab / TP bytes.

Memory that no offload releases is counted in both phases (r1_ascend.launch.resident): the rollout's buffers and
persistent runner tensors, TorchAir graph memory (assumed per graph) and the HCCL buffers of every communicator
(2 x HCCL_BUFFSIZE MB each, read from the launch environment). Whatever offload leaves on the device during the other
phase is added to it (actor weights during the rollout when
param_offload is off; the rollout's reservation, gpu_memory_utilization x die memory, during training when
free_cache_engine is off). It is an order-of-magnitude check before booking a cluster, not a profiler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from r1_ascend.launch.model_info import BF16_BYTES, ModelInfo
from r1_ascend.launch.resident import resident_rows
from r1_ascend.parallel import Layout

GIB = 1024**3
#: Device memory of one Atlas 800T A3 NPU die. Assumption: an A3 node has 8 Ascend 910C packages with 128 GB HBM
#: each, 2 dies per package, so 64 GB per die (vendor figure, not measured here; override with --device-memory-gb).
A3_DIE_MEMORY_GB = 64.0


@dataclass
class PhaseEstimate:
    phase: str
    rows: list[tuple[str, float]] = field(default_factory=list)  # (item, bytes)
    budget_bytes: float = 0.0
    budget_label: str = ""

    @property
    def total(self) -> float:
        return sum(v for _, v in self.rows)


@dataclass(frozen=True)
class MemoryInputs:
    model: ModelInfo
    train: Layout
    stage_layers: list[int]
    rollout_tp: int
    rollout_dp: int
    config: Any  # the resolved run config
    die_bytes: float
    env: Mapping[str, str] = field(default_factory=dict)  # the launch environment (HCCL_BUFFSIZE)


def _stage_param_split(model: ModelInfo, stages: list[int]) -> list[tuple[float, float]]:
    """(non-expert, expert) parameters per pipeline stage; the first holds the embedding, the last the head."""
    split = []
    start = 0
    for index, count in enumerate(stages):
        non_expert = 0.0
        expert = 0.0
        for layer in range(start, start + count):
            moe = model.is_moe_layer(layer)
            non_expert += model.non_expert_params_per_layer(moe=moe)
            if moe:
                expert += model.expert_params_per_moe_layer()
        if index == 0:
            non_expert += model.embedding_params()
        if index == len(stages) - 1:
            non_expert += model.head_params()
        split.append((non_expert, expert))
        start += count
    return split


def _stage_params(model: ModelInfo, stages: list[int], tp: int, ep: int, etp: int) -> float:
    """Parameters one die of the heaviest pipeline stage holds."""
    return max(non_expert / tp + expert / (ep * etp) for non_expert, expert in _stage_param_split(model, stages))


def _optimizer_params(model: ModelInfo, stages: list[int], train: Layout) -> float:
    """Parameters whose optimizer states one die holds (distributed optimizer: sharded over the data parallel group)."""
    return max(
        non_expert / train.tp / max(1, train.dp) + expert / (train.ep * train.expert_tp) / max(1, train.expert_dp)
        for non_expert, expert in _stage_param_split(model, stages)
    )


def _activations(inputs: MemoryInputs) -> float:
    cfg, model, train = inputs.config, inputs.model, inputs.train
    actor = cfg.actor_rollout_ref.actor
    micro = int(actor.ppo_micro_batch_size_per_gpu or 1)
    tokens = micro * (int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)) / train.cp
    hidden, tp = model.hidden, train.tp
    otc = actor.megatron.override_transformer_config
    full_recompute = otc.get("recompute_granularity") == "full"
    layers = max(inputs.stage_layers)
    in_flight = min(train.pp, 1 + int(cfg.data.train_batch_size) * int(cfg.actor_rollout_ref.rollout.n))
    layer_working = 34 * tokens * hidden / tp
    if model.is_moe:
        topk = int(model.config.get("num_experts_per_tok", 1))
        moe_ffn = int(model.config["moe_intermediate_size"])
        layer_working += tokens * topk * (2 * hidden + 3 * moe_ffn) * BF16_BYTES
    stored = tokens * hidden * BF16_BYTES / tp if full_recompute else layer_working
    logits = 8 * tokens * model.vocab / tp
    return layers * in_flight * stored + layer_working + logits


def estimate(inputs: MemoryInputs) -> list[PhaseEstimate]:
    cfg, model, train = inputs.config, inputs.model, inputs.train
    ref_cfg = cfg.actor_rollout_ref.ref.megatron
    actor_mega = cfg.actor_rollout_ref.actor.megatron
    rollout = cfg.actor_rollout_ref.rollout
    otc = actor_mega.override_transformer_config
    swap = bool(otc.get("swap_optimizer", False))
    use_ref = bool(cfg.actor_rollout_ref.actor.use_kl_loss) or bool(cfg.algorithm.use_kl_in_reward)

    weights = _stage_params(model, inputs.stage_layers, train.tp, train.ep, train.expert_tp) * BF16_BYTES
    grads = weights
    optimizer = 0.0 if swap else _optimizer_params(model, inputs.stage_layers, train) * 12

    # --- rollout -------------------------------------------------------------------------------------------------
    rollout_ep = inputs.rollout_tp * inputs.rollout_dp
    expert_total = (model.num_layers - model.num_dense_layers) * model.expert_params_per_moe_layer()
    non_expert_total = model.total_params() - expert_total
    rollout_weights = (non_expert_total / inputs.rollout_tp + expert_total / rollout_ep) * BF16_BYTES
    max_len = int(rollout.max_model_len or int(rollout.prompt_length) + int(rollout.response_length))
    seqs_per_dp = int(cfg.data.train_batch_size) * int(rollout.n) // max(1, inputs.rollout_dp)
    seqs = min(int(rollout.max_num_seqs), max(1, seqs_per_dp))
    kv = seqs * max_len * model.kv_cache_bytes_per_token(inputs.rollout_tp)
    workspace = (
        int(rollout.max_num_batched_tokens) * model.hidden * BF16_BYTES * 16
        + int(rollout.max_num_seqs) * model.vocab / inputs.rollout_tp * 8
        + GIB
    )
    rollout_phase = PhaseEstimate(
        "rollout",
        budget_bytes=float(rollout.gpu_memory_utilization) * inputs.die_bytes,
        budget_label=f"gpu_memory_utilization {float(rollout.gpu_memory_utilization):g} x die",
    )
    kept, hccl = resident_rows(
        model=model,
        rollout=rollout,
        train=train,
        rollout_tp=inputs.rollout_tp,
        rollout_dp=inputs.rollout_dp,
        env=inputs.env,
    )
    rollout_phase.rows += [
        ("vLLM weights", rollout_weights),
        (f"KV cache ({seqs} seqs x {max_len} tokens)", kv),
        ("workspace (rough)", workspace),
        *kept,
        *hccl,
    ]
    resident = []
    if not actor_mega.param_offload:
        resident.append(("actor weights kept (param_offload off)", weights))
    if use_ref and not ref_cfg.param_offload:
        resident.append(("reference weights kept (ref param_offload off)", weights))
    if not actor_mega.grad_offload:
        resident.append(("gradients kept (grad_offload off)", grads))
    if optimizer and not actor_mega.optimizer_offload:
        resident.append(("optimizer states kept (optimizer_offload off)", optimizer))
    if resident:
        # Training state that stays on the device sits outside vLLM's reservation: compare against the whole die.
        rollout_phase.rows += resident
        rollout_phase.budget_bytes = inputs.die_bytes
        rollout_phase.budget_label = "die"

    # --- training update ---------------------------------------------------------------------------------------
    update = PhaseEstimate("update", budget_bytes=inputs.die_bytes, budget_label="die")
    update.rows += [
        ("actor weights (heaviest stage)", weights),
        ("gradients", grads),
        ("Adam states" + (" (swap optimizer: host)" if swap else " (distributed optimizer shard)"), optimizer),
        ("activations (rough)", _activations(inputs)),
    ]
    if use_ref and not ref_cfg.param_offload:
        update.rows.append(("reference weights kept (ref param_offload off)", weights))
    if not rollout.free_cache_engine:
        update.rows.append(("rollout reservation kept (free_cache_engine off)", rollout_phase.budget_bytes))
    else:
        update.rows += kept
    update.rows += hccl
    return [rollout_phase, update]
