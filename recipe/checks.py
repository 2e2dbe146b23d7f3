"""Start-up checks: refuse a configuration under which verl would silently run its stock workers.

At verl 0.6.1 the overlay only takes effect on one path: the Megatron ``ActorRolloutRefWorker`` (rollout mode
``sync``) building the rollout class registered for ``("vllm", "sync")``, with ``free_cache_engine`` on so that
the offload/onload hooks run. Any other choice trains on stock code without an error (the r1_ascend predecessor ran
that way unnoticed), so every deviation is reported here. ``check_recipe_config`` is pure (it reads the config,
the overlay switches and the installed classes; it changes nothing) so ``r1-ascend preflight`` can reuse it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from r1_ascend import envs

#: The patch whose rollout class verl must pick; disabling it falls back to stock vLLM sleep mode.
ROLLOUT_PATCH = "vllm_rollout_offload"
ROLLOUT_KEY = ("vllm", "sync")


def check_recipe_config(
    config: Any,
    *,
    resolve_classes: bool = True,
    expect_device: str | None = "npu",
    environ: Mapping[str, str] | None = None,
) -> list[str]:
    """Problems that would make the run use stock verl code instead of the overlay; empty when all is well.

    ``resolve_classes`` also imports verl's rollout registry to check which rollout class it would build; the
    switches are read from ``environ`` (default: this process's environment).
    """
    from omegaconf import OmegaConf

    def value(key: str) -> Any:
        return OmegaConf.select(config, key, default=None)

    if value("actor_rollout_ref") is None:
        return ["the config has no actor_rollout_ref section: pass --config-path/--config-name of the recipe config"]
    problems = []
    mode = value("actor_rollout_ref.rollout.mode")
    if mode != "sync":
        problems.append(
            f"actor_rollout_ref.rollout.mode={mode!r}: the overlay patches the sync (SPMD) worker; with another mode "
            "verl picks its stock AsyncActorRolloutRefWorker and no rollout patch takes effect. Set "
            "actor_rollout_ref.rollout.mode=sync."
        )
    strategy = value("actor_rollout_ref.actor.strategy")
    if strategy != "megatron":
        problems.append(
            f"actor_rollout_ref.actor.strategy={strategy!r}: the overlay targets verl's Megatron workers. Set "
            "actor_rollout_ref.actor.strategy=megatron (use the ppo_megatron_trainer defaults)."
        )
    name = value("actor_rollout_ref.rollout.name")
    if name != "vllm":
        problems.append(
            f"actor_rollout_ref.rollout.name={name!r}: the overlay patches the vLLM rollout; set it to vllm."
        )
    if value("actor_rollout_ref.rollout.free_cache_engine") is not True:
        problems.append(
            "actor_rollout_ref.rollout.free_cache_engine is not true: verl then never calls the rollout's "
            "release/resume, so the weight and KV-cache offload never runs and training OOMs next to the idle "
            "engine. Set actor_rollout_ref.rollout.free_cache_engine=True."
        )
    device = value("trainer.device")
    if expect_device is not None and device != expect_device:
        problems.append(
            f"trainer.device={device!r}: verl 0.6.1 does not detect the device; set trainer.device={expect_device}."
        )
    problems.extend(_switch_problems(environ))
    problems.extend(_watchdog_problems(config))
    if resolve_classes and not problems:
        problems.extend(_class_problems(config))
    return problems


def _switch_problems(environ: Mapping[str, str] | None) -> list[str]:
    from r1_ascend.patches import PatchConfigError
    from r1_ascend.patches.rules.switches import read_switches

    try:
        switches = read_switches(environ)
    except PatchConfigError as exc:
        return [str(exc)]
    if switches.disable_all:
        return [f"{envs.R1_ASCEND_DISABLE_ALL} is set: every patch is off and verl runs stock code. Unset it."]
    if not switches.enabled(ROLLOUT_PATCH):
        return [
            f"{envs.R1_ASCEND_DISABLE} contains {ROLLOUT_PATCH}: verl would build its stock vLLM rollout (sleep mode) "
            f"instead of the offloading one. Remove it from {envs.R1_ASCEND_DISABLE}."
        ]
    return []


def _class_problems(config: Any) -> list[str]:
    """Ask verl's rollout registry which class ``_build_rollout`` would instantiate.

    The worker class is not resolved here: verl's ``TaskRunner.add_actor_rollout_worker`` calls ``ray.remote`` on
    it, which rewrites the class's methods for tracing — not something a check may do. ``R1AscendTaskRunner``
    checks verl's actual choice at run time; the strategy and mode checks above decide it.
    """
    from verl.workers.rollout import base as rollout_base

    registered = rollout_base._ROLLOUT_REGISTRY.get(ROLLOUT_KEY)
    if _is_offload_rollout(registered):
        return []
    return [
        f"verl's rollout registry maps {ROLLOUT_KEY} to {registered!r}, not the overlay's offloading rollout: the "
        f"{ROLLOUT_PATCH} patch is not applied in this process (was r1_ascend.patches.prelude imported?)."
    ]


def _is_offload_rollout(registered: Any) -> bool:
    from r1_ascend.patches import patched_by
    from r1_ascend.patches.vllm_rollout_offload import ROLLOUT_CLASS_PATH

    if isinstance(registered, str):
        return registered == ROLLOUT_CLASS_PATH
    path = f"{getattr(registered, '__module__', '')}.{getattr(registered, '__qualname__', '')}"
    return path == ROLLOUT_CLASS_PATH or patched_by(registered) == ROLLOUT_PATCH


def _watchdog_problems(config: Any) -> list[str]:
    """The run watchdog's settings (``r1_ascend.watchdog``) as the TaskRunner will read them."""
    from r1_ascend.patches import WatchdogConfigError
    from r1_ascend.patches.rules.watchdog import WatchdogConfig

    try:
        WatchdogConfig.from_config(config)
    except WatchdogConfigError as exc:
        return [str(exc)]
    return []
