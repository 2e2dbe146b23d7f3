"""The toy task's base rate on a random tiny DeepSeek-V3, and a plain GRPO loop that shows how fast it rises.

A design aid for the rehearsal's schedule (the rehearsal itself is the proof). The model is the rehearsal's: the
config ``r1_ascend.rehearse.inputs.write_model`` writes (the smoke structure sized to the tiny tokenizer), built as
``transformers.DeepseekV3ForCausalLM`` in float32 and initialised either like the synthetic checkpoint
(``r1_ascend.weights.tiny.make_tensors``, FP8 weights dequantised) or by transformers' own ``_init_weights``.

``base-rate`` samples responses to the toy task's training prompts at the rollout temperature and prints the mean
reward per seed and over seeds. ``grpo`` runs verl's GRPO objective in one process: per step ``--prompts`` prompts
x ``--samples`` samples of at most ``--response-length`` tokens, advantages normalised within each prompt's group
(verl's ``norm_adv_by_std_in_grpo``), the policy-gradient loss on the sampled tokens averaged over tokens
(``token-mean``; on-policy, so the PPO ratio is 1), log-probs at the sampling temperature, verl's ``low_var_kl``
loss against the initial model with ``--kl-coef``, AdamW (weight decay 0.01) with gradient clipping at 1.0 as the
rehearsal's actor optimizer. It prints the mean reward of every step, then the means of the first and last three.

    python benchmarks/toy_task_bench.py base-rate --seeds 5
    python benchmarks/toy_task_bench.py grpo --seeds 2            # lr 3e-3, 12 steps, 8 prompts x 4 samples
    python benchmarks/toy_task_bench.py grpo --seeds 2 --lr 0     # control: the reward does not rise
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from r1_ascend.rehearse import toy_task
from r1_ascend.rehearse.inputs import write_model

SMOKE_TEMPERATURE = 0.9  # actor_rollout_ref.rollout.temperature of recipe/config/grpo_deepseekv3_smoke.yaml


def build_model(model_dir: Path, init: str, seed: int) -> torch.nn.Module:
    """DeepseekV3ForCausalLM from the rehearsal's config, initialised as the synthetic checkpoint or by transformers."""
    from transformers import AutoConfig, DeepseekV3ForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(config).float()
    if init == "synthetic":
        model.load_state_dict(synthetic_state_dict(config.to_dict(), list(model.state_dict()), seed))
    elif init != "default":
        msg = f"unknown init {init!r}; use 'synthetic' or 'default'"
        raise ValueError(msg)
    return model


def synthetic_state_dict(config: dict[str, Any], names: list[str], seed: int) -> dict[str, torch.Tensor]:
    """What the quickstart's conversion makes of ``make_tiny``'s checkpoint for ``config`` under ``seed`` (FP8 weights
    dequantised, expert biases balanced on the shipped prompts), as float32, for the names ``names``."""
    from r1_ascend.launch.routing_prompts import calibration_sets
    from r1_ascend.weights.router_balance import balanced_biases
    from r1_ascend.weights.tiny import bf16_state_dict

    state = bf16_state_dict(config, seed)
    state.update(balanced_biases(config, state, calibration_sets()))
    return {name: state[name].float() for name in names}


class Task:
    """The toy task's training prompts, tokenised with the model directory's chat template."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.rows = toy_task.rows("train")
        self.prompt_ids = [
            self.tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True) for row in self.rows
        ]
        self.eos = self.tokenizer.eos_token_id

    def batch(self, step: int, prompts: int) -> list[int]:
        """Row indices of a step: consecutive rows of the (already shuffled) training set, wrapping around."""
        return [(step * prompts + i) % len(self.rows) for i in range(prompts)]

    def rewards(self, rows: Sequence[int], responses: torch.Tensor) -> list[float]:
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        truths = [self.rows[r]["reward_model"]["ground_truth"] for r in rows]
        return [toy_task.compute_score(toy_task.DATA_SOURCE, t, g)["score"] for t, g in zip(texts, truths, strict=True)]


def sample(model: torch.nn.Module, task: Task, rows: Sequence[int], length: int, temperature: float):
    """(sequences, prompt width, response mask) for one prompt per entry of ``rows``, prompts left-padded."""
    prompts = [task.prompt_ids[r] for r in rows]
    width = max(map(len, prompts))
    input_ids = torch.tensor([[task.eos] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=length,
            eos_token_id=task.eos,
            pad_token_id=task.eos,
        )
    responses = out[:, width:]
    # the response runs up to and including its first EOS (as verl's rollout masks it)
    after_eos = (responses == task.eos).long().cumsum(dim=1) - (responses == task.eos).long()
    response_mask = (after_eos == 0).long()
    return out, width, attention, response_mask


def token_logprobs(model: torch.nn.Module, out: torch.Tensor, mask: torch.Tensor, width: int, temperature: float):
    """Log-probs of the response tokens at the sampling temperature (verl divides the logits the same way)."""
    positions = (mask.cumsum(dim=1) - 1).clamp_min(0)
    logits = model(input_ids=out, attention_mask=mask, position_ids=positions).logits[:, width - 1 : -1]
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, out[:, width:].unsqueeze(-1)).squeeze(-1)


def grpo_advantages(rewards: list[float], group: int) -> torch.Tensor:
    """verl's GRPO outcome advantage: (r - group mean) / (group std + 1e-6), std unbiased."""
    scores = torch.tensor(rewards).view(-1, group)
    if group == 1:
        return torch.zeros(scores.numel())
    return ((scores - scores.mean(dim=1, keepdim=True)) / (scores.std(dim=1, keepdim=True) + 1e-6)).view(-1)


def grpo_run(args: argparse.Namespace, model_dir: Path, task: Task, seed: int) -> list[float]:
    """Mean reward of each step of one GRPO run."""
    model = build_model(model_dir, args.init, seed)
    reference = copy.deepcopy(model).eval() if args.kl_coef else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), weight_decay=0.01)
    torch.manual_seed(seed)
    curve = []
    for step in range(args.steps):
        started = time.monotonic()
        rows = [r for r in task.batch(step, args.prompts) for _ in range(args.samples)]
        model.eval()
        out, width, prompt_mask, response_mask = sample(model, task, rows, args.response_length, args.temperature)
        rewards = task.rewards(rows, out[:, width:] * response_mask + task.eos * (1 - response_mask))
        advantages = grpo_advantages(rewards, args.samples).unsqueeze(1)
        model.train()
        mask = torch.cat([prompt_mask, response_mask], dim=1)
        logp = token_logprobs(model, out, mask, width, args.temperature)
        tokens = response_mask.sum().clamp_min(1)
        loss = -(advantages * logp * response_mask).sum() / tokens
        if reference is not None:
            with torch.no_grad():
                ref_logp = token_logprobs(reference, out, mask, width, args.temperature)
            log_ratio = (ref_logp - logp).clamp(-20, 20)
            low_var_kl = (log_ratio.exp() - log_ratio - 1).clamp(-10, 10)
            loss = loss + args.kl_coef * (low_var_kl * response_mask).sum() / tokens
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        curve.append(statistics.fmean(rewards))
        print(
            f"  seed {seed} step {step + 1:2d}: reward {curve[-1]:.3f}  ({time.monotonic() - started:.1f} s)",
            flush=True,
        )
    return curve


def base_rate(args: argparse.Namespace, model_dir: Path, task: Task) -> None:
    means = []
    for seed in range(args.seeds):
        model = build_model(model_dir, args.init, seed).eval()
        torch.manual_seed(seed)
        rewards: list[float] = []
        for start in range(0, args.samples_per_seed, args.prompts):
            rows = task.batch(start // args.prompts, args.prompts)
            out, width, _, response_mask = sample(model, task, rows, args.response_length, args.temperature)
            rewards += task.rewards(rows, out[:, width:] * response_mask + task.eos * (1 - response_mask))
        means.append(statistics.fmean(rewards))
        print(f"  init {args.init} seed {seed}: base rate {means[-1]:.3f} over {len(rewards)} responses", flush=True)
    spread = statistics.stdev(means) if len(means) > 1 else 0.0
    print(f"init {args.init}: base rate {statistics.fmean(means):.3f} (std over {len(means)} seeds {spread:.3f})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["base-rate", "grpo"])
    parser.add_argument("--init", choices=["synthetic", "default"], default="synthetic")
    parser.add_argument("--seeds", type=int, default=3, help="model (and sampling) seeds 0..N-1")
    parser.add_argument("--temperature", type=float, default=SMOKE_TEMPERATURE)
    parser.add_argument("--response-length", type=int, default=24)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step (rehearsal: data.train_batch_size)")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (rehearsal: rollout.n)")
    parser.add_argument("--samples-per-seed", type=int, default=200, help="base-rate: responses per seed")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--kl-coef", type=float, default=0.001, help="low_var_kl loss weight (0: no reference)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = write_model(Path(tmp) / "model")
        task = Task(model_dir)
        if args.mode == "base-rate":
            base_rate(args, model_dir, task)
            return 0
        print(
            f"GRPO: init {args.init}, lr {args.lr:g}, {args.steps} steps, {args.prompts} prompts x {args.samples} "
            f"samples, {args.response_length} tokens, temperature {args.temperature:g}, kl_coef {args.kl_coef:g}"
        )
        first, last = [], []
        for seed in range(args.seeds):
            curve = grpo_run(args, model_dir, task, seed)
            first.append(statistics.fmean(curve[:3]))
            last.append(statistics.fmean(curve[-3:]))
            print(f"seed {seed}: {' '.join(f'{r:.2f}' for r in curve)}  first-3 {first[-1]:.3f} last-3 {last[-1]:.3f}")
        print(
            f"mean over {args.seeds} seeds: first-3 {statistics.fmean(first):.3f} last-3 {statistics.fmean(last):.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
