"""``pkg://MODULE`` reward paths become the installed module's file; anything else is left alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

import r1_ascend.recipe.deepscaler_reward as shipped
from r1_ascend.recipe.reward_file import RewardFileError, resolve, resolve_in_config


def test_a_module_name_becomes_the_file_python_would_import():
    assert Path(resolve("pkg://r1_ascend.recipe.deepscaler_reward")) == Path(shipped.__file__)


@pytest.mark.parametrize("path", ["recipe/deepscaler_reward.py", "/abs/reward.py", "", "pkg:/x"])
def test_plain_paths_are_unchanged(path):
    assert resolve(path) == path


@pytest.mark.parametrize(
    "path", ["pkg://r1_ascend.recipe.no_such_reward", "pkg://no_such_package.reward", "pkg://", "pkg://.relative"]
)
def test_a_module_that_is_not_there_or_has_no_source_file_is_refused_naming_it(path):
    with pytest.raises(RewardFileError, match=r"custom_reward_function\.path="):
        resolve(path)


def test_the_config_gets_the_file_in_place_and_a_file_path_is_kept():
    config = OmegaConf.create({"custom_reward_function": {"path": "pkg://r1_ascend.recipe.deepscaler_reward"}})
    resolve_in_config(config)
    assert config.custom_reward_function.path == shipped.__file__
    kept = OmegaConf.create({"custom_reward_function": {"path": "/x/reward.py"}})
    resolve_in_config(kept)
    assert kept.custom_reward_function.path == "/x/reward.py"
    resolve_in_config(OmegaConf.create({}))  # no reward section: nothing to do
