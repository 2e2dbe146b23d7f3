"""Every run configuration composes against the installed verl 0.6.1 config schema, with the seed's settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import InstantiationException

from r1_ascend.launch.overlays import (
    DEFAULT_OVERLAY,
    EXTENSION_KEYS,
    QWEN_OVERLAY,
    SMOKE_DIFFERENCES,
    SMOKE_OVERLAY,
    flatten,
    overlay_leaf_keys,
    overlay_names,
    verl_config_dir,
)
from r1_ascend.launch.overlays import compose as compose_overlay

DOCS = Path(__file__).resolve().parents[2] / "docs" / "launch.md"


@pytest.fixture(scope="module")
def verl_defaults():
    """verl's own ppo_megatron_trainer config, flattened: the schema the overlays may set keys of."""
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        base = compose("ppo_megatron_trainer")
    return dict(flatten(OmegaConf.to_container(base, resolve=False)))


def test_all_overlays_are_known():
    assert set(overlay_names()) == {DEFAULT_OVERLAY, SMOKE_OVERLAY, QWEN_OVERLAY}


@pytest.mark.parametrize("name", [DEFAULT_OVERLAY, SMOKE_OVERLAY, QWEN_OVERLAY])
def test_every_overlay_key_exists_in_verl_or_is_a_documented_extension(name, verl_defaults):
    unknown = [k for k in overlay_leaf_keys(name) if k not in verl_defaults and k not in EXTENSION_KEYS]
    assert unknown == [], f"{name}: keys neither in verl 0.6.1's schema nor in EXTENSION_KEYS: {unknown}"


@pytest.mark.parametrize("name", [DEFAULT_OVERLAY, SMOKE_OVERLAY, QWEN_OVERLAY])
def test_overlay_passes_verl_dataclass_and_config_validation(name):
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    config = compose_overlay(name)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    omega_conf_to_dataclass(config.actor_rollout_ref.actor.megatron)
    # (ref.megatron names verl.workers.config.MegatronEngineConfig, which verl 0.6.1 lacks: verl never converts it)
    omega_conf_to_dataclass(config.algorithm)
    assert actor.strategy == "megatron"
    assert rollout.mode == "sync"
    validate_config(config, use_reference_policy=True, use_critic=False)


def test_bad_value_is_caught_by_verl_validation():
    from verl.utils.config import omega_conf_to_dataclass

    config = compose_overlay(DEFAULT_OVERLAY, ["actor_rollout_ref.rollout.expert_parallel_size=256"])
    with pytest.raises((AssertionError, InstantiationException), match="expert_parallel_size"):
        omega_conf_to_dataclass(config.actor_rollout_ref.rollout)


def test_671b_settings():
    c = compose_overlay(DEFAULT_OVERLAY)
    actor, rollout, ref = c.actor_rollout_ref.actor, c.actor_rollout_ref.rollout, c.actor_rollout_ref.ref
    otc = actor.megatron.override_transformer_config
    assert (c.trainer.nnodes, c.trainer.n_gpus_per_node, c.trainer.device) == (16, 16, "npu")
    assert c.trainer.total_training_steps == 100
    assert (actor.optim.lr, actor.optim.lr_decay_style, actor.optim.lr_warmup_steps_ratio) == (1e-6, "constant", 0.0)
    assert (c.data.train_batch_size, rollout.n, rollout.temperature) == (512, 16, 0.9)
    assert (actor.use_kl_loss, actor.kl_loss_coef, actor.kl_loss_type) == (True, 0.001, "low_var_kl")
    assert not c.algorithm.use_kl_in_reward
    assert c.algorithm.adv_estimator == "grpo"
    assert (c.data.max_prompt_length, c.data.max_response_length) == (1024, 3072)
    assert (rollout.tensor_model_parallel_size, rollout.data_parallel_size, rollout.name, rollout.mode) == (
        2,
        1,
        "vllm",
        "sync",
    )
    assert (rollout.enforce_eager, rollout.free_cache_engine, rollout.load_format) == (False, True, "dummy")
    assert rollout.max_num_batched_tokens >= c.data.max_prompt_length + c.data.max_response_length
    mega = actor.megatron
    assert (mega.tensor_model_parallel_size, mega.pipeline_model_parallel_size, mega.expert_model_parallel_size) == (
        1,
        8,
        32,
    )
    assert sum(s[0] for s in otc.pipeline_num_transformer_layers) == 61
    assert (otc.num_layers_in_first_pipeline_stage, otc.num_layers_in_last_pipeline_stage) == (6, 7)
    assert (mega.param_offload, mega.grad_offload, otc.swap_optimizer) == (True, True, True)
    assert (ref.megatron.pipeline_model_parallel_size, ref.megatron.expert_model_parallel_size) == (8, 32)
    assert ref.megatron.param_offload
    assert ref.megatron.dist_checkpointing_path == mega.dist_checkpointing_path
    assert mega.use_dist_checkpointing
    assert ref.megatron.use_dist_checkpointing
    assert c.trainer.save_freq > 0
    assert c.trainer.resume_mode == "auto"
    assert list(c.trainer.logger) == ["console", "tensorboard"]
    assert c.data.reward_fn_key == "data_source"
    assert c.custom_reward_function.path == "pkg://r1_ascend.recipe.deepscaler_reward"
    assert c.custom_reward_function.name == "compute_score"


def test_smoke_differs_from_671b_only_where_documented():
    from omegaconf import OmegaConf

    def flat(name):  # unresolved: interpolations (ref layout, critic, reward model) compare as written
        return dict(flatten(OmegaConf.to_container(compose_overlay(name), resolve=False)))

    big, smoke = flat(DEFAULT_OVERLAY), flat(SMOKE_OVERLAY)
    changed = {k for k in big.keys() | smoke.keys() if big.get(k, "<absent>") != smoke.get(k, "<absent>")}
    assert changed - SMOKE_DIFFERENCES == set()
    assert "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size" in changed  # the comparison is live


def test_extension_keys_are_documented():
    text = DOCS.read_text(encoding="utf-8")
    missing = [key for key in EXTENSION_KEYS if key.rsplit(".", 1)[1] not in text]
    assert missing == []
