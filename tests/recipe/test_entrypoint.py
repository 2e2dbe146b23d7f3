"""The recipe entry point: overlay in every Ray worker, and a loud refusal of configs that would run stock verl.

Configs are verl 0.6.1's real ``ppo_megatron_trainer.yaml`` composed with Hydra's compose API, plus overrides.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig

from r1_ascend.patches import PATCHES, apply_one, forget_applied, restore_all, spec_by_name
from r1_ascend.recipe.checks import check_recipe_config
from r1_ascend.recipe.runtime_env import EXTERNAL_MODULES, PRELUDE, add_overlay_to_config, ray_runtime_env
from r1_ascend.testing.verl_config import compose_trainer as compose

pytestmark = pytest.mark.machine

REPO_ROOT = Path(__file__).resolve().parents[2]
STUB_SITE = REPO_ROOT / "tests" / "sitecustomize_npu"
GOOD = ("trainer.device=npu", "actor_rollout_ref.rollout.name=vllm")
NO_SWITCHES: dict[str, str] = {}


@pytest.fixture
def overlay_rollout() -> Iterator[None]:
    """The rollout registry as the prelude leaves it (only the patch that decides the rollout class)."""
    apply_one(spec_by_name("vllm_rollout_offload"))
    yield
    restore_all()
    forget_applied()


@pytest.fixture(scope="module")
def good_config() -> DictConfig:
    return compose(*GOOD)


def test_good_config_passes(overlay_rollout: None, good_config: DictConfig) -> None:
    assert check_recipe_config(good_config, environ=NO_SWITCHES) == []


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("actor_rollout_ref.rollout.mode=async", "rollout.mode='async'"),
        ("actor_rollout_ref.actor.strategy=fsdp", "strategy='fsdp'"),
        ("actor_rollout_ref.rollout.free_cache_engine=False", "free_cache_engine is not true"),
        ("actor_rollout_ref.rollout.name=sglang", "rollout.name='sglang'"),
        ("trainer.device=cuda", "trainer.device='cuda'"),
    ],
)
def test_each_fallback_to_stock_is_rejected(overlay_rollout: None, override: str, expected: str) -> None:
    problems = check_recipe_config(compose(*GOOD, override), environ=NO_SWITCHES)
    assert len(problems) == 1, problems
    assert expected in problems[0]


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"R1_ASCEND_DISABLE_ALL": "1"}, "every patch is off"),
        ({"R1_ASCEND_DISABLE": "mindspeed_torch_compile,vllm_rollout_offload"}, "contains vllm_rollout_offload"),
        ({"R1_ASCEND_DISABLE": "vllm_rollout_ofload"}, "unknown patch name"),
    ],
)
def test_disabled_overlay_is_rejected(
    overlay_rollout: None, good_config: DictConfig, environ: dict[str, str], expected: str
) -> None:
    problems = check_recipe_config(good_config, environ=environ)
    assert len(problems) == 1, problems
    assert expected in problems[0]


def test_optional_patches_may_be_disabled(overlay_rollout: None, good_config: DictConfig) -> None:
    environ = {"R1_ASCEND_DISABLE": "mindspeed_torch_compile,verl_onpolicy_logprob"}
    assert check_recipe_config(good_config, environ=environ) == []


def test_stock_rollout_registry_is_rejected(good_config: DictConfig) -> None:
    """Without the prelude in this process verl would resolve its own vLLMRollout."""
    problems = check_recipe_config(good_config, environ=NO_SWITCHES)
    assert len(problems) == 1, problems
    assert "verl.workers.rollout.vllm_rollout.vLLMRollout" in problems[0]


def test_missing_recipe_config_is_named() -> None:
    from omegaconf import OmegaConf

    assert "--config-name" in check_recipe_config(OmegaConf.create({}))[0]


def test_task_runner_refuses_before_building_anything(overlay_rollout: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import verl.trainer.main_ppo

    from r1_ascend.recipe.main_grpo import R1AscendTaskRunner, RecipeConfigError

    # ray.remote(cls) rewrites the class's methods for tracing; keep verl's classes untouched in this process.
    monkeypatch.setattr(verl.trainer.main_ppo, "ray", type("RayStandIn", (), {"remote": staticmethod(lambda c: c)}))

    runner = R1AscendTaskRunner()
    with pytest.raises(RecipeConfigError, match=r"rollout\.mode='async'"):
        runner.run(compose(*GOOD, "actor_rollout_ref.rollout.mode=async"))
    assert runner.role_worker_mapping == {}
    with pytest.raises(RecipeConfigError, match="AsyncActorRolloutRefWorker"):
        runner.add_actor_rollout_worker(compose(*GOOD, "actor_rollout_ref.rollout.mode=async"))


def test_task_runner_refuses_a_broken_checkpoint_before_building_workers(
    overlay_rollout: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The resume check runs in the TaskRunner before any worker is built; switched off with the patch."""
    import sys

    import verl.trainer.main_ppo

    from r1_ascend.patches import CheckpointResumeError
    from r1_ascend.recipe.main_grpo import R1AscendTaskRunner

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "patches"))
    import checkpoint_fakes as fakes

    monkeypatch.setattr(verl.trainer.main_ppo, "ray", type("RayStandIn", (), {"remote": staticmethod(lambda c: c)}))
    fakes.truncate(fakes.shard(fakes.write_step(tmp_path, 2)))
    config = compose(*GOOD, f"trainer.default_local_dir={tmp_path}")
    runner = R1AscendTaskRunner()
    with pytest.raises(CheckpointResumeError, match="names step 2"):
        runner.run(config)
    assert runner.role_worker_mapping == {}
    monkeypatch.setenv("R1_ASCEND_DISABLE", "verl_checkpoint_integrity")
    monkeypatch.setattr(verl.trainer.main_ppo.TaskRunner, "run", lambda self, config: "stock verl's run")
    assert R1AscendTaskRunner().run(config) is None


def test_prepare_config_sets_sync_mode_and_the_runtime_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from omegaconf import open_dict

    from r1_ascend.recipe.main_grpo import prepare_config

    monkeypatch.setenv("R1_ASCEND_DISABLE", "verl_onpolicy_logprob")
    monkeypatch.setenv(EXTERNAL_MODULES, "shell.module")
    config = compose(*GOOD, "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=my.module")
    with open_dict(config):
        del config.actor_rollout_ref.rollout["mode"]

    prepare_config(config)

    assert config.actor_rollout_ref.rollout.mode == "sync"
    env_vars = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert env_vars[EXTERNAL_MODULES] == f"{PRELUDE},my.module,shell.module"
    assert env_vars["R1_ASCEND_DISABLE"] == "verl_onpolicy_logprob"
    runtime_env = ray_runtime_env(config)
    assert runtime_env["env_vars"][EXTERNAL_MODULES].startswith(PRELUDE)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in runtime_env["env_vars"] or "CUDA_DEVICE_MAX_CONNECTIONS" in os.environ


def test_prepare_config_keeps_an_explicit_async_mode_for_the_check_to_reject() -> None:
    from r1_ascend.recipe.main_grpo import prepare_config

    config = prepare_config(compose(*GOOD, "actor_rollout_ref.rollout.mode=async"))
    assert config.actor_rollout_ref.rollout.mode == "async"


def test_config_switch_wins_over_the_shell() -> None:
    config = compose(*GOOD, "+ray_kwargs.ray_init.runtime_env.env_vars.R1_ASCEND_DISABLE=mindspeed_torch_compile")
    env_vars = add_overlay_to_config(config, environ={"R1_ASCEND_DISABLE": "verl_onpolicy_logprob"})
    assert env_vars["R1_ASCEND_DISABLE"] == "mindspeed_torch_compile"
    assert env_vars[EXTERNAL_MODULES] == PRELUDE


@pytest.mark.slow
def test_ray_worker_applies_the_overlay_through_the_runtime_env() -> None:
    import shutil
    import tempfile

    import ray

    def _report_overlay() -> dict[str, Any]:
        """Runs inside a Ray worker (a local function, so Ray ships it by value)."""
        import os as worker_os

        import torch
        import verl  # noqa: F401 - the import under test
        from verl.workers.megatron_workers import ActorRolloutRefWorker

        from r1_ascend.patches import applied_names, patched_by

        return {
            "applied": applied_names(),
            "modules": worker_os.environ.get("VERL_USE_EXTERNAL_MODULES"),
            "build_rollout_patch": patched_by(ActorRolloutRefWorker.__dict__["_build_rollout"]),
            "mindspeed_stand_in_active": getattr(torch.compile, "__module__", "") == "r1_ascend.testing.mindspeed_fake",
            "pid": worker_os.getpid(),
        }

    config = compose(*GOOD)
    add_overlay_to_config(config, environ=NO_SWITCHES)
    runtime_env = ray_runtime_env(config)
    # Test-only: the worker also gets the torch_npu stub and the MindSpeed fake (sitecustomize on PYTHONPATH).
    runtime_env["env_vars"]["PYTHONPATH"] = str(STUB_SITE)
    runtime_env["env_vars"]["RAY_USAGE_STATS_ENABLED"] = "0"
    assert ray.is_initialized() is False
    temp_dir = tempfile.mkdtemp(prefix="r1ray")  # short: Ray's socket paths must stay under 108 bytes
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        runtime_env=runtime_env,
        _temp_dir=temp_dir,
        logging_level="ERROR",
        log_to_driver=False,
    )
    try:
        report = ray.get(ray.remote(num_cpus=1)(_report_overlay).remote(), timeout=240)
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)

    assert report["pid"] != os.getpid()
    assert report["modules"] == PRELUDE
    assert report["applied"] == [spec.name for spec in PATCHES]
    assert report["build_rollout_patch"] == "mindspeed_torch_compile"
    assert report["mindspeed_stand_in_active"]  # verl's worker module loaded (fake) MindSpeed, as on NPU


def test_the_task_runner_runs_on_the_head_node() -> None:
    """A worker node lost must not take the trainer (and its watchdog) with it: verl places the TaskRunner on any
    node with a free CPU, the recipe pins it to Ray's head-node resource."""
    from ray._private.resource_spec import HEAD_NODE_RESOURCE_NAME

    from r1_ascend.recipe.main_grpo import HEAD_NODE_RESOURCE, task_runner_class

    assert HEAD_NODE_RESOURCE == HEAD_NODE_RESOURCE_NAME
    options = task_runner_class()._default_options
    assert options["num_cpus"] == 1
    assert 0 < options["resources"][HEAD_NODE_RESOURCE] < 1
