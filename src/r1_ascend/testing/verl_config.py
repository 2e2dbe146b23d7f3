"""verl's stock trainer configuration, composed as verl's own entry point composes it, for tests.

The overlay's driver-side patches and the recipe's checks read a resolved ``ppo_megatron_trainer`` config; tests
build one here with command-line style overrides instead of hand-writing a partial tree.
"""

from __future__ import annotations

from typing import Any

from r1_ascend.launch.overlays import verl_config_dir

TRAINER_CONFIG = "ppo_megatron_trainer"


def compose_trainer(*overrides: str) -> Any:
    """verl's ``ppo_megatron_trainer`` config with ``overrides`` (an OmegaConf ``DictConfig``)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(verl_config_dir()), version_base=None):
        return compose(TRAINER_CONFIG, overrides=list(overrides))
