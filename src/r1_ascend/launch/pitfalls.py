"""Preflight warnings: configurations that run, but learn nothing, waste compute or are known to be wrong.

verl, Megatron and vLLM accept every setting below, and the run goes on; the user learns days later that part of
it was pointless. Each rule names the settings it found, says what that costs in the run's own terms (no learning
signal, seconds per step, steps without a checkpoint) and gives the override that fixes it. ``--strict`` turns these
warnings into failures. docs/launch.md ("Warnings") lists every rule with its reason and source.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from functools import cache

from r1_ascend.launch.checks import OK, SKIPPED, WARNING, Finding, Run
from r1_ascend.launch.model_info import ModelInfo, known_model
from r1_ascend.launch.smoke_model import DEEPSEEK_V3_DIMS
from r1_ascend.launch.upstream_checks import uses_critic

#: The reference 671B step (512 prompts x 16 samples, prompt 1024 + response 3072, 256 dies; docs/launch.md,
#: "Warnings"): its total and its reference-model pass, in seconds.
REFERENCE_STEP_S = 1338.3
REFERENCE_REF_PASS_S = 116.7
_REFERENCE_SEQUENCES = 512 * 16
_REFERENCE_TOKENS = 1024 + 3072
_REFERENCE_DIES = 256


def _active_params(model: ModelInfo) -> int:
    """Parameters one token passes through (routed experts: ``num_experts_per_tok`` of them per MoE layer)."""
    total = model.total_params()
    if not model.is_moe:
        return total
    routed = int(model.config.get("num_experts_per_tok") or model.num_experts)
    moe_layers = model.num_layers - model.num_dense_layers
    return total - moe_layers * model.expert_params_per_moe_layer() * (model.num_experts - routed) // model.num_experts


#: DeepSeek-V3's structure (its published config.json, MTP off) on the dimensions the smoke model shares with it.
DEEPSEEK_V3 = ModelInfo(
    None,
    {
        **DEEPSEEK_V3_DIMS,
        "model_type": "deepseek_v3",
        "num_hidden_layers": 61,
        "first_k_dense_replace": 3,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
    },
)


@cache
def _reference_active_params() -> int:
    return _active_params(DEEPSEEK_V3)


def step_scale(run: Run) -> float | None:
    """This run's compute per die relative to the reference step: active params x tokens / dies (None: no model).

    A forward pass costs ~2 x active params per token, so a stage of the reference step scales with it; an estimate
    for sizing what a wasted stage costs, not a prediction of the run's speed.
    """
    model = _estimate_model(run)
    if model is None:
        return None
    cfg = run.config
    sequences = int(cfg.data.train_batch_size) * int(cfg.actor_rollout_ref.rollout.n)
    tokens = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
    work = _active_params(model) * sequences * tokens / max(run.world, 1)
    reference = _reference_active_params() * _REFERENCE_SEQUENCES * _REFERENCE_TOKENS / _REFERENCE_DIES
    return work / reference


def _estimate_model(run: Run) -> ModelInfo | None:
    """The model's config.json, or DeepSeek-V3's when the run is the shipped 671B configuration without MODEL_PATH."""
    if run.model is not None:
        return run.model
    known = known_model(run.config_name) if not run.config.actor_rollout_ref.model.path else None
    if known is not None and known[0] == "DeepSeek-V3":
        return DEEPSEEK_V3
    return None


def _is_mla(run: Run) -> bool | None:
    """Whether the model uses multi-head latent attention (None: unknown without its config.json)."""
    if run.model is not None:
        return run.model.is_mla
    known = known_model(run.config_name) if not run.config.actor_rollout_ref.model.path else None
    if known is None:
        return None
    return "kv_lora_rank" in known[1] or known[0].startswith("DeepSeek")


def _seconds(run: Run, reference_s: float) -> str:
    scale = step_scale(run)
    if scale is None:
        return f"{reference_s:.0f} s of the reference 671B step's {REFERENCE_STEP_S:.0f} s"
    return f"~{reference_s * scale:.0f} s per step, preflight's estimate scaled from the reference 671B step"


# --- upstream facts read from the installed source ----------------------------------------------------------------


@cache
def group_estimators() -> frozenset[str]:
    """Advantage estimators whose baseline is the prompt's group: verl's registered functions taking ``index``.

    Read from the installed ``verl/trainer/ppo/core_algos.py`` (the ``@register_adv_est`` decorators and the
    ``AdvantageEstimator`` enum), so an estimator verl adds or changes is classified by its own signature.
    """
    from r1_ascend.launch.upstream_source import UpstreamSourceError, module_file

    try:
        tree = ast.parse(module_file("verl.trainer.ppo.core_algos").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UpstreamSourceError):
        return frozenset()
    enum: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "AdvantageEstimator":
            for item in node.body:
                if isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant):
                    enum.update({t.id: str(item.value.value) for t in item.targets if isinstance(t, ast.Name)})
    names = set()
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or "index" not in {a.arg for a in node.args.args}:
            continue
        for deco in node.decorator_list:
            if isinstance(deco, ast.Call) and getattr(deco.func, "id", "") == "register_adv_est" and deco.args:
                arg = deco.args[0]
                if isinstance(arg, ast.Constant):
                    names.add(str(arg.value))
                elif isinstance(arg, ast.Attribute) and arg.attr in enum:
                    names.add(enum[arg.attr])
    return frozenset(names)


# --- the rules ----------------------------------------------------------------------------------------------------
# Each yields (check name, message) for what it found; an empty iterator means nothing to warn about. A rule that
# cannot decide (it needs the model's config.json) yields a SKIPPED finding itself.

Rule = Callable[[Run], Iterator[Finding]]


def _warn(name: str, message: str) -> Finding:
    return Finding(name, WARNING, message)


def rule_group_baseline(run: Run) -> Iterator[Finding]:
    cfg = run.config
    estimator, n = str(cfg.algorithm.adv_estimator), int(cfg.actor_rollout_ref.rollout.n)
    if n == 1 and estimator in group_estimators():
        yield _warn(
            "group_baseline",
            f"algorithm.adv_estimator={estimator} with actor_rollout_ref.rollout.n=1: every prompt is a group of one, "
            "so verl uses mean 0 (and std 1) as its baseline and the advantage is the raw reward: REINFORCE without "
            "a baseline, not GRPO. Fix: actor_rollout_ref.rollout.n=16 (R1-Zero samples 16 per prompt)",
        )


def rule_identical_samples(run: Run) -> Iterator[Finding]:
    rollout = run.config.actor_rollout_ref.rollout
    if int(rollout.n) > 1 and (not rollout.do_sample or float(rollout.temperature) == 0):
        yield _warn(
            "identical_samples",
            f"actor_rollout_ref.rollout.n={rollout.n} with do_sample={rollout.do_sample}, temperature="
            f"{rollout.temperature}: greedy decoding gives every prompt {rollout.n} identical responses, "
            "so each group's rewards are equal, every advantage is 0 and no step learns anything. Fix: "
            "actor_rollout_ref.rollout.do_sample=true actor_rollout_ref.rollout.temperature=0.9",
        )


def rule_kl_twice(run: Run) -> Iterator[Finding]:
    cfg = run.config
    if cfg.algorithm.use_kl_in_reward and cfg.actor_rollout_ref.actor.use_kl_loss:
        yield _warn(
            "kl_twice",
            "algorithm.use_kl_in_reward=true and actor_rollout_ref.actor.use_kl_loss=true: the KL to the reference "
            f"is penalised twice, in the reward (kl_ctrl.kl_coef {cfg.algorithm.kl_ctrl.kl_coef}) and in the loss "
            f"(kl_loss_coef {cfg.actor_rollout_ref.actor.kl_loss_coef}); GRPO puts it in the loss only (verl only "
            "prints a notice). Fix: algorithm.use_kl_in_reward=false",
        )


def rule_kl_zero_coef(run: Run) -> Iterator[Finding]:
    cfg = run.config
    actor = cfg.actor_rollout_ref.actor
    zero = []
    if actor.use_kl_loss and float(actor.kl_loss_coef) == 0:
        zero.append(
            (
                "actor_rollout_ref.actor.use_kl_loss=true with kl_loss_coef=0",
                "actor_rollout_ref.actor.use_kl_loss=false",
            )
        )
    if cfg.algorithm.use_kl_in_reward and float(cfg.algorithm.kl_ctrl.kl_coef) == 0:
        zero.append(("algorithm.use_kl_in_reward=true with kl_ctrl.kl_coef=0", "algorithm.use_kl_in_reward=false"))
    live = (actor.use_kl_loss and float(actor.kl_loss_coef) != 0) or (
        cfg.algorithm.use_kl_in_reward and float(cfg.algorithm.kl_ctrl.kl_coef) != 0
    )
    if not zero:
        return
    found = "; ".join(text for text, _ in zero)
    if live:
        cost = "that KL term is multiplied by 0 (the other one keeps the reference model running)"
    else:
        cost = (
            "the reference model still runs a forward pass over every sequence each step "
            f"({_seconds(run, REFERENCE_REF_PASS_S)}) and holds its weights, for a KL term multiplied by 0"
        )
    fixes = " ".join(fix for _, fix in zero)
    yield _warn("kl_zero_coef", f"{found}: {cost}. Fix: {fixes} (or a non-zero coefficient)")


def rule_critic_unused(run: Run) -> Iterator[Finding]:
    cfg = run.config
    estimator = str(cfg.algorithm.adv_estimator)
    if uses_critic(cfg) and estimator != "gae":
        yield _warn(
            "critic_unused",
            f"critic.enable={cfg.critic.get('enable')} with algorithm.adv_estimator={estimator}: verl builds, runs "
            "and trains a critic every step, but only GAE reads its values; the critic's forward, update and memory "
            "are spent on nothing. Fix: critic.enable=null",
        )


def rule_reward_model_overrides(run: Run) -> Iterator[Finding]:
    cfg = run.config
    if cfg.reward_model.enable and cfg.custom_reward_function.path:
        yield _warn(
            "reward_model_overrides",
            f"reward_model.enable=true with custom_reward_function.path={cfg.custom_reward_function.path}: verl's "
            "reward managers return the reward model's rm_scores whenever the batch has them, so the rule-based "
            "reward is never called. Fix: reward_model.enable=false",
        )


def rule_mla_tensor_parallel(run: Run) -> Iterator[Finding]:
    cfg = run.config
    tp = int(cfg.actor_rollout_ref.actor.megatron.tensor_model_parallel_size)
    if tp <= 1:
        return
    mla = _is_mla(run)
    if mla is None:
        yield Finding(
            "mla_tensor_parallel",
            SKIPPED,
            f"skipped: actor TP {tp} > 1; whether the model uses MLA needs its config.json (set MODEL_PATH)",
        )
        return
    if mla:
        yield _warn(
            "mla_tensor_parallel",
            f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp} on an MLA model: in megatron-core "
            "0.12.1 the shared rope key's gradient is not summed over the TP ranks (Megatron-LM#1699, open), so "
            "the rope rows of every layer's linear_kv_down_proj train on one rank's heads only. Fix: "
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1 (and the ref's), scale with EP/PP instead",
        )


def rule_truncated_sampling(run: Run) -> Iterator[Finding]:
    rollout = run.config.actor_rollout_ref.rollout
    found = []
    if float(rollout.top_p) < 1:
        found.append(f"top_p={rollout.top_p}")
    if int(rollout.top_k) > 0:
        found.append(f"top_k={rollout.top_k}")
    if found and rollout.do_sample:
        yield _warn(
            "truncated_sampling",
            f"actor_rollout_ref.rollout.{' and '.join(found)}: the rollout samples from a truncated distribution but "
            "the actor's loss and old log-probs use the full softmax at the rollout temperature, so the samples are "
            "off-policy in a way the PPO ratio does not correct (and the rollout guard compares different "
            "distributions). Fix: actor_rollout_ref.rollout.top_p=1 actor_rollout_ref.rollout.top_k=-1 (truncate "
            "only in val_kwargs)",
        )


def rule_ignore_eos(run: Run) -> Iterator[Finding]:
    rollout = run.config.actor_rollout_ref.rollout
    if rollout.ignore_eos:
        yield _warn(
            "ignore_eos",
            "actor_rollout_ref.rollout.ignore_eos=true: every response runs to "
            f"{run.config.data.max_response_length} tokens whatever the model says, so the rollout decodes past the "
            "answer and the reward scores the text after it. Fix: actor_rollout_ref.rollout.ignore_eos=false",
        )


def rule_response_length(run: Run) -> Iterator[Finding]:
    cfg = run.config
    rollout = cfg.actor_rollout_ref.rollout
    data_len, rollout_len = int(cfg.data.max_response_length), int(rollout.response_length)
    if rollout_len < data_len:
        yield _warn(
            "response_length",
            f"actor_rollout_ref.rollout.response_length={rollout_len} < data.max_response_length={data_len}: vLLM "
            f"stops every response at {rollout_len} tokens without a word (R1 answers come after a long <think>, a "
            "cut one scores 0), while memory and lengths are sized for the longer one. Fix: drop the "
            "rollout.response_length override (it follows data.max_response_length)",
        )


def rule_prompt_truncation(run: Run) -> Iterator[Finding]:
    data = run.config.data
    if not data.filter_overlong_prompts and str(data.truncation) != "error":
        yield _warn(
            "prompt_truncation",
            f"data.filter_overlong_prompts=false with data.truncation={data.truncation}: a prompt longer than "
            f"max_prompt_length {data.max_prompt_length} is cut silently (the question or the template's instruction "
            "is lost) and trained on. Fix: data.filter_overlong_prompts=true (drops them when the data is loaded)",
        )


#: Longest stretch of cluster time a run may go without a checkpoint before preflight warns.
MAX_HOURS_WITHOUT_CHECKPOINT = 12.0


def rule_checkpoint_interval(run: Run) -> Iterator[Finding]:
    trainer = run.config.trainer
    save, total = int(trainer.save_freq), trainer.total_training_steps
    if save <= 0:
        yield _warn(
            "checkpoint_interval",
            f"trainer.save_freq={save}: no checkpoint is ever written; a failure loses the whole run and nothing "
            "can be evaluated afterwards. Fix: trainer.save_freq=20",
        )
        return
    interval = min(save, int(total)) if total is not None else save
    scale = step_scale(run)
    if interval <= 1:
        return
    if scale is None:
        yield Finding(
            "checkpoint_interval",
            SKIPPED,
            f"skipped: {interval} steps between checkpoints; their duration needs the model's config.json",
        )
        return
    hours = REFERENCE_STEP_S * scale * interval / 3600
    if hours > MAX_HOURS_WITHOUT_CHECKPOINT:
        only = " (the only checkpoint is the last step's)" if total is not None and save >= int(total) else ""
        per_step = REFERENCE_STEP_S * scale / 3600
        fix = max(1, int(MAX_HOURS_WITHOUT_CHECKPOINT / per_step))
        yield _warn(
            "checkpoint_interval",
            f"trainer.save_freq={save} with trainer.total_training_steps={total}: {interval} steps between "
            f"checkpoints{only}, ~{hours:.0f} h of the cluster by preflight's estimate (~{per_step:.2f} h per step, "
            f"scaled from the reference 671B step); a failure loses all of it. Fix: trainer.save_freq={fix}",
        )


def rule_resume(run: Run) -> Iterator[Finding]:
    trainer = run.config.trainer
    if trainer.resume_mode == "disable":
        yield _warn(
            "resume",
            "trainer.resume_mode=disable: a restarted job starts again from step 0 and the checkpoints it wrote are "
            "never read (and the first save overwrites them). Fix: trainer.resume_mode=auto",
        )
    elif trainer.resume_mode == "resume_path" and not trainer.resume_from_path:
        yield _warn(
            "resume",
            "trainer.resume_mode=resume_path without trainer.resume_from_path: verl finds nothing to resume from "
            "and starts from step 0. Fix: trainer.resume_from_path=<default_local_dir>/global_step_N, or "
            "trainer.resume_mode=auto",
        )


def rule_validation_repeats(run: Run) -> Iterator[Finding]:
    val = run.config.actor_rollout_ref.rollout.val_kwargs
    greedy = not val.do_sample or float(val.temperature) == 0
    if int(val.n) > 1 and greedy:
        yield _warn(
            "validation_repeats",
            f"actor_rollout_ref.rollout.val_kwargs.n={val.n} with do_sample={val.do_sample}, temperature="
            f"{val.temperature}: greedy validation decodes the same answer {val.n} times, so {int(val.n) - 1} of "
            f"every {val.n} validation responses are generated for nothing. Fix: val_kwargs.do_sample=true "
            "val_kwargs.temperature=0.6 (pass@1 over samples, as R1 reports) or val_kwargs.n=1",
        )


def rule_no_update(run: Run) -> Iterator[Finding]:
    actor = run.config.actor_rollout_ref.actor
    optim = actor.optim
    total = run.config.trainer.total_training_steps
    found = []
    if float(optim.lr) == 0:
        found.append(f"actor_rollout_ref.actor.optim.lr={optim.lr} (the weights never change)")
    if int(actor.ppo_epochs) < 1:
        found.append(f"actor_rollout_ref.actor.ppo_epochs={actor.ppo_epochs} (no update is run)")
    warmup = int(optim.get("lr_warmup_steps") or -1)
    if warmup <= 0 and total is not None:
        warmup = int(float(optim.get("lr_warmup_steps_ratio") or 0) * int(total))
    if total is not None and warmup >= int(total) > 0:
        found.append(
            f"LR warm-up of {warmup} steps >= trainer.total_training_steps={total} (the learning rate never reaches "
            f"{optim.lr})"
        )
    if found:
        yield _warn(
            "no_update",
            "; ".join(found) + ": the rollout, reward and reference passes run every step for a policy that does not "
            "learn (or learns at a fraction of the rate). Fix: the recipe's optim.lr=1e-6, ppo_epochs=1, no warm-up",
        )


RULES: tuple[Rule, ...] = (
    rule_group_baseline,
    rule_identical_samples,
    rule_kl_twice,
    rule_kl_zero_coef,
    rule_critic_unused,
    rule_reward_model_overrides,
    rule_mla_tensor_parallel,
    rule_truncated_sampling,
    rule_ignore_eos,
    rule_response_length,
    rule_prompt_truncation,
    rule_checkpoint_interval,
    rule_resume,
    rule_validation_repeats,
    rule_no_update,
)


def check_pitfalls(run: Run) -> Iterator[Finding]:
    """Every rule's warnings; one ``ok`` line when none applies."""
    found = [finding for rule in RULES for finding in rule(run)]
    yield from found
    if not any(f.level == WARNING for f in found):
        yield Finding(
            "pitfalls", OK, f"{len(RULES)} rules: nothing that would run but learn nothing, waste steps or break"
        )
