"""The rollout guard's statistics on the real model path, healthy and with planted faults, in one process.

The actor is megatron-core's DeepSeek-V3 ``GPTModel`` built as verl builds it (``hf_to_mcore_config`` ->
``make_megatron_module``, the overlay's config conversion applied) and loaded from the converted dist checkpoint;
each step its weights go through verl's ``per_tensor_generator`` export into the CPU rollout engine
(transformers' ``DeepseekV3ForCausalLM`` decoding through vllm-ascend's derived MLA matrices), which samples the
toy task's prompts at the training temperature and returns its log-probs; the actor scores the same tokens at the
same temperature, and the guard's statistics (:class:`r1_ascend.patches.rules.rollout_guard.DiffStats`) compare
the two. Then the actor takes a GRPO-style step (group-normalised toy-task rewards, Adam), so the policy moves as
it does in the rehearsal and the stale-weight faults have a previous step to be stale against.

After each update megatron-core's own expert-bias update runs (``_update_router_expert_bias``, what
``finalize_model_grads`` calls) at the rehearsal's rate, so the routing follows the rehearsal's too.

What differs from the rehearsal's loop: one rank (no EP; the rehearsal's EP 2 gives the same logits, issue
measurements in docs/benchmarks.md), torch Adam on the model's parameters instead of Megatron's distributed
optimizer, no PPO clipping or KL term. The rollout side and the statistic are the rehearsal's.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from r1_ascend.patches.rules import rollout_guard as guard
from r1_ascend.rehearse import rollout_faults
from r1_ascend.rehearse.rollout_faults import RolloutFault

TEMPERATURE = 0.9  # the smoke and 671B configs' training temperature


@dataclass(frozen=True)
class Setup:
    hf_dir: Path
    dist_ckpt: Path
    dtype: str = "bf16"
    seed: int = 0
    lr: float = 3e-3
    prompts: int = 8
    samples: int = 8
    response_length: int = 8
    #: megatron-core's moe_router_bias_update_rate, as the rehearsal sets it (r1_ascend.rehearse.config.Plan)
    bias_update_rate: float = 0.05


@dataclass
class StepResult:
    step: int
    fault: str | None
    stats: guard.DiffStats
    reward: float

    @property
    def values(self) -> dict[str, float]:
        return self.stats.statistics()


def stats_from_partials(partials: dict[str, Any]) -> guard.DiffStats:
    """The statistics of a step recorded as ``dataclasses.asdict(DiffStats)`` (the bench's JSON records)."""
    return guard.DiffStats(**{**partials, "seq_means": tuple(partials["seq_means"])})


@dataclass
class Loop:
    """Actor, engine and optimizer of one seeded run (build with :meth:`build`)."""

    setup: Setup
    actor: Any
    hf_config: Any
    tf_config: Any
    engine: Any
    optimizer: Any
    tokenizer: Any
    prompts: list[list[int]]
    answers: list[str]
    previous: dict[str, torch.Tensor] | None = None
    step: int = 0

    @classmethod
    def build(cls, setup: Setup) -> Loop:
        from transformers import AutoConfig, AutoTokenizer
        from verl.utils.model import load_mcore_dist_weights

        from r1_ascend.cpu.engine import CPUStandInLLM
        from r1_ascend.rehearse import toy_task
        from r1_ascend.rehearse.config import CPU_TRANSFORMER_OVERRIDES
        from r1_ascend.weights.model_check import build_actor, init_single_rank

        torch.manual_seed(setup.seed)
        init_single_rank("gloo")
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[setup.dtype]
        hf_config = AutoConfig.from_pretrained(str(setup.hf_dir))
        with contextlib.redirect_stdout(io.StringIO()):  # verl prints the whole transformer config on every build
            actor, tf_config = build_actor(hf_config, dtype, dict(CPU_TRANSFORMER_OVERRIDES), wrap_with_ddp=False)
        load_mcore_dist_weights(actor, str(setup.dist_ckpt), is_value_model=False)
        engine = CPUStandInLLM(
            str(setup.hf_dir), dtype={"fp32": "float32", "bf16": "bfloat16"}[setup.dtype], seed=setup.seed
        )
        tokenizer = AutoTokenizer.from_pretrained(str(setup.hf_dir))
        rows = toy_task.rows("train")
        chosen = torch.randperm(len(rows), generator=torch.Generator().manual_seed(setup.seed))[: setup.prompts]
        prompts = [
            tokenizer.apply_chat_template(rows[i]["prompt"], add_generation_prompt=True, tokenize=True) for i in chosen
        ]
        answers = [rows[i]["reward_model"]["ground_truth"] for i in chosen]
        params = [p for chunk in actor for p in chunk.parameters() if p.requires_grad]
        optimizer = torch.optim.Adam(params, lr=setup.lr, foreach=False)
        tf_config.moe_router_bias_update_rate = setup.bias_update_rate
        return cls(setup, actor, hf_config, tf_config, engine, optimizer, tokenizer, prompts, answers)

    def export(self) -> dict[str, torch.Tensor]:
        from r1_ascend.weights.model_check import export_weights

        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[self.setup.dtype]
        with contextlib.redirect_stdout(io.StringIO()):  # verl prints the transformer config on every conversion
            return {
                n: t.detach().clone()
                for n, t in export_weights(self.actor, self.hf_config, self.tf_config, dtype).items()
            }

    def run_step(self, fault: RolloutFault | None = None, *, update: bool = True) -> StepResult:
        """Sync (with ``fault`` planted), generate, compare, update; the step's statistics."""
        from vllm import SamplingParams

        from r1_ascend.rehearse import toy_task

        self.step += 1
        weights = self.export()
        rollout_faults.sync(self.engine, weights, self.previous, fault, self.prompts)
        self.previous = weights
        params = SamplingParams(
            n=self.setup.samples, temperature=TEMPERATURE, max_tokens=self.setup.response_length, logprobs=0
        )
        outputs = self.engine.generate([{"prompt_token_ids": p} for p in self.prompts], params)
        batch = _Batch.from_outputs(self.prompts, outputs, self.setup.response_length, self.engine.pad_token_id)
        actor_lp = self._actor_log_probs(batch, grad=update)
        stats = guard.DiffStats.from_tensors(actor_lp.detach(), batch.rollout_lp, batch.response_mask)
        texts = [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in batch.response_ids]
        rewards = torch.tensor(
            [
                toy_task.compute_score(solution_str=t, ground_truth=a)["score"]
                for t, a in zip(texts, batch.answers(self.answers), strict=True)
            ],
            dtype=torch.float32,
        )
        if update:
            self._update(actor_lp, batch, rewards)
        result = StepResult(self.step, None if fault is None else fault.name, stats, float(rewards.mean()))
        return result

    def _actor_log_probs(self, batch: _Batch, *, grad: bool) -> torch.Tensor:
        from verl.models.mcore import get_mcore_forward_fn

        forward = get_mcore_forward_fn(self.hf_config)
        for chunk in self.actor:
            chunk.train(grad)
        with torch.set_grad_enabled(grad):
            logits = forward(self.actor[0], batch.input_ids, batch.attention_mask, batch.position_ids, {}).float()
            width = batch.prompt_width
            response_logits = logits[:, width - 1 : -1] / TEMPERATURE
            lp = torch.log_softmax(response_logits, dim=-1)
            return lp.gather(-1, batch.input_ids[:, width:].unsqueeze(-1)).squeeze(-1)

    def _update(self, actor_lp: torch.Tensor, batch: _Batch, rewards: torch.Tensor) -> None:
        groups = rewards.view(-1, self.setup.samples)
        advantages = ((groups - groups.mean(-1, keepdim=True)) / (groups.std(-1, keepdim=True) + 1e-6)).flatten()
        mask = batch.response_mask.float()
        loss = -(advantages[:, None] * actor_lp * mask).sum() / mask.sum().clamp(min=1)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        if self.tf_config.moe_router_enable_expert_bias:
            import importlib

            # the module, not the function megatron.core.distributed re-exports under its name
            finalize = importlib.import_module("megatron.core.distributed.finalize_model_grads")
            finalize._update_router_expert_bias(self.actor, self.tf_config)


@dataclass
class _Batch:
    """Prompts left-padded to one width, responses right-padded: verl's layout of a rollout batch."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_mask: torch.Tensor
    rollout_lp: torch.Tensor
    prompt_width: int
    response_ids: list[list[int]]
    samples: int

    @classmethod
    def from_outputs(cls, prompts: list[list[int]], outputs: list[Any], length: int, pad: int) -> _Batch:
        width = max(len(p) for p in prompts)
        rows, masks, lps, responses = [], [], [], []
        for prompt, output in zip(prompts, outputs, strict=True):
            for completion in output.outputs:
                tokens = list(completion.token_ids)
                values = [entry[t].logprob for entry, t in zip(completion.logprobs, tokens, strict=True)]
                pad_left, pad_right = width - len(prompt), length - len(tokens)
                rows.append([pad] * pad_left + prompt + tokens + [pad] * pad_right)
                masks.append([0] * pad_left + [1] * (len(prompt) + len(tokens)) + [0] * pad_right)
                lps.append(values + [-1.0] * pad_right)
                responses.append(tokens)
        input_ids = torch.tensor(rows)
        attention_mask = torch.tensor(masks, dtype=torch.bool)
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        return cls(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            response_mask=attention_mask[:, width:].long(),
            rollout_lp=torch.tensor(lps, dtype=torch.float32),
            prompt_width=width,
            response_ids=responses,
            samples=len(outputs[0].outputs),
        )

    def answers(self, per_prompt: list[str]) -> list[str]:
        return [a for a in per_prompt for _ in range(self.samples)]


def healthy(setup: Setup, steps: int) -> list[StepResult]:
    loop = Loop.build(setup)
    return [loop.run_step() for _ in range(steps)]


class SyncRefused(RuntimeError):
    """The rollout's weight loader refused the sync a fault was planted in: the run stops there, before decoding."""

    def __init__(self, step: int, fault: str, message: str) -> None:
        super().__init__(f"step {step}, {fault}: {message}")
        self.step, self.fault, self.message = step, fault, message


def planted(setup: Setup, fault_name: str, at_step: int) -> list[StepResult]:
    """Healthy steps, then ``fault_name`` planted in the sync of step ``at_step`` (the last step measured).
    Raises :class:`SyncRefused` when the loader refuses that sync."""
    from r1_ascend.cpu.engine import WeightSyncError

    loop = Loop.build(setup)
    fault = rollout_faults.get(fault_name)
    results = [loop.run_step() for _ in range(1, at_step)]
    try:
        results.append(loop.run_step(fault))
    except WeightSyncError as error:
        raise SyncRefused(at_step, fault_name, str(error)) from error
    return results
