"""Preflight warnings: each rule warns on the setting it is about (and the test fails without the rule), none warns on
the shipped configurations, ``--strict`` fails on them, and docs/launch.md lists every rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from r1_ascend.launch import pitfalls
from r1_ascend.launch.checks import ERROR, WARNING
from r1_ascend.launch.overlays import DEFAULT_OVERLAY, QWEN_OVERLAY, SMOKE_OVERLAY, overlay_names
from r1_ascend.launch.preflight import main, run_checks
from r1_ascend.launch.quickstart import SMOKE_ENV

ROOT = Path(__file__).resolve().parents[2]
A = "actor_rollout_ref"
RULE_NAMES = {rule.__name__.removeprefix("rule_") for rule in pitfalls.RULES}


def _findings(inputs, *extra, config=SMOKE_OVERLAY, paths=None):
    _, findings = run_checks(config, [*inputs.overrides(**(paths or {})), *extra], env=SMOKE_ENV, check_patches=False)
    return findings


def _warnings(findings, check):
    return [f.message for f in findings if f.level == WARNING and f.check == check]


def _new_warnings(findings):
    return [f for f in findings if f.level == WARNING and f.check in RULE_NAMES]


#: With one sample per prompt the smoke batch is 16 sequences: log-prob micro-batches of 1 keep it divisible.
SMALL_MICRO_BATCHES = [
    f"{A}.rollout.log_prob_micro_batch_size_per_gpu=1",
    f"{A}.ref.log_prob_micro_batch_size_per_gpu=1",
]

#: (rule, overrides on the valid smoke inputs, fragments the warning must contain: the keys and the fix)
CASES = [
    (
        "group_baseline",
        [f"{A}.rollout.n=1", *SMALL_MICRO_BATCHES],
        ["rollout.n=1", "REINFORCE", "Fix: actor_rollout_ref.rollout.n="],
    ),
    ("identical_samples", [f"{A}.rollout.do_sample=false"], ["do_sample=False", "every advantage is 0", "Fix:"]),
    (
        "identical_samples",
        [f"{A}.rollout.temperature=0", f"{A}.rollout.val_kwargs.do_sample=false", f"{A}.rollout.val_kwargs.n=1"],
        ["temperature=0", "identical responses"],
    ),
    ("kl_twice", ["algorithm.use_kl_in_reward=true"], ["penalised twice", "Fix: algorithm.use_kl_in_reward=false"]),
    ("kl_zero_coef", [f"{A}.actor.kl_loss_coef=0"], ["kl_loss_coef=0", "s per step", "use_kl_loss=false"]),
    (
        "kl_zero_coef",
        [f"{A}.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0"],
        ["kl_ctrl.kl_coef=0", "reference model still runs", "Fix: algorithm.use_kl_in_reward=false"],
    ),
    (
        "critic_unused",
        ["critic.enable=true", "critic.ppo_micro_batch_size_per_gpu=1"],
        ["critic.enable=True", "only GAE reads", "Fix: critic.enable=null"],
    ),
    (
        "reward_model_overrides",
        ["reward_model.enable=true", "reward_model.micro_batch_size_per_gpu=1"],
        ["rm_scores", "Fix: reward_model.enable=false"],
    ),
    ("truncated_sampling", [f"{A}.rollout.top_p=0.9"], ["top_p=0.9", "off-policy", "top_p=1"]),
    ("truncated_sampling", [f"{A}.rollout.top_k=50"], ["top_k=50", "top_k=-1"]),
    ("ignore_eos", [f"{A}.rollout.ignore_eos=true"], ["ignore_eos=true", "Fix: actor_rollout_ref.rollout.ignore_eos"]),
    ("response_length", [f"{A}.rollout.response_length=256"], ["response_length=256 <", "stops every response"]),
    (
        "prompt_truncation",
        ["data.filter_overlong_prompts=false", "data.truncation=left"],
        ["truncation=left", "cut silently", "Fix: data.filter_overlong_prompts=true"],
    ),
    ("checkpoint_interval", ["trainer.save_freq=-1"], ["save_freq=-1", "no checkpoint", "Fix: trainer.save_freq="]),
    ("resume", ["trainer.resume_mode=disable"], ["resume_mode=disable", "Fix: trainer.resume_mode=auto"]),
    ("resume", ["trainer.resume_mode=resume_path"], ["without trainer.resume_from_path", "resume_mode=auto"]),
    (
        "validation_repeats",
        [f"{A}.rollout.val_kwargs.do_sample=false"],
        ["val_kwargs.n=", "for nothing", "Fix: val_kwargs.do_sample=true"],
    ),
    ("no_update", [f"{A}.actor.optim.lr=0"], ["optim.lr=0", "does not learn", "Fix:"]),
    ("no_update", [f"{A}.actor.optim.lr_warmup_steps=10"], ["warm-up of 10 steps", "never reaches"]),
    ("no_update", [f"{A}.actor.ppo_epochs=0"], ["ppo_epochs=0", "no update"]),
]


@pytest.mark.parametrize(("rule", "overrides", "fragments"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_rule_warns_on_its_setting_and_names_the_fix(smoke_inputs, rule, overrides, fragments):
    findings = _findings(smoke_inputs, *overrides)
    messages = _warnings(findings, rule)
    assert messages, f"{rule} did not warn on {overrides}: {[(f.check, f.level) for f in findings]}"
    for fragment in fragments:
        assert any(fragment in m for m in messages), (fragment, messages)
    # a warning is not a refusal: the run would go on
    assert [f for f in findings if f.level == ERROR] == []


def test_every_rule_has_a_case():
    assert {case[0] for case in CASES} == RULE_NAMES - {"mla_tensor_parallel"}  # MLA: its own tests below


def test_tensor_parallel_on_an_mla_model_warns(smoke_inputs):
    findings = _findings(
        smoke_inputs,
        f"{A}.actor.megatron.tensor_model_parallel_size=2",
        f"{A}.actor.megatron.expert_model_parallel_size=4",
    )
    message = _warnings(findings, "mla_tensor_parallel")[0]
    assert "Megatron-LM#1699" in message
    assert "Fix: actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1" in message


def test_tensor_parallel_on_a_model_without_mla_does_not_warn(smoke_inputs, tmp_path, model_factory):
    model = model_factory(tmp_path / "m", kv_lora_rank=None)
    findings = _findings(
        smoke_inputs,
        f"{A}.actor.megatron.tensor_model_parallel_size=2",
        f"{A}.actor.megatron.expert_model_parallel_size=4",
        paths={"model": str(model)},
    )
    assert _warnings(findings, "mla_tensor_parallel") == []


def test_the_mla_gradient_bug_is_in_the_installed_megatron_core():
    """The warning's premise, read from the installed source: linear_kv_down_proj is column-parallel in the GPT
    layer specs, so with TP > 1 ``k_pos_emb`` comes out of ``gather_from_tensor_model_parallel_region`` (backward:
    split, no reduction) and is expanded over the local heads only; nothing reduces its gradient over TP. When a
    megatron-core release fixes it (copy_to_tensor_model_parallel_region on k_pos_emb), this test fails: then limit
    the rule to the versions that have the bug."""
    from r1_ascend.launch.upstream_source import module_file

    mla = module_file("megatron.core.transformer.multi_latent_attention").read_text(encoding="utf-8")
    specs = module_file("megatron.core.models.gpt.gpt_layer_specs").read_text(encoding="utf-8")
    mappings = module_file("megatron.core.tensor_parallel.mappings").read_text(encoding="utf-8")
    assert "linear_kv_down_proj=TEColumnParallelLinear" in specs
    assert "kv_combined = gather_from_tensor_model_parallel_region(kv_combined)" in mla
    assert "k_pos_emb.expand(-1, -1, self.num_attention_heads_per_partition, -1)" in mla
    assert "copy_to_tensor_model_parallel_region(k_pos_emb" not in mla
    gather = mappings[mappings.index("class _GatherFromModelParallelRegion") :]
    backward = gather[gather.index("def backward") :][:200]
    assert "return _split_along_last_dim(grad_output)" in backward


def test_group_estimators_are_read_from_verl():
    """GRPO-family estimators take the group ``index``; GAE, REINFORCE++ and ReMax do not."""
    groups = pitfalls.group_estimators()
    assert {"grpo", "rloo"} <= groups
    assert not {"gae", "reinforce_plus_plus", "remax"} & groups


def test_single_sample_without_a_group_estimator_does_not_warn(smoke_inputs):
    findings = _findings(smoke_inputs, f"{A}.rollout.n=1", "algorithm.adv_estimator=reinforce_plus_plus")
    assert _warnings(findings, "group_baseline") == []


def test_checkpoint_interval_is_measured_in_hours_of_the_run():
    """The 671B run's 20-step interval is within the limit; its whole 100 steps without a checkpoint are not."""
    _, shipped = run_checks(DEFAULT_OVERLAY, [], env={}, check_patches=False)
    assert _warnings(shipped, "checkpoint_interval") == []
    _, once = run_checks(DEFAULT_OVERLAY, ["trainer.save_freq=100"], env={}, check_patches=False)
    message = _warnings(once, "checkpoint_interval")[0]
    assert "the only checkpoint is the last step's" in message
    fix = int(re.search(r"Fix: trainer.save_freq=(\d+)", message).group(1))
    _, fixed = run_checks(DEFAULT_OVERLAY, [f"trainer.save_freq={fix}"], env={}, check_patches=False)
    assert _warnings(fixed, "checkpoint_interval") == []


def test_the_estimate_reproduces_the_reference_step_on_the_reference_config():
    run, _ = run_checks(DEFAULT_OVERLAY, [], env={}, check_patches=False)
    assert pitfalls.step_scale(run) == pytest.approx(1.0)
    half, _ = run_checks(DEFAULT_OVERLAY, [f"{A}.rollout.n=8"], env={}, check_patches=False)
    assert pitfalls.step_scale(half) == pytest.approx(0.5)


@pytest.mark.parametrize("config", [DEFAULT_OVERLAY, SMOKE_OVERLAY, QWEN_OVERLAY])
def test_shipped_configs_raise_none_of_the_warnings(config):
    assert set(overlay_names()) == {DEFAULT_OVERLAY, SMOKE_OVERLAY, QWEN_OVERLAY}
    _, findings = run_checks(config, [], env={}, check_patches=False)
    assert _new_warnings(findings) == []


def test_the_smoke_config_with_its_inputs_raises_none(smoke_inputs):
    findings = _findings(smoke_inputs)
    assert _new_warnings(findings) == []
    assert [f for f in findings if f.check in RULE_NAMES and f.level != "ok"] == []


@pytest.mark.parametrize(
    "override",
    [
        f"{A}.rollout.n=1 " + " ".join(SMALL_MICRO_BATCHES),
        "algorithm.use_kl_in_reward=true",
        f"{A}.actor.kl_loss_coef=0",
        f"{A}.actor.megatron.tensor_model_parallel_size=2",
    ],
)
def test_strict_fails_the_issue_examples_and_plain_preflight_passes_them(smoke_inputs, capsys, override):
    extra = [f"{A}.actor.megatron.expert_model_parallel_size=4"] if "tensor_model" in override else []
    argv = ["--config", SMOKE_OVERLAY, "--skip-patches", *smoke_inputs.overrides(), *override.split(), *extra]
    env = {"NNODES": "1", "NPUS_PER_NODE": "16"}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.delenv("VLLM_DP_SIZE", raising=False)
        plain = main(argv)
        out = capsys.readouterr()
        strict = main(["--strict", *argv])
        err = capsys.readouterr().err
    assert "--strict fails on them" in out.out
    assert plain == 0
    assert strict == 1
    assert "--strict: warnings fail" in err


def test_docs_list_every_warning_with_its_source():
    text = (ROOT / "docs" / "launch.md").read_text(encoding="utf-8")
    section = text[text.index("### Warnings") :]
    section = section[: section.index("\n## ")]
    listed = set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.MULTILINE))
    assert listed == RULE_NAMES
