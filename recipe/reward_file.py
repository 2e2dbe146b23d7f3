"""``custom_reward_function.path`` by module name: ``pkg://r1_ascend.recipe.deepscaler_reward``.

verl 0.6.1 loads the reward from a file path (``get_custom_reward_fn``: ``spec_from_file_location``), which ties a
config to where the repository happens to be checked out and the working directory of the run. The shipped configs
name the reward's module instead; the recipe entry point and preflight replace that with the file of the *installed*
module before verl reads the config, so the reward that runs is the one installed, whatever the working directory.
A plain file path is left as it is.
"""

from __future__ import annotations

import importlib.util
from typing import Any

PREFIX = "pkg://"


class RewardFileError(ValueError):
    """A ``pkg://`` reward path names no importable module with a source file."""


def resolve(path: str) -> str:
    """The file behind ``pkg://MODULE`` (the module is found, not imported); any other path unchanged."""
    if not path.startswith(PREFIX):
        return path
    module = path[len(PREFIX) :]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        spec, cause = None, f" ({type(exc).__name__}: {exc})"
    else:
        cause = ""
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        msg = (
            f"custom_reward_function.path={path}: no installed module {module!r} with a source file{cause}; "
            "give a module of the installed r1_ascend package (pkg://r1_ascend.recipe.deepscaler_reward) or a file "
            "path"
        )
        raise RewardFileError(msg)
    return spec.origin


def resolve_in_config(config: Any) -> None:
    """Replace a ``pkg://`` ``custom_reward_function.path`` of an OmegaConf config by its file, in place."""
    from omegaconf import OmegaConf

    path = OmegaConf.select(config, "custom_reward_function.path")
    if isinstance(path, str) and path.startswith(PREFIX):
        OmegaConf.update(config, "custom_reward_function.path", resolve(path))
