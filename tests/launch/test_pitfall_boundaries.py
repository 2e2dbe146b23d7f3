"""Each preflight warning (r1_ascend.launch.pitfalls) at the edge of its rule: the setting just inside warns, the one
just outside does not, and a condition the rule needs cannot be dropped (greedy decoding is not truncated sampling).

The rules are called directly on the shipped 671B configuration, composed once by preflight, with one setting
changed per case; ``test_pitfalls.py`` runs the same rules through ``r1-ascend preflight``.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from omegaconf import OmegaConf

from r1_ascend.launch import pitfalls
from r1_ascend.launch.checks import OK, SKIPPED, WARNING, Run
from r1_ascend.launch.model_info import KNOWN_MODELS, ModelInfo
from r1_ascend.launch.overlays import DEFAULT_OVERLAY, SMOKE_OVERLAY
from r1_ascend.launch.preflight import run_checks

A = "actor_rollout_ref"


@pytest.fixture(scope="module")
def shipped() -> Run:
    """The shipped 671B run as preflight sees it without a model directory (DeepSeek-V3's known structure)."""
    run, _ = run_checks(DEFAULT_OVERLAY, [], env={}, check_patches=False)
    return run


def changed(run: Run, **settings: Any) -> Run:
    """``run`` with dotted config keys (``__`` for ``.``) set to new values; the original is left as it was."""
    config = copy.deepcopy(run.config)
    for key, value in settings.items():
        OmegaConf.update(config, key.replace("__", "."), value, force_add=True)
    return dataclasses.replace(run, config=config)


def unknown_model(run: Run, **settings: Any) -> Run:
    """``run`` (with ``settings`` changed) on a model preflight cannot know: a path it could not read, a config it
    does not ship."""
    return dataclasses.replace(
        changed(run, **{f"{A}__model__path": "/x", **settings}), config_name="custom", model=None
    )


def levels(rule: pitfalls.Rule, run: Run) -> list[str]:
    return [finding.level for finding in rule(run)]


def warns(rule: pitfalls.Rule, run: Run) -> bool:
    return WARNING in levels(rule, run)


def test_the_shipped_run_raises_none_of_the_rules(shipped: Run) -> None:
    """The base every case below changes one setting of: no rule warns on it."""
    assert [f for rule in pitfalls.RULES for f in rule(shipped) if f.level != OK] == []


# --- sampling --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({f"{A}__rollout__top_p": 0.999}, True),
        ({f"{A}__rollout__top_p": 1.0}, False),
        ({f"{A}__rollout__top_k": 1}, True),
        ({f"{A}__rollout__top_k": 0}, False),  # vLLM: 0 and -1 both mean no top-k
        ({f"{A}__rollout__top_k": -1}, False),
        # greedy decoding samples nothing, so nothing is truncated (identical_samples covers greedy with n > 1)
        ({f"{A}__rollout__top_p": 0.9, f"{A}__rollout__do_sample": False}, False),
        ({f"{A}__rollout__top_k": 50, f"{A}__rollout__do_sample": False}, False),
    ],
)
def test_truncated_sampling_warns_only_when_sampling_from_a_cut_distribution(
    shipped: Run, settings: dict[str, Any], expected: bool
) -> None:
    assert warns(pitfalls.rule_truncated_sampling, changed(shipped, **settings)) is expected


def test_truncated_sampling_names_every_cut_it_found(shipped: Run) -> None:
    run = changed(shipped, **{f"{A}__rollout__top_p": 0.9, f"{A}__rollout__top_k": 20})
    (finding,) = pitfalls.rule_truncated_sampling(run)
    assert "top_p=0.9 and top_k=20" in finding.message


@pytest.mark.parametrize(
    ("n", "do_sample", "temperature", "expected"),
    [
        (2, False, 0.9, True),
        (2, True, 0.0, True),
        (2, True, 0.01, False),
        (1, False, 0.0, False),  # one sample per prompt: nothing to be identical to
        (16, True, 0.9, False),
    ],
)
def test_identical_samples_needs_several_greedy_samples(
    shipped: Run, n: int, do_sample: bool, temperature: float, expected: bool
) -> None:
    run = changed(
        shipped,
        **{f"{A}__rollout__n": n, f"{A}__rollout__do_sample": do_sample, f"{A}__rollout__temperature": temperature},
    )
    assert warns(pitfalls.rule_identical_samples, run) is expected


@pytest.mark.parametrize(
    ("n", "do_sample", "temperature", "expected"),
    [
        (2, False, 0.6, True),
        (2, True, 0.0, True),
        (2, True, 0.6, False),
        (1, False, 0.0, False),
    ],
)
def test_validation_repeats_needs_several_greedy_answers(
    shipped: Run, n: int, do_sample: bool, temperature: float, expected: bool
) -> None:
    val = f"{A}__rollout__val_kwargs"
    run = changed(shipped, **{f"{val}__n": n, f"{val}__do_sample": do_sample, f"{val}__temperature": temperature})
    assert warns(pitfalls.rule_validation_repeats, run) is expected


def test_validation_repeats_counts_the_wasted_answers(shipped: Run) -> None:
    val = f"{A}__rollout__val_kwargs"
    run = changed(shipped, **{f"{val}__n": 4, f"{val}__do_sample": False})
    (finding,) = pitfalls.rule_validation_repeats(run)
    assert "3 of every 4 validation responses" in finding.message


@pytest.mark.parametrize(("n", "estimator", "expected"), [(1, "grpo", True), (2, "grpo", False), (1, "gae", False)])
def test_group_baseline_needs_one_sample_and_a_group_estimator(
    shipped: Run, n: int, estimator: str, expected: bool
) -> None:
    run = changed(shipped, **{f"{A}__rollout__n": n, "algorithm__adv_estimator": estimator})
    assert warns(pitfalls.rule_group_baseline, run) is expected


# --- KL, critic, reward model ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("in_reward", "in_loss", "expected"), [(True, True, True), (True, False, False)])
def test_kl_twice_needs_both_penalties(shipped: Run, in_reward: bool, in_loss: bool, expected: bool) -> None:
    run = changed(shipped, **{"algorithm__use_kl_in_reward": in_reward, f"{A}__actor__use_kl_loss": in_loss})
    assert warns(pitfalls.rule_kl_twice, run) is expected


@pytest.mark.parametrize(
    ("use_loss", "loss_coef", "in_reward", "reward_coef", "expected"),
    [
        (True, 0.0, False, 0.001, "reference model still runs"),
        (True, 0.001, False, 0.0, None),
        (False, 0.0, False, 0.0, None),  # no KL term at all: nothing multiplied by 0
        (False, 0.0, True, 0.0, "reference model still runs"),
        (False, 0.0, True, 0.001, None),
        (True, 0.0, True, 0.001, "the other one keeps the reference model running"),
        (True, 0.001, True, 0.0, "the other one keeps the reference model running"),
    ],
)
def test_kl_zero_coef_names_a_zero_coefficient_and_what_it_costs(
    shipped: Run, use_loss: bool, loss_coef: float, in_reward: bool, reward_coef: float, expected: str | None
) -> None:
    run = changed(
        shipped,
        **{
            f"{A}__actor__use_kl_loss": use_loss,
            f"{A}__actor__kl_loss_coef": loss_coef,
            "algorithm__use_kl_in_reward": in_reward,
            "algorithm__kl_ctrl__kl_coef": reward_coef,
        },
    )
    messages = [f.message for f in pitfalls.rule_kl_zero_coef(run)]
    if expected is None:
        assert messages == []
    else:
        (message,) = messages
        assert expected in message


def test_kl_zero_coef_names_both_zero_terms_and_both_fixes(shipped: Run) -> None:
    run = changed(
        shipped,
        **{f"{A}__actor__kl_loss_coef": 0.0, "algorithm__use_kl_in_reward": True, "algorithm__kl_ctrl__kl_coef": 0.0},
    )
    (finding,) = pitfalls.rule_kl_zero_coef(run)
    assert "kl_loss_coef=0; algorithm.use_kl_in_reward=true with kl_ctrl.kl_coef=0" in finding.message
    assert "Fix: actor_rollout_ref.actor.use_kl_loss=false algorithm.use_kl_in_reward=false" in finding.message


@pytest.mark.parametrize(
    ("enable", "estimator", "expected"),
    [(True, "grpo", True), (True, "gae", False), (None, "grpo", False), (False, "grpo", False)],
)
def test_critic_unused_needs_a_critic_and_an_estimator_that_ignores_it(
    shipped: Run, enable: bool | None, estimator: str, expected: bool
) -> None:
    run = changed(shipped, **{"critic__enable": enable, "algorithm__adv_estimator": estimator})
    assert warns(pitfalls.rule_critic_unused, run) is expected


@pytest.mark.parametrize(
    ("enable", "path", "expected"), [(True, "reward.py", True), (False, "reward.py", False), (True, None, False)]
)
def test_reward_model_overrides_needs_both_rewards(
    shipped: Run, enable: bool, path: str | None, expected: bool
) -> None:
    run = changed(shipped, **{"reward_model__enable": enable, "custom_reward_function__path": path})
    assert warns(pitfalls.rule_reward_model_overrides, run) is expected


# --- the model -------------------------------------------------------------------------------------------------


def test_mla_tensor_parallel_warns_above_tp_1_only(shipped: Run) -> None:
    tp = f"{A}__actor__megatron__tensor_model_parallel_size"
    assert levels(pitfalls.rule_mla_tensor_parallel, changed(shipped, **{tp: 1})) == []
    assert levels(pitfalls.rule_mla_tensor_parallel, changed(shipped, **{tp: 2})) == [WARNING]


def test_mla_tensor_parallel_is_skipped_without_a_known_model(shipped: Run) -> None:
    """A model path preflight could not read, on a config it does not know: it cannot tell MLA, so it says so."""
    run = unknown_model(shipped, **{f"{A}__actor__megatron__tensor_model_parallel_size": 2})
    assert levels(pitfalls.rule_mla_tensor_parallel, run) == [SKIPPED]


def _tp2(run: Run, **settings: Any) -> Run:
    return changed(run, **{f"{A}__actor__megatron__tensor_model_parallel_size": 2, **settings})


def test_a_read_model_directory_decides_mla_over_the_known_config(shipped: Run) -> None:
    """The shipped config is DeepSeek-V3's, but a model directory without ``kv_lora_rank`` is not MLA."""
    plain = ModelInfo(None, {"num_hidden_layers": 2})
    assert levels(pitfalls.rule_mla_tensor_parallel, dataclasses.replace(_tp2(shipped), model=plain)) == []
    latent = ModelInfo(None, {"kv_lora_rank": 512})
    run = dataclasses.replace(_tp2(shipped), config_name="custom", model=latent)
    assert levels(pitfalls.rule_mla_tensor_parallel, run) == [WARNING]


def test_a_known_config_with_an_unread_model_path_is_not_taken_for_its_model(shipped: Run) -> None:
    """A model path preflight could not read may hold another model than the config's: unknown, so skipped."""
    run = dataclasses.replace(_tp2(shipped, **{f"{A}__model__path": "/elsewhere"}), model=None)
    assert run.config_name in KNOWN_MODELS
    assert levels(pitfalls.rule_mla_tensor_parallel, run) == [SKIPPED]


@pytest.mark.parametrize(
    ("label", "structure", "expected"),
    [
        ("Custom-MLA", {"kv_lora_rank": 512}, [WARNING]),
        ("DeepSeek-V2-Lite", {}, [WARNING]),
        ("Qwen2.5-Math-7B", {"num_hidden_layers": 28}, []),
        ("deepseek-lowercase", {}, []),
    ],
)
def test_a_known_model_is_mla_by_its_latent_rank_or_its_deepseek_name(
    shipped: Run, monkeypatch: pytest.MonkeyPatch, label: str, structure: dict, expected: list[str]
) -> None:
    monkeypatch.setattr(pitfalls, "known_model", lambda name: (label, structure) if name == "known" else None)
    run = dataclasses.replace(_tp2(shipped, **{f"{A}__model__path": ""}), config_name="known", model=None)
    assert levels(pitfalls.rule_mla_tensor_parallel, run) == expected


def test_mla_tensor_parallel_names_itself_the_cause_and_the_fix(shipped: Run) -> None:
    (warned,) = pitfalls.rule_mla_tensor_parallel(_tp2(shipped))
    assert warned.check == "mla_tensor_parallel"
    assert "tensor_model_parallel_size=2 on an MLA model" in warned.message
    assert "Megatron-LM#1699" in warned.message
    assert "Fix: actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1" in warned.message
    assert "scale with EP/PP instead" in warned.message
    unknown = unknown_model(_tp2(shipped))
    (skipped,) = pitfalls.rule_mla_tensor_parallel(unknown)
    assert skipped.check == "mla_tensor_parallel"
    assert skipped.message == (
        "skipped: actor TP 2 > 1; whether the model uses MLA needs its config.json (set MODEL_PATH)"
    )


# --- lengths, prompts, EOS -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("rollout_len", "expected"), [(8191, True), (8192, False), (8193, False)])
def test_response_length_warns_only_when_the_rollout_stops_earlier(
    shipped: Run, rollout_len: int, expected: bool
) -> None:
    run = changed(shipped, **{"data__max_response_length": 8192, f"{A}__rollout__response_length": rollout_len})
    assert warns(pitfalls.rule_response_length, run) is expected


@pytest.mark.parametrize(
    ("filtered", "truncation", "expected"),
    [(False, "left", True), (False, "error", False), (True, "left", False)],
)
def test_prompt_truncation_needs_unfiltered_prompts_cut_silently(
    shipped: Run, filtered: bool, truncation: str, expected: bool
) -> None:
    run = changed(shipped, **{"data__filter_overlong_prompts": filtered, "data__truncation": truncation})
    assert warns(pitfalls.rule_prompt_truncation, run) is expected


@pytest.mark.parametrize(("ignore_eos", "expected"), [(True, True), (False, False)])
def test_ignore_eos_warns_when_set(shipped: Run, ignore_eos: bool, expected: bool) -> None:
    assert warns(pitfalls.rule_ignore_eos, changed(shipped, **{f"{A}__rollout__ignore_eos": ignore_eos})) is expected


# --- checkpoints and resume ------------------------------------------------------------------------------------


def doubled_batch(run: Run, **settings: Any) -> Run:
    """``run`` at twice its prompts per step: twice the work per die, so a step of the estimate is twice as long (the
    shipped run's step scale is exactly 1, which hides a scale multiplied where it should divide)."""
    return changed(run, data__train_batch_size=2 * int(run.config.data.train_batch_size), **settings)


def step_hours(run: Run) -> float:
    """Hours of one step of ``run`` by preflight's estimate."""
    return pitfalls.REFERENCE_STEP_S * pitfalls.step_scale(run) / 3600


def largest_interval(run: Run) -> int:
    """The most steps between checkpoints that stay within the limit for ``run``."""
    return int(pitfalls.MAX_HOURS_WITHOUT_CHECKPOINT / step_hours(run))


@pytest.mark.parametrize(("save_freq", "expected"), [(0, True), (-1, True), (1, False)])
def test_checkpoint_interval_warns_when_nothing_is_saved(shipped: Run, save_freq: int, expected: bool) -> None:
    run = changed(shipped, trainer__save_freq=save_freq)
    found = [f.message for f in pitfalls.rule_checkpoint_interval(run)]
    assert any("no checkpoint is ever written" in m for m in found) is expected


def test_checkpoint_interval_limit_is_hours_of_the_estimated_run(shipped: Run) -> None:
    """The limit is MAX_HOURS_WITHOUT_CHECKPOINT of estimated steps: the largest interval under it passes, one step
    more warns, and the fix it prints is that largest interval."""
    largest = largest_interval(shipped)
    assert largest >= 2  # else the case below says nothing
    quiet = changed(shipped, trainer__save_freq=largest, trainer__total_training_steps=10 * largest)
    assert levels(pitfalls.rule_checkpoint_interval, quiet) == []
    loud = changed(shipped, trainer__save_freq=largest + 1, trainer__total_training_steps=10 * largest)
    (finding,) = pitfalls.rule_checkpoint_interval(loud)
    assert finding.level == WARNING
    assert f"Fix: trainer.save_freq={largest}" in finding.message
    assert "the only checkpoint" not in finding.message


def test_checkpoint_interval_counts_at_most_the_whole_run(shipped: Run) -> None:
    """save_freq beyond the last step saves once, at the end: the interval is the run's length."""
    largest = largest_interval(shipped)
    short = changed(shipped, trainer__save_freq=10 * largest, trainer__total_training_steps=largest)
    assert levels(pitfalls.rule_checkpoint_interval, short) == []
    whole = changed(shipped, trainer__save_freq=10 * largest, trainer__total_training_steps=largest + 1)
    (finding,) = pitfalls.rule_checkpoint_interval(whole)
    assert "(the only checkpoint is the last step's)" in finding.message


def test_checkpoint_interval_of_one_step_needs_no_estimate(shipped: Run) -> None:
    """A checkpoint every step is never too rare, even when preflight cannot estimate a step (no model)."""
    unknown = unknown_model(shipped, trainer__save_freq=1)
    assert levels(pitfalls.rule_checkpoint_interval, unknown) == []
    assert levels(pitfalls.rule_checkpoint_interval, changed(unknown, trainer__save_freq=2)) == [SKIPPED]


@pytest.mark.parametrize(
    ("mode", "path", "expected"),
    [("disable", None, True), ("resume_path", None, True), ("resume_path", "/ckpt/global_step_2", False)],
)
def test_resume_warns_when_a_restart_starts_over(shipped: Run, mode: str, path: str | None, expected: bool) -> None:
    run = changed(shipped, trainer__resume_mode=mode, trainer__resume_from_path=path)
    assert warns(pitfalls.rule_resume, run) is expected


# --- the update ------------------------------------------------------------------------------------------------


def no_update_messages(run: Run) -> list[str]:
    return [f.message for f in pitfalls.rule_no_update(run)]


@pytest.mark.parametrize(("warmup", "expected"), [(99, False), (100, True), (101, True)])
def test_no_update_warns_from_a_warm_up_as_long_as_the_run(shipped: Run, warmup: int, expected: bool) -> None:
    """100 steps: a warm-up of 100 steps ends with the run, so the learning rate never reaches its value."""
    run = changed(shipped, trainer__total_training_steps=100, **{f"{A}__actor__optim__lr_warmup_steps": warmup})
    assert any(f"LR warm-up of {warmup} steps" in m for m in no_update_messages(run)) is expected


@pytest.mark.parametrize(("ratio", "expected"), [(0.99, False), (1.0, True)])
def test_no_update_reads_a_warm_up_ratio_of_the_run(shipped: Run, ratio: float, expected: bool) -> None:
    run = changed(
        shipped,
        trainer__total_training_steps=100,
        **{f"{A}__actor__optim__lr_warmup_steps": -1, f"{A}__actor__optim__lr_warmup_steps_ratio": ratio},
    )
    assert any("LR warm-up of" in m for m in no_update_messages(run)) is expected


def test_no_update_ratio_counts_only_without_warm_up_steps(shipped: Run) -> None:
    """lr_warmup_steps > 0 is the warm-up; the ratio is read only when it is unset (<= 0)."""
    run = changed(
        shipped,
        trainer__total_training_steps=100,
        **{f"{A}__actor__optim__lr_warmup_steps": 10, f"{A}__actor__optim__lr_warmup_steps_ratio": 1.0},
    )
    assert no_update_messages(run) == []


def test_no_update_needs_a_known_positive_run_length_for_the_warm_up(shipped: Run) -> None:
    warmup = {f"{A}__actor__optim__lr_warmup_steps": 10}
    assert no_update_messages(changed(shipped, trainer__total_training_steps=None, **warmup)) == []
    assert no_update_messages(changed(shipped, trainer__total_training_steps=0, **warmup)) == []


@pytest.mark.parametrize(
    ("lr", "epochs", "expected"),
    [(0.0, 1, "optim.lr=0.0 (the weights never change)"), (1e-6, 0, "ppo_epochs=0 (no update is run)")],
)
def test_no_update_names_a_zero_rate_or_no_epoch(shipped: Run, lr: float, epochs: int, expected: str) -> None:
    run = changed(shipped, **{f"{A}__actor__optim__lr": lr, f"{A}__actor__ppo_epochs": epochs})
    (message,) = no_update_messages(run)
    assert expected in message


def test_check_pitfalls_says_ok_only_when_no_rule_warns(shipped: Run) -> None:
    quiet = list(pitfalls.check_pitfalls(shipped))
    assert [(f.check, f.level) for f in quiet] == [("pitfalls", OK)]
    assert f"{len(pitfalls.RULES)} rules" in quiet[0].message
    loud = list(pitfalls.check_pitfalls(changed(shipped, **{f"{A}__rollout__ignore_eos": True})))
    assert [(f.check, f.level) for f in loud] == [("ignore_eos", WARNING)]


def test_the_step_estimate_scales_with_the_work_per_die(shipped: Run) -> None:
    """Twice the sequences or twice the tokens is twice the work; twice the dies is half."""
    base = pitfalls.step_scale(shipped)
    cfg = shipped.config
    sequences = changed(shipped, data__train_batch_size=2 * int(cfg.data.train_batch_size))
    assert pitfalls.step_scale(sequences) == pytest.approx(2 * base)
    tokens = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
    longer = changed(shipped, data__max_response_length=int(cfg.data.max_response_length) + tokens)
    assert pitfalls.step_scale(longer) == pytest.approx(2 * base)
    wider = changed(shipped, trainer__nnodes=2 * int(cfg.trainer.nnodes))
    assert pitfalls.step_scale(wider) == pytest.approx(base / 2)


def test_the_smoke_config_is_not_taken_for_the_671b_model() -> None:
    """Without a model directory only the shipped DeepSeek-V3 config gets DeepSeek-V3's estimate."""
    run, _ = run_checks(SMOKE_OVERLAY, [], env={}, check_patches=False)
    assert run.model is None
    assert pitfalls.step_scale(run) is None


#: One setting that makes each rule warn on the shipped run (the cases above), and the key its message must name.
TRIGGERS: dict[str, tuple[dict[str, Any], str]] = {
    "group_baseline": ({f"{A}__rollout__n": 1}, "actor_rollout_ref.rollout.n=1"),
    "identical_samples": ({f"{A}__rollout__do_sample": False}, "do_sample"),
    "kl_twice": ({"algorithm__use_kl_in_reward": True}, "algorithm.use_kl_in_reward=true"),
    "kl_zero_coef": ({f"{A}__actor__kl_loss_coef": 0.0}, "kl_loss_coef=0"),
    "critic_unused": ({"critic__enable": True}, "critic"),
    "reward_model_overrides": (
        {"reward_model__enable": True, "custom_reward_function__path": "reward.py"},
        "reward_model.enable",
    ),
    "mla_tensor_parallel": ({f"{A}__actor__megatron__tensor_model_parallel_size": 2}, "tensor_model_parallel_size=2"),
    "truncated_sampling": ({f"{A}__rollout__top_p": 0.9}, "top_p=0.9"),
    "ignore_eos": ({f"{A}__rollout__ignore_eos": True}, "actor_rollout_ref.rollout.ignore_eos=true"),
    "response_length": (
        {"data__max_response_length": 8192, f"{A}__rollout__response_length": 4096},
        "response_length",
    ),
    "prompt_truncation": ({"data__filter_overlong_prompts": False, "data__truncation": "left"}, "truncation"),
    "checkpoint_interval": ({"trainer__save_freq": -1}, "trainer.save_freq=-1"),
    "resume": ({"trainer__resume_mode": "disable"}, "trainer.resume_mode=disable"),
    "validation_repeats": ({f"{A}__rollout__val_kwargs__n": 4, f"{A}__rollout__val_kwargs__do_sample": False}, "n=4"),
    "no_update": ({f"{A}__actor__optim__lr": 0.0}, "actor_rollout_ref.actor.optim.lr=0.0"),
}


def test_every_rule_has_a_trigger() -> None:
    assert sorted(TRIGGERS) == sorted(rule.__name__.removeprefix("rule_") for rule in pitfalls.RULES)


@pytest.mark.parametrize("rule", pitfalls.RULES, ids=lambda rule: rule.__name__)
def test_a_warning_names_its_rule_the_setting_and_the_fix(shipped: Run, rule: pitfalls.Rule) -> None:
    """What the user reads: which check fired (the name preflight prints), the setting that fired it, and a
    ``Fix:`` to copy."""
    settings, key = TRIGGERS[rule.__name__.removeprefix("rule_")]
    (finding,) = rule(changed(shipped, **settings))
    assert finding.level == WARNING
    assert finding.check == rule.__name__.removeprefix("rule_")
    assert key in finding.message
    assert "Fix: " in finding.message


def test_resume_without_a_path_names_the_missing_path_and_both_fixes(shipped: Run) -> None:
    run = changed(shipped, trainer__resume_mode="resume_path", trainer__resume_from_path=None)
    (finding,) = pitfalls.rule_resume(run)
    assert finding.check == "resume"
    assert finding.message == (
        "trainer.resume_mode=resume_path without trainer.resume_from_path: verl finds nothing to resume from and "
        "starts from step 0. Fix: trainer.resume_from_path=<default_local_dir>/global_step_N, or "
        "trainer.resume_mode=auto"
    )


def test_the_reference_pass_cost_is_scaled_to_the_run_when_its_model_is_known(shipped: Run) -> None:
    """The KL-at-0 warning prices the reference pass it keeps: scaled from the reference 671B step by this run's
    work per die, or, without a known model, as the reference step's own figure."""
    zero = {f"{A}__actor__kl_loss_coef": 0.0}
    doubled = doubled_batch(shipped, **zero)
    assert pitfalls.step_scale(doubled) == pytest.approx(2 * pitfalls.step_scale(shipped))
    (scaled,) = pitfalls.rule_kl_zero_coef(doubled)
    seconds = pitfalls.REFERENCE_REF_PASS_S * pitfalls.step_scale(doubled)
    assert f"(~{seconds:.0f} s per step, preflight's estimate scaled from the reference 671B step)" in scaled.message
    unknown = unknown_model(shipped, **zero)
    (reference,) = pitfalls.rule_kl_zero_coef(unknown)
    expected = f"{pitfalls.REFERENCE_REF_PASS_S:.0f} s of the reference 671B step's {pitfalls.REFERENCE_STEP_S:.0f} s"
    assert expected in reference.message


# --- the checkpoint interval's estimate, off a step scale of exactly 1 -------------------------------------------


def test_checkpoint_interval_estimate_follows_the_runs_step_scale(shipped: Run) -> None:
    run = doubled_batch(shipped)
    assert pitfalls.step_scale(run) == pytest.approx(2.0)
    per_step, largest = step_hours(run), largest_interval(run)
    assert levels(pitfalls.rule_checkpoint_interval, changed(run, trainer__save_freq=largest)) == []
    interval = largest + 1
    (finding,) = pitfalls.rule_checkpoint_interval(changed(run, trainer__save_freq=interval))
    assert (finding.check, finding.level) == ("checkpoint_interval", WARNING)
    total = run.config.trainer.total_training_steps
    assert finding.message == (
        f"trainer.save_freq={interval} with trainer.total_training_steps={total}: {interval} steps between "
        f"checkpoints, ~{per_step * interval:.0f} h of the cluster by preflight's estimate (~{per_step:.2f} h per "
        f"step, scaled from the reference 671B step); a failure loses all of it. Fix: trainer.save_freq={largest}"
    )


def test_checkpoint_interval_warns_above_the_limit_not_at_it(shipped: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    run = doubled_batch(shipped, trainer__save_freq=3)
    at_three = pitfalls.REFERENCE_STEP_S * pitfalls.step_scale(run) * 3 / 3600  # the rule's own arithmetic
    monkeypatch.setattr(pitfalls, "MAX_HOURS_WITHOUT_CHECKPOINT", at_three)
    assert levels(pitfalls.rule_checkpoint_interval, run) == []
    assert levels(pitfalls.rule_checkpoint_interval, changed(run, trainer__save_freq=4)) == [WARNING]


def test_checkpoint_interval_when_one_step_outlasts_the_limit_asks_for_every_step(shipped: Run) -> None:
    run = changed(shipped, data__train_batch_size=1000 * int(shipped.config.data.train_batch_size))
    assert step_hours(run) > pitfalls.MAX_HOURS_WITHOUT_CHECKPOINT
    (finding,) = pitfalls.rule_checkpoint_interval(changed(run, trainer__save_freq=2))
    assert finding.message.endswith("Fix: trainer.save_freq=1")


def test_checkpoint_interval_without_a_run_length_is_save_freq(shipped: Run) -> None:
    largest = largest_interval(shipped)
    endless = {"trainer__total_training_steps": None}
    assert levels(pitfalls.rule_checkpoint_interval, changed(shipped, trainer__save_freq=largest, **endless)) == []
    (finding,) = pitfalls.rule_checkpoint_interval(changed(shipped, trainer__save_freq=largest + 1, **endless))
    assert f"with trainer.total_training_steps=None: {largest + 1} steps between checkpoints, ~" in finding.message


def test_checkpoint_interval_saving_only_at_the_last_step_says_so(shipped: Run) -> None:
    steps = largest_interval(shipped) + 1
    run = changed(shipped, trainer__save_freq=steps, trainer__total_training_steps=steps)
    (finding,) = pitfalls.rule_checkpoint_interval(run)
    assert f"{steps} steps between checkpoints (the only checkpoint is the last step's), ~" in finding.message


def test_checkpoint_interval_skip_and_no_save_name_the_check_and_the_fix(shipped: Run) -> None:
    (skipped,) = pitfalls.rule_checkpoint_interval(unknown_model(shipped, trainer__save_freq=7))
    assert (skipped.check, skipped.level) == ("checkpoint_interval", SKIPPED)
    assert skipped.message == "skipped: 7 steps between checkpoints; their duration needs the model's config.json"
    (never,) = pitfalls.rule_checkpoint_interval(changed(shipped, trainer__save_freq=0))
    assert never.message == (
        "trainer.save_freq=0: no checkpoint is ever written; a failure loses the whole run and nothing can be "
        "evaluated afterwards. Fix: trainer.save_freq=20"
    )


# --- the update's warm-up, at its smallest values ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "ratio", "total", "expected"),
    [
        (None, 1.0, 100, True),  # unset: the ratio decides
        (None, 0.0, 1, False),  # unset and no ratio: no warm-up, even in a one-step run
        (1, 1.0, 100, False),  # one warm-up step is the warm-up; the ratio is not read
        (1, 0.0, 1, True),  # a one-step run that warms up for its one step
    ],
)
def test_no_update_warm_up_at_its_smallest(
    shipped: Run, steps: int | None, ratio: float, total: int, expected: bool
) -> None:
    optim = {f"{A}__actor__optim__lr_warmup_steps": steps, f"{A}__actor__optim__lr_warmup_steps_ratio": ratio}
    run = changed(shipped, trainer__total_training_steps=total, **optim)
    assert any("LR warm-up of" in m for m in no_update_messages(run)) is expected


def test_no_update_names_every_cause_then_what_it_costs(shipped: Run) -> None:
    run = changed(shipped, **{f"{A}__actor__optim__lr": 0.0, f"{A}__actor__ppo_epochs": 0})
    (finding,) = pitfalls.rule_no_update(run)
    assert finding.message == (
        "actor_rollout_ref.actor.optim.lr=0.0 (the weights never change); actor_rollout_ref.actor.ppo_epochs=0 (no "
        "update is run): the rollout, reward and reference passes run every step for a policy that does not learn "
        "(or learns at a fraction of the rate). Fix: the recipe's optim.lr=1e-6, ppo_epochs=1, no warm-up"
    )


# --- what the sampling and critic warnings tell ------------------------------------------------------------------


def test_truncated_sampling_says_why_and_where_to_truncate_instead(shipped: Run) -> None:
    (finding,) = pitfalls.rule_truncated_sampling(changed(shipped, **{f"{A}__rollout__top_k": 40}))
    assert finding.message == (
        "actor_rollout_ref.rollout.top_k=40: the rollout samples from a truncated distribution but the actor's loss "
        "and old log-probs use the full softmax at the rollout temperature, so the samples are off-policy in a way "
        "the PPO ratio does not correct (and the rollout guard compares different distributions). Fix: "
        "actor_rollout_ref.rollout.top_p=1 actor_rollout_ref.rollout.top_k=-1 (truncate only in val_kwargs)"
    )


def test_critic_unused_names_the_setting_the_estimator_and_the_fix(shipped: Run) -> None:
    (finding,) = pitfalls.rule_critic_unused(changed(shipped, critic__enable=True))
    assert finding.message == (
        "critic.enable=True with algorithm.adv_estimator=grpo: verl builds, runs and trains a critic every step, but "
        "only GAE reads its values; the critic's forward, update and memory are spent on nothing. Fix: "
        "critic.enable=null"
    )
