"""The preflight checks that run the stack's own validation: every class of misconfiguration the stack rejects
late is caught with the fix in the message, and a neighbouring valid configuration passes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from r1_ascend.launch.checks import ERROR, OK, SKIPPED
from r1_ascend.launch.overlays import DEFAULT_OVERLAY, QWEN_OVERLAY, SMOKE_OVERLAY
from r1_ascend.launch.preflight import run_checks

pytestmark = pytest.mark.machine

SMOKE_ENV = {"NNODES": "1", "NPUS_PER_NODE": "16"}
AR = "actor_rollout_ref"
UPSTREAM = {"verl_config", "kl_type", "reward_function", "external_modules", "gpu_memory", "attention_heads"}


def _run(inputs, *extra, env=SMOKE_ENV, config=SMOKE_OVERLAY):
    overrides = [*(inputs.overrides() if inputs is not None else []), *extra]
    return run_checks(config, overrides, env=env, check_patches=False)[1]


def _errors(findings, check):
    return [f.message for f in findings if f.level == ERROR and f.check == check]


def _levels(findings, check):
    return {f.level for f in findings if f.check == check}


# --- verl's dataclasses and validate_config: micro-batch pairs ---------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "fix", "upstream"),
    [
        (
            [f"{AR}.rollout.log_prob_micro_batch_size=16"],
            f"Fix: {AR}.rollout.log_prob_micro_batch_size=null",
            "validate_config",
        ),
        (
            [f"{AR}.rollout.log_prob_micro_batch_size_per_gpu=null"],
            f"Fix: {AR}.rollout.log_prob_micro_batch_size_per_gpu=",
            "validate_config",
        ),
        (
            [f"{AR}.ref.log_prob_micro_batch_size=16"],
            f"Fix: {AR}.ref.log_prob_micro_batch_size=null",
            "validate_config",
        ),
        (
            [f"{AR}.ref.log_prob_micro_batch_size_per_gpu=null"],
            f"Fix: {AR}.ref.log_prob_micro_batch_size_per_gpu=",
            "validate_config",
        ),
        ([f"{AR}.actor.ppo_micro_batch_size=8"], f"Fix: {AR}.actor.ppo_micro_batch_size=null", "dataclass conversion"),
    ],
)
def test_micro_batch_pairs_set_twice_or_never_are_refused(smoke_inputs, bad, fix, upstream):
    errors = _errors(_run(smoke_inputs, *bad), "verl_config")
    assert len(errors) == 1, errors
    assert fix in errors[0]
    assert upstream in errors[0]  # verl's own check ran and agrees


@pytest.mark.parametrize(
    "good",
    [
        # the deprecated global size alone is still accepted by verl
        [f"{AR}.rollout.log_prob_micro_batch_size=16", f"{AR}.rollout.log_prob_micro_batch_size_per_gpu=null"],
        [f"{AR}.ref.log_prob_micro_batch_size=16", f"{AR}.ref.log_prob_micro_batch_size_per_gpu=null"],
        # the ref is not used without a KL term, so its pair is not read
        [f"{AR}.actor.use_kl_loss=false", f"{AR}.ref.log_prob_micro_batch_size_per_gpu=null"],
        # dynamic batch sizes replace the micro-batch pairs
        [f"{AR}.actor.use_dynamic_bsz=true", f"{AR}.rollout.log_prob_micro_batch_size_per_gpu=null"],
    ],
)
def test_micro_batch_pairs_verl_accepts_pass(smoke_inputs, good):
    assert _errors(_run(smoke_inputs, *good), "verl_config") == []


def test_neither_pair_set_suggests_the_other_sections_value(smoke_inputs):
    errors = _errors(_run(smoke_inputs, f"{AR}.ref.log_prob_micro_batch_size_per_gpu=null"), "verl_config")
    assert f"Fix: {AR}.ref.log_prob_micro_batch_size_per_gpu=4" in errors[0]  # the rollout's value in the overlay


def test_upstream_refusal_without_a_project_rule_is_reported_verbatim(smoke_inputs):
    errors = _errors(_run(smoke_inputs, f"{AR}.actor.loss_agg_mode=token-mea"), "verl_config")
    assert any("Invalid loss_agg_mode: token-mea" in e for e in errors), errors


# --- unknown keys added with '+' -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "fix"),
    [
        (f"+{AR}.rollout.gpu_memory_utilisation=0.7", f"pass {AR}.rollout.gpu_memory_utilization=0.7"),
        (f"+{AR}.actor.ppo_epoch=2", f"pass {AR}.actor.ppo_epochs=2"),
        ("+algorithm.gama=0.9", "pass algorithm.gamma=0.9"),
        (f"+{AR}.actor.megatron.tensor_parallel_size=2", f"pass {AR}.actor.megatron.tensor_model_parallel_size=2"),
    ],
)
def test_unknown_key_in_a_dataclass_section_is_refused(smoke_inputs, bad, fix):
    errors = _errors(_run(smoke_inputs, bad), "verl_config")
    assert any(fix in e and "is not a field of verl's" in e for e in errors), errors


@pytest.mark.parametrize(
    "good",
    [
        f"{AR}.rollout.gpu_memory_utilization=0.7",
        f"{AR}.actor.ppo_epochs=2",
        # free-form dicts of a dataclass (Megatron/MindSpeed options) take any key
        f"+{AR}.actor.megatron.override_transformer_config.moe_aux_loss_coeff=0.001",
        f"+{AR}.rollout.engine_kwargs.vllm.seed=1",
    ],
)
def test_declared_and_free_form_keys_pass(smoke_inputs, good):
    assert _errors(_run(smoke_inputs, good), "verl_config") == []


# --- KL estimator names ----------------------------------------------------------------------------------------


def test_misspelt_kl_loss_type_is_refused(smoke_inputs):
    errors = _errors(_run(smoke_inputs, f"{AR}.actor.kl_loss_type=low_var_kll"), "kl_type")
    assert f"Fix: {AR}.actor.kl_loss_type=low_var_kl" in errors[0]
    assert "abs, k1, k2, k3, kl, low_var_kl, mse" in errors[0]  # read from verl's kl_penalty_forward


@pytest.mark.parametrize("name", ["k3", "mse", "abs"])
def test_kl_loss_types_verl_handles_pass(smoke_inputs, name):
    findings = _run(smoke_inputs, f"{AR}.actor.kl_loss_type={name}")
    assert _levels(findings, "kl_type") == {OK}


def test_kl_type_verl_refuses_explicitly_is_refused(smoke_inputs):
    errors = _errors(_run(smoke_inputs, f"{AR}.actor.kl_loss_type=full"), "kl_type")
    assert "NotImplementedError" in errors[0]


def test_kl_penalty_in_reward_is_checked_too(smoke_inputs):
    errors = _errors(_run(smoke_inputs, "algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=k4"), "kl_type")
    assert "algorithm.kl_penalty=k4" in errors[0]


def test_unused_kl_type_is_skipped_not_passed(smoke_inputs):
    findings = _run(smoke_inputs, f"{AR}.actor.use_kl_loss=false", f"{AR}.actor.kl_loss_type=nonsense")
    assert _levels(findings, "kl_type") == {SKIPPED}


# --- custom reward function ------------------------------------------------------------------------------------


def test_reward_function_name_missing_from_the_file_is_refused(smoke_inputs):
    errors = _errors(_run(smoke_inputs, "custom_reward_function.name=compute_scor"), "reward_function")
    assert "get_custom_reward_fn raises AttributeError" in errors[0]
    assert "Fix: custom_reward_function.name=compute_score" in errors[0]


def test_reward_function_defined_in_the_file_passes(smoke_inputs):
    findings = _run(smoke_inputs, "custom_reward_function.name=compute_score_batch")
    assert _levels(findings, "reward_function") == {OK}
    assert "custom_module" not in sys.modules  # verl's loader caches the module there; the preflight cleans up


def test_reward_file_that_fails_to_import_is_refused(smoke_inputs, tmp_path):
    broken = tmp_path / "reward.py"
    broken.write_text("import no_such_module_anywhere\n")
    errors = _errors(_run(smoke_inputs, f"custom_reward_function.path={broken}"), "reward_function")
    assert "no_such_module_anywhere" in errors[0]


# --- VERL_USE_EXTERNAL_MODULES ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fix"),
    [
        ("r1_ascend.patches.prelud", "r1_ascend.patches.prelude"),
        ("r1_ascend.patchs.prelude", "r1_ascend.patches.prelude"),
        ("jsno", "json"),
        ("json,jsno,json", "json"),
    ],
)
def test_misspelt_external_module_is_refused(smoke_inputs, value, fix):
    findings = _run(smoke_inputs, env={**SMOKE_ENV, "VERL_USE_EXTERNAL_MODULES": value})
    errors = _errors(findings, "external_modules")
    assert len(errors) == 1, errors
    assert errors[0].endswith(f"Fix: VERL_USE_EXTERNAL_MODULES={fix}")


def test_misspelt_external_module_in_the_ray_runtime_env_is_refused(smoke_inputs):
    key = "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES"
    errors = _errors(_run(smoke_inputs, f"{key}=r1_ascend.recipe.runtme_env"), "external_modules")
    assert "package r1_ascend.recipe has no module 'runtme_env'" in errors[0]
    assert errors[0].endswith(f"Fix: +{key}=r1_ascend.recipe.runtime_env")


@pytest.mark.parametrize("value", ["", "r1_ascend.patches.prelude", "json,r1_ascend.recipe.runtime_env"])
def test_importable_external_modules_pass(smoke_inputs, value):
    findings = _run(smoke_inputs, env={**SMOKE_ENV, "VERL_USE_EXTERNAL_MODULES": value})
    assert _levels(findings, "external_modules") == {OK}


def test_resolving_external_modules_imports_nothing():
    code = (
        "import sys; from r1_ascend.launch.module_names import resolve_module; "
        "assert resolve_module('r1_ascend.patches.prelude') is None; "
        "assert resolve_module('vllm_ascend.patch') is None; "
        "assert resolve_module('vllm_ascend.patchx') is not None; "
        "loaded = [m for m in ('r1_ascend.patches', 'vllm_ascend', 'torch') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# --- gpu_memory_utilization ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "by_vllm"), [("1.01", True), ("2", True), ("0", False), ("-0.1", False)])
def test_gpu_memory_utilization_outside_zero_one_is_refused(smoke_inputs, value, by_vllm):
    errors = _errors(_run(smoke_inputs, f"{AR}.rollout.gpu_memory_utilization={value}"), "gpu_memory")
    assert f"Fix: {AR}.rollout.gpu_memory_utilization=0.5 (verl's default)" in errors[0]
    assert ("GPU memory utilization must be less than 1.0" in errors[0]) is by_vllm


@pytest.mark.parametrize("value", ["1.0", "0.01", "0.9"])
def test_gpu_memory_utilization_inside_zero_one_passes(smoke_inputs, value):
    assert _levels(_run(smoke_inputs, f"{AR}.rollout.gpu_memory_utilization={value}"), "gpu_memory") == {OK}


# --- attention heads vs tensor parallelism ---------------------------------------------------------------------

QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def qwen_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen")
    (path / "config.json").write_text(json.dumps(QWEN25_7B))
    return path


def _heads(findings):
    return _errors(findings, "attention_heads")


@pytest.mark.parametrize("with_model", [True, False])
@pytest.mark.parametrize(
    ("key", "tp", "fix"),
    [
        (f"{AR}.actor.megatron.tensor_model_parallel_size", 8, 4),  # 28 % 8 and 4 KV heads % 8
        (f"{AR}.actor.megatron.tensor_model_parallel_size", 7, 4),  # 28 % 7 == 0 but Megatron needs 4 % 7 too
        (f"{AR}.rollout.tensor_model_parallel_size", 8, 4),
        (f"{AR}.rollout.tensor_model_parallel_size", 16, 4),
    ],
)
def test_tensor_parallel_size_not_dividing_the_heads_is_refused(qwen_model, with_model, key, tp, fix):
    paths = [f"{AR}.model.path={qwen_model}"] if with_model else []
    findings = run_checks(QWEN_OVERLAY, [*paths, f"{key}={tp}"], env=SMOKE_ENV, check_patches=False)[1]
    errors = _heads(findings)
    assert any(f"{key}={tp}:" in e and f"Fix: {key}={fix}" in e for e in errors), errors
    assert ("config.json" in errors[0]) is with_model


@pytest.mark.parametrize(
    ("actor_tp", "rollout_tp"),
    [(1, 1), (2, 2), (4, 4), (2, 4), (1, 2)],  # divisors of both 28 heads and 4 KV heads; rollout needs only 28
)
def test_tensor_parallel_sizes_dividing_the_heads_pass(qwen_model, actor_tp, rollout_tp):
    overrides = [
        f"{AR}.model.path={qwen_model}",
        f"{AR}.actor.megatron.tensor_model_parallel_size={actor_tp}",
        f"{AR}.rollout.tensor_model_parallel_size={rollout_tp}",
    ]
    findings = run_checks(QWEN_OVERLAY, overrides, env=SMOKE_ENV, check_patches=False)[1]
    assert _heads(findings) == []
    assert _levels(findings, "attention_heads") == {OK}


@pytest.mark.parametrize(("ref_tp", "refused"), [(8, True), (4, False), (2, False)])
def test_reference_model_tp_is_checked_where_it_differs_from_the_actor(qwen_model, ref_tp, refused):
    key = f"{AR}.ref.megatron.tensor_model_parallel_size"
    overrides = [f"{AR}.model.path={qwen_model}", f"{key}={ref_tp}"]
    errors = _heads(run_checks(QWEN_OVERLAY, overrides, env=SMOKE_ENV, check_patches=False)[1])
    assert any(f"{key}={ref_tp}:" in e and f"Fix: {key}=4" in e for e in errors) is refused, errors


def test_rollout_tp_seven_passes_vllm_but_actor_tp_seven_fails_megatron(qwen_model):
    """vLLM checks only the attention heads (28 % 7 == 0); Megatron also the 4 KV heads."""
    rollout = run_checks(
        QWEN_OVERLAY,
        [f"{AR}.model.path={qwen_model}", f"{AR}.rollout.tensor_model_parallel_size=7"],
        env=SMOKE_ENV,
        check_patches=False,
    )[1]
    assert _heads(rollout) == []


def test_heads_check_without_model_or_known_model_is_skipped(smoke_inputs):
    findings = _run(None, env=SMOKE_ENV)
    assert _levels(findings, "attention_heads") == {SKIPPED}


def test_671b_without_model_path_uses_the_known_model_and_says_so():
    findings = run_checks(DEFAULT_OVERLAY, [f"{AR}.rollout.tensor_model_parallel_size=3"], check_patches=False)[1]
    assert "128 attention heads are not divisible by tensor parallel size 3" in _heads(findings)[0]
    assert "DeepSeek-V3, from the table of known models" in _heads(findings)[0]
    expert = [f for f in run_checks(DEFAULT_OVERLAY, [], check_patches=False)[1] if f.check == "expert_parallel"]
    assert expert[0].level == OK
    assert "256 experts" in expert[0].message
    assert "dense" not in expert[0].message


# --- the shipped configurations --------------------------------------------------------------------------------


@pytest.mark.parametrize("config", [DEFAULT_OVERLAY, SMOKE_OVERLAY, QWEN_OVERLAY])
def test_shipped_configs_raise_no_upstream_alarm(config):
    findings = run_checks(config, [], check_patches=False)[1]
    assert [f for f in findings if f.check in UPSTREAM and f.level == ERROR] == []
    # no check claims ok without having run: model-dependent checks say why they were skipped
    assert {f.check for f in findings if f.level == SKIPPED} >= {"pipeline_split", "context_length", "memory"}


def test_valid_smoke_inputs_pass_every_upstream_check(smoke_inputs):
    findings = _run(smoke_inputs)
    assert {f.check for f in findings if f.level == OK} >= UPSTREAM - {"attention_heads"}
    assert [f for f in findings if f.level == ERROR] == []


def test_upstream_loader_leaves_no_partial_verl_behind(smoke_inputs):
    _run(smoke_inputs)
    assert not [m for m in sys.modules if m == "verl" or m.startswith("verl.")] or hasattr(
        sys.modules.get("verl"), "DataProto"
    )


def test_docs_name_the_source_of_every_check():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "launch.md").read_text(encoding="utf-8")
    section = docs.split("### Where each check comes from", 1)[1].split("\n### ", 1)[0]
    findings = run_checks(DEFAULT_OVERLAY, [], check_patches=False)[1]
    for name in {f.check for f in findings}:
        assert f"`{name}`" in section, name
    for function in ("validate_config", "omega_conf_to_dataclass", "get_custom_reward_fn", "CacheConfig._verify_args"):
        assert function in section


@pytest.mark.slow
def test_torch_free_loader_agrees_with_the_real_verl_package(smoke_inputs):
    """The same findings when verl is really imported (torch and all): the loader stands in for nothing that
    matters to these checks."""
    bad = [
        f"{AR}.rollout.log_prob_micro_batch_size=16",
        f"{AR}.actor.loss_agg_mode=token-mea",
        f"+{AR}.rollout.gpu_memory_utilisation=0.7",
    ]
    code = (
        "import json, sys; import verl, verl.utils.config, verl.workers.config; "
        "from r1_ascend.launch.preflight import run_checks; "
        f"f = run_checks({SMOKE_OVERLAY!r}, {[*smoke_inputs.overrides(), *bad]!r}, env={SMOKE_ENV!r}, "
        "check_patches=False)[1]; "
        "print(json.dumps(sorted(x.message for x in f if x.check == 'verl_config')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    real = json.loads(done.stdout.strip().splitlines()[-1])
    torch_free = sorted(f.message for f in _run(smoke_inputs, *bad) if f.check == "verl_config")
    assert real == torch_free
    assert len(real) == 3  # one finding per cause
    for expected in ("Invalid loss_agg_mode", "gpu_memory_utilisation", "log_prob_micro_batch_size=null"):
        assert any(expected in message for message in real), expected
