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
import copy
import dataclasses
import importlib
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
    #: the weight-sync check's stop message for this step's sync (None: it passed); the step is measured anyway
    weight_check: str | None = None

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

        # as in the worker, which imports both verl modules that hold per_tensor_generator: the weight-sync check's
        # export wrapper is installed once both are (verl_weight_sync_check)
        importlib.import_module("verl.workers.megatron_workers")
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
        stopped = rollout_faults.sync(self.engine, weights, self.previous, fault, self.prompts)
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
        result = StepResult(self.step, None if fault is None else fault.name, stats, float(rewards.mean()), stopped)
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
    loop = Loop.build(setup)
    results = [loop.run_step() for _ in range(1, at_step)]
    results.append(_faulted_step(loop, fault_name))
    return results


@dataclass
class SeedRun:
    """One seed's healthy steps and, per fault, its planted step's result or the loader's refusal."""

    healthy: list[StepResult]
    faults: dict[str, StepResult | SyncRefused]


class BranchLeakError(RuntimeError):
    """A fault's step left state behind that the snapshot did not put back: a branched result would be wrong."""


def branched(setup: Setup, steps: int, fault_names: list[str], at_step: int) -> SeedRun:
    """``steps`` healthy steps and every fault planted at ``at_step``, on one loop. The healthy steps before
    ``at_step`` are the same for every fault (same seed, same data), so they run once; each fault's step then runs
    from a snapshot of the loop after step ``at_step - 1`` (:class:`LoopSnapshot`), which is put back after it for
    the next fault and the healthy steps that follow. The first fault's step runs again after the last one and must
    give the same statistics bit for bit (:class:`BranchLeakError` otherwise); ``--fresh`` of the bench compares a
    branched fault with the same fault planted on a loop of its own."""
    if at_step < 1:
        raise ValueError(f"faults are planted in a step >= 1, not {at_step}")
    loop = Loop.build(setup)
    results: list[StepResult] = []
    faults: dict[str, StepResult | SyncRefused] = {}
    for step in range(1, max(steps, at_step - 1 if fault_names else 0) + 1):
        if step == at_step:
            faults = _branches(loop, fault_names)
        results.append(loop.run_step())
    if fault_names and not faults:
        faults = _branches(loop, fault_names)
    return SeedRun(results[:steps], faults)


def _branches(loop: Loop, fault_names: list[str]) -> dict[str, StepResult | SyncRefused]:
    snapshot = LoopSnapshot.take(loop)
    outcomes: dict[str, StepResult | SyncRefused] = {}
    for name in [*fault_names, fault_names[0]]:
        try:
            outcome: StepResult | SyncRefused = _faulted_step(loop, name)
        except SyncRefused as refused:
            outcome = refused
        snapshot.restore(loop)
        if name in outcomes:
            if _outcome_key(outcome) != _outcome_key(outcomes[name]):
                msg = (
                    f"{name} planted again after {', '.join(fault_names[1:])} gave a different step "
                    f"({_outcome_key(outcomes[name])} then {_outcome_key(outcome)}): a fault's step changed state "
                    "LoopSnapshot does not restore"
                )
                raise BranchLeakError(msg)
            continue
        outcomes[name] = outcome
    return outcomes


def _outcome_key(outcome: StepResult | SyncRefused) -> str:
    """What must repeat exactly (repr: a NaN statistic equals itself here)."""
    if isinstance(outcome, SyncRefused):
        return f"refused: {outcome.message}"
    return repr((outcome.reward, sorted(dataclasses.asdict(outcome.stats).items())))


def _faulted_step(loop: Loop, fault_name: str) -> StepResult:
    from r1_ascend.cpu.engine import WeightSyncError

    try:
        return loop.run_step(rollout_faults.get(fault_name))
    except WeightSyncError as error:
        raise SyncRefused(loop.step, fault_name, str(error)) from error


@dataclass
class ModuleTreeCopy:
    """Every module under some roots, copied so that it can be put back in place: its attributes, child modules,
    parameters and buffers (a fault may replace a module or set a config attribute) and the values of its tensors (an
    update changes parameters in place). Put back in place because other objects hold the same modules and tensors
    (the optimizer its parameters, the engine's runner its model)."""

    modules: list[tuple[torch.nn.Module, dict[str, Any]]]
    tensors: list[tuple[torch.Tensor, torch.Tensor]]

    @classmethod
    def take(cls, roots: list[torch.nn.Module]) -> ModuleTreeCopy:
        modules, tensors, seen = [], [], set()
        for module in {id(m): m for root in roots for m in root.modules()}.values():
            state = dict(module.__dict__)
            for key in _MODULE_DICTS:
                state[key] = dict(state[key])
            modules.append((module, state))
            for value in [*state["_parameters"].values(), *state["_buffers"].values(), *state.values()]:
                if isinstance(value, torch.Tensor) and id(value) not in seen:
                    seen.add(id(value))
                    tensors.append((value, value.detach().clone()))
        return cls(modules, tensors)

    def restore(self) -> None:
        for module, state in self.modules:
            module.__dict__.clear()
            module.__dict__.update(state)
            for key in _MODULE_DICTS:
                module.__dict__[key] = dict(state[key])
        with torch.no_grad():
            for live, saved in self.tensors:
                if live.shape == saved.shape and live.dtype == saved.dtype:
                    live.copy_(saved)
                else:
                    live.data = saved.clone()


_MODULE_DICTS = ("_parameters", "_buffers", "_modules")


@dataclass
class LoopSnapshot:
    """What a step of :class:`Loop` changes, put back by :meth:`restore`: the actor's and the engine's modules
    (:class:`ModuleTreeCopy`), the optimizer's state, the MLA layers' derived matrices, the engine's sampler and
    sampling generator, torch's global generator, and the loop's weights of the previous sync and step count."""

    modules: ModuleTreeCopy
    attributes: list[tuple[Any, str, Any]]
    optimizer: dict[str, Any]
    generators: list[tuple[torch.Generator, torch.Tensor]]
    loop: tuple[dict[str, torch.Tensor] | None, int]

    @classmethod
    def take(cls, loop: Loop) -> LoopSnapshot:
        from r1_ascend.patches.impl.rollout_memory import MLA_DERIVED_MATRICES, mla_impls

        roots: list[torch.nn.Module] = [*loop.actor, loop.engine.model]
        vllm_loader = getattr(loop.engine.model, "vllm_loader", None)
        if vllm_loader is not None and vllm_loader.model is not None:
            roots.append(vllm_loader.model)
        attributes: list[tuple[Any, str, Any]] = [(loop.engine, "sampler", loop.engine.sampler)]
        for impl in mla_impls(loop.engine.runner.forward_context):
            attributes += [(impl, name, getattr(impl, name).clone()) for name in MLA_DERIVED_MATRICES]
        generators = [(g, g.get_state()) for g in (loop.engine.generator, torch.default_generator)]
        optimizer = copy.deepcopy(loop.optimizer.state_dict())
        return cls(ModuleTreeCopy.take(roots), attributes, optimizer, generators, (loop.previous, loop.step))

    def restore(self, loop: Loop) -> None:
        self.modules.restore()
        for owner, name, value in self.attributes:
            setattr(owner, name, value.clone() if isinstance(value, torch.Tensor) else value)
        for generator, state in self.generators:
            generator.set_state(state)
        loop.optimizer.load_state_dict(copy.deepcopy(self.optimizer))
        loop.optimizer.zero_grad(set_to_none=True)
        loop.previous, loop.step = self.loop
