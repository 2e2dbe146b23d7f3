"""The Ray runtime environment that carries the overlay into every Ray worker.

verl imports the modules named in ``VERL_USE_EXTERNAL_MODULES`` on every ``import verl``; Ray workers get their
environment from the job's runtime env, not from the shell that launched the driver (the raylets were started
earlier by ``ray start``). So the prelude and the ``R1_ASCEND_*`` switches must be written into
``ray_kwargs.ray_init.runtime_env.env_vars``, which verl's ``run_ppo`` merges over its own defaults.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from r1_ascend import envs

PRELUDE = "r1_ascend.patches.prelude"
EXTERNAL_MODULES = "VERL_USE_EXTERNAL_MODULES"


def merge_external_modules(*values: str | None) -> str:
    """The prelude first (patches apply before any user module), then every other module once, in order."""
    modules = [PRELUDE]
    for value in values:
        for name in (value or "").split(","):
            name = name.strip()
            if name and name not in modules:
                modules.append(name)
    return ",".join(modules)


def overlay_env_vars(configured: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``configured`` (the config's runtime-env ``env_vars``) with the prelude and the switches added."""
    environ = os.environ if environ is None else environ
    result = {str(key): str(value) for key, value in configured.items()}
    result[EXTERNAL_MODULES] = merge_external_modules(configured.get(EXTERNAL_MODULES), environ.get(EXTERNAL_MODULES))
    for name, value in envs.patch_switches(environ).items():
        result.setdefault(name, value)  # a value in the config's runtime env wins over the launching shell's
    return result


def add_overlay_to_config(config: Any, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Write the overlay's env vars into ``config.ray_kwargs.ray_init.runtime_env.env_vars``; return them."""
    from omegaconf import OmegaConf, open_dict

    configured = OmegaConf.select(config, "ray_kwargs.ray_init.runtime_env.env_vars", default=None) or {}
    if not isinstance(configured, Mapping):
        configured = OmegaConf.to_container(configured)
    env_vars = overlay_env_vars(dict(configured), environ)
    with open_dict(config):
        OmegaConf.update(config, "ray_kwargs.ray_init.runtime_env.env_vars", env_vars, merge=False, force_add=True)
    return env_vars


def ray_runtime_env(config: Any) -> dict[str, Any]:
    """The runtime env ``run_ppo`` passes to ``ray.init``: verl's defaults merged with the config's."""
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    configured = OmegaConf.select(config, "ray_kwargs.ray_init.runtime_env", default=None) or {}
    merged = OmegaConf.merge(get_ppo_ray_runtime_env(), configured)
    return OmegaConf.to_container(merged)


def missing_overlay(env_vars: Mapping[str, str], required: Iterable[str] = (PRELUDE,)) -> list[str]:
    modules = (env_vars.get(EXTERNAL_MODULES) or "").split(",")
    return [name for name in required if name not in modules]
