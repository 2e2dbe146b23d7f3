"""verl 0.6.1's own config code (dataclasses, ``omega_conf_to_dataclass``, ``validate_config``) without torch.

``import verl`` runs ``verl/__init__.py``, which imports torch, tensordict and ray (5-10 s), while the config
modules themselves need only omegaconf. :func:`verl_config_api` loads the installed config modules from their own
files under their real names, with the package ``__init__`` files skipped, and removes them from ``sys.modules``
again on exit, so nothing else in the process sees the partial package. The upstream code runs unmodified; the one
stand-in is ``verl.workers.config.model.HFModelConfig`` (it imports transformers and torch to load a tokenizer):
an empty ``BaseConfig`` dataclass, as the actor's default ``model_config`` is. When verl is already imported, the
real modules are used instead.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, make_dataclass
from pathlib import Path
from typing import Any

#: Config modules loaded from the installed verl, in dependency order (none of them imports torch).
_MODULES = (
    "verl.base_config",
    "verl.utils.profiler.config",
    "verl.trainer.config.config",
    "verl.trainer.config.algorithm",
    "verl.workers.config.engine",
    "verl.workers.config.optimizer",
    "verl.workers.config.model",  # stand-in, see module docstring
    "verl.workers.config.rollout",
    "verl.workers.config.actor",
    "verl.workers.config.critic",
    "verl.utils.config",
)
#: Packages whose ``__init__`` is skipped, with the modules whose public names the real ``__init__`` re-exports.
_PACKAGES = {
    "verl": (),
    "verl.utils": ("verl.utils.config",),
    "verl.utils.profiler": ("verl.utils.profiler.config",),
    "verl.trainer": (),
    "verl.trainer.config": ("verl.trainer.config.config", "verl.trainer.config.algorithm"),
    "verl.workers": (),
    "verl.workers.config": (
        "verl.workers.config.engine",
        "verl.workers.config.optimizer",
        "verl.workers.config.model",
        "verl.workers.config.rollout",
        "verl.workers.config.actor",
        "verl.workers.config.critic",
    ),
}


class UpstreamUnavailable(RuntimeError):
    """The installed verl does not have the config modules this loader expects."""


@dataclass(frozen=True)
class VerlConfigApi:
    """The upstream functions and dataclass modules the preflight calls."""

    omega_conf_to_dataclass: Any
    validate_config: Any
    modules: dict[str, types.ModuleType]

    def resolve_target(self, target: str) -> type | None:
        """The class a ``_target_`` string names, or None when it names nothing loaded (e.g. a stale target)."""
        module_name, _, attr = target.rpartition(".")
        module = self.modules.get(module_name)
        value = getattr(module, attr, None) if module is not None else None
        return value if isinstance(value, type) else None


def verl_root() -> Path:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        msg = "verl is not installed (install the pinned stack, README 'Install')"
        raise UpstreamUnavailable(msg)
    return Path(next(iter(spec.submodule_search_locations)))


def _real_verl_loaded() -> bool:
    module = sys.modules.get("verl")
    return module is not None and hasattr(module, "DataProto")


def _model_stand_in(base_config: type) -> types.ModuleType:
    module = types.ModuleType("verl.workers.config.model")
    module.HFModelConfig = make_dataclass("HFModelConfig", [], bases=(base_config,))  # type: ignore[attr-defined]
    module.__all__ = ["HFModelConfig"]  # type: ignore[attr-defined]
    return module


def _load_file(name: str, root: Path) -> types.ModuleType:
    path = root.joinpath(*name.split(".")[1:]).with_suffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not path.is_file():
        msg = f"verl at {root} has no {path.relative_to(root.parent)}; is it verl 0.6.1?"
        raise UpstreamUnavailable(msg)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _public(module: types.ModuleType) -> dict[str, Any]:
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    return {n: getattr(module, n) for n in names if hasattr(module, n)}


@contextmanager
def verl_config_api() -> Iterator[VerlConfigApi]:
    """The installed verl's config API, loaded without torch; ``sys.modules`` is restored on exit."""
    if _real_verl_loaded():
        modules = {name: importlib.import_module(name) for name in (*_MODULES, *_PACKAGES)}
        utils_config = modules["verl.utils.config"]
        yield VerlConfigApi(utils_config.omega_conf_to_dataclass, utils_config.validate_config, modules)
        return
    root = verl_root()
    before = {k: v for k, v in sys.modules.items() if k == "verl" or k.startswith("verl.")}
    modules: dict[str, types.ModuleType] = {}
    try:
        for name in _PACKAGES:
            package = types.ModuleType(name)
            location = str(root.joinpath(*name.split(".")[1:]))
            package.__path__ = [location]  # type: ignore[attr-defined]
            package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            package.__spec__.submodule_search_locations = [location]
            sys.modules[name] = modules[name] = package
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(modules[parent], child, package)
        for name in _MODULES:
            if name == "verl.workers.config.model":
                module = _model_stand_in(modules["verl.base_config"].BaseConfig)
                sys.modules[name] = module
            else:
                module = _load_file(name, root)
            modules[name] = module
            parent, _, child = name.rpartition(".")
            setattr(modules[parent], child, module)
            for package, members in _PACKAGES.items():
                if name in members:
                    vars(modules[package]).update(_public(module))
        utils_config = modules["verl.utils.config"]
        yield VerlConfigApi(utils_config.omega_conf_to_dataclass, utils_config.validate_config, modules)
    finally:
        for key in [k for k in sys.modules if k == "verl" or k.startswith("verl.")]:
            if key not in before:
                del sys.modules[key]
        sys.modules.update(before)
