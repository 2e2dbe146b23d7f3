"""A behavioural stand-in for the parts of MindSpeed that r1-ascend touches, for machines without MindSpeed.

MindSpeed is not on PyPI, so CPU tests cannot install it. This fake reproduces, as observable behaviour and
without MindSpeed's code, exactly what the ``mindspeed_torch_compile`` patch and verl's Megatron worker rely on,
as of MindSpeed ``f6688c61bcfe45243ee5eb34c6f013b1e06eca81`` (line ``v2.2.0_core_r0.12.1``):

- ``mindspeed/patch_utils.py``: ``MindSpeedPatchesManager.patches_info`` is a class-level dict from a dotted name
  (``"torch.compile"``) to a ``Patch``. ``register_patch`` creates the entry or sets its replacement again,
  ``apply_patches`` / ``remove_patches`` apply or undo every entry (``remove_patches`` also clears wrappers).
  ``Patch.apply_patch`` records the upstream object the first time (``orig_func``), binds the replacement on the
  owner module and then on *every* module in ``sys.modules`` whose attribute of that name is the object being
  replaced (this is how ``from torch import compile`` copies get the stand-in too); it remembers what it bound as
  ``final_patch_func``. ``Patch.remove_patch`` walks ``sys.modules``, skipping every module whose name contains
  ``"mindspeed"``, puts ``orig_func`` back wherever the attribute is ``final_patch_func`` and then forgets the
  replacement (``patch_func`` and ``final_patch_func`` become ``None``). A replacement whose ``__name__`` ends in
  ``wrapper``/``decorator`` is stacked as a wrapper instead.
- ``mindspeed/core/megatron_basic/requirements_basic.py``: ``dummy_compile`` — called as ``torch.compile(fn)``
  returns a plain pass-through of ``fn``; called with only options returns a decorator doing the same.
- ``mindspeed/features_manager/megatron_basic/requirements_basic.py`` (``RequirementsBasicFeature.te_adaptation``):
  registers ``dummy_compile`` for ``torch.compile`` and ``torch.jit.script`` before Megatron is imported.
- ``mindspeed/megatron_adaptor.py``: importing it applies every feature's patches once (``patch_features``);
  ``repatch(args)`` removes all patches, re-registers every feature's patches and applies them again, so
  ``torch.compile`` is the stand-in again afterwards. verl 0.6.1 calls it in ``ActorRolloutRefWorker.__init__``.

Everything else in MindSpeed (its argument parser, the hundreds of other patches, ``torch_npu`` adaptation) is
deliberately absent. ``install()`` makes ``import mindspeed...`` resolve to this fake through a meta-path finder,
so that, as with the real package, nothing is patched until ``mindspeed.megatron_adaptor`` is imported.
``install(register_torch_compile=False)`` models a MindSpeed that never registers ``"torch.compile"``.
``uninstall()`` undoes all of it, including any stand-in still bound in ``sys.modules``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

PINNED_COMMIT = "f6688c61bcfe45243ee5eb34c6f013b1e06eca81"
_MARKER = "__r1_ascend_mindspeed_fake__"
_PACKAGES = ("mindspeed", "mindspeed.core", "mindspeed.core.megatron_basic")


# --- mindspeed/patch_utils.py ------------------------------------------------------------------------------------


class Patch:
    """One registered replacement of a dotted attribute, as ``mindspeed.patch_utils.Patch`` behaves."""

    def __init__(self, orig_func_name: str, new_func: Callable[..., Any] | None, create_dummy: bool) -> None:
        self.orig_module_name, _, self.orig_func_name = orig_func_name.rpartition(".")
        self.orig_module: types.ModuleType | None = None
        self.orig_func: Any = None
        self.patch_func: Any = None
        self.final_patch_func: Any = None
        self.wrappers: list[Callable[..., Any]] = []
        self.create_dummy = create_dummy
        self.is_applied = False
        self.set_patch_func(new_func if new_func is not None else _missing_function(orig_func_name))

    def set_patch_func(self, new_func: Callable[..., Any], force_patch: bool = False) -> None:
        if getattr(new_func, "__name__", "").endswith(("wrapper", "decorator")):
            if new_func not in self.wrappers:
                self.wrappers.append(new_func)
        else:
            if self.patch_func is not None and not force_patch:
                msg = f"the patch of {self.orig_func_name} exist !"
                raise RuntimeError(msg)
            self.patch_func = new_func
        self.is_applied = False

    def remove_wrappers(self, wrapper_names: str | list[str] | None = None) -> None:
        if wrapper_names is None:
            self.wrappers.clear()
            return
        names = {wrapper_names} if isinstance(wrapper_names, str) else set(wrapper_names)
        self.wrappers = [w for w in self.wrappers if w.__name__ not in names]

    def apply_patch(self) -> None:
        if self.is_applied:
            return
        owner = importlib.import_module(self.orig_module_name)
        current = getattr(owner, self.orig_func_name)
        if self.orig_module is None:
            self.orig_module, self.orig_func = owner, current
        replacement = self.patch_func if self.patch_func is not None else self.orig_func
        for wrapper in self.wrappers:
            replacement = wrapper(replacement)
        setattr(self.orig_module, self.orig_func_name, replacement)
        for module in list(sys.modules.values()):
            if hasattr(module, self.orig_func_name) and getattr(module, self.orig_func_name) is current:
                setattr(module, self.orig_func_name, replacement)
        self.final_patch_func = replacement
        self.is_applied = True

    def remove_patch(self) -> None:
        for name, module in list(sys.modules.items()):
            if "mindspeed" in name:
                continue
            if hasattr(module, self.orig_func_name) and getattr(module, self.orig_func_name) is self.final_patch_func:
                setattr(module, self.orig_func_name, self.orig_func)
        self.patch_func = None
        self.final_patch_func = None
        self.is_applied = False


def _missing_function(name: str) -> Callable[..., Any]:
    def missing(*args: Any, **kwargs: Any) -> Any:
        msg = f"function {name} no exist"
        raise RuntimeError(msg)

    return missing


class MindSpeedPatchesManager:
    """The class-level registry ``mindspeed.patch_utils.MindSpeedPatchesManager``."""

    patches_info: dict[str, Patch] = {}  # noqa: RUF012 - a shared class-level registry, as upstream

    @staticmethod
    def register_patch(
        orig_func_name: str,
        new_func: Callable[..., Any] | None = None,
        force_patch: bool = False,
        create_dummy: bool = False,
    ) -> None:
        entry = MindSpeedPatchesManager.patches_info.get(orig_func_name)
        if entry is None:
            MindSpeedPatchesManager.patches_info[orig_func_name] = Patch(orig_func_name, new_func, create_dummy)
        else:
            entry.set_patch_func(new_func, force_patch)

    @staticmethod
    def remove_patches() -> None:
        for entry in MindSpeedPatchesManager.patches_info.values():
            entry.remove_patch()
            entry.remove_wrappers()

    @staticmethod
    def apply_patches() -> None:
        for entry in MindSpeedPatchesManager.patches_info.values():
            entry.apply_patch()


# --- mindspeed/core/megatron_basic/requirements_basic.py ---------------------------------------------------------


def dummy_compile(*args: Any, **kwargs: Any) -> Callable[..., Any]:
    """MindSpeed's stand-in for ``torch.compile`` / ``torch.jit.script``: never compiles anything."""
    if args and callable(args[0]):
        fn = args[0]

        def wrapper(*fn_args: Any, **fn_kwargs: Any) -> Any:
            return fn(*fn_args, **fn_kwargs)

        return wrapper

    def compile_wrapper(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*fn_args: Any, **fn_kwargs: Any) -> Any:
            return fn(*fn_args, **fn_kwargs)

        return wrapper

    return compile_wrapper


# --- mindspeed/features_manager + mindspeed/megatron_adaptor.py --------------------------------------------------


class _State:
    register_torch_compile = True
    features_patched = False
    originals: dict[str, Any] = {}  # noqa: RUF012 - "torch.compile" -> object before install()
    finder: _Finder | None = None


def _register_basic_requirements() -> None:
    """What ``RequirementsBasicFeature.te_adaptation`` registers that concerns us."""
    if _State.register_torch_compile:
        MindSpeedPatchesManager.register_patch("torch.compile", dummy_compile)
    MindSpeedPatchesManager.register_patch("torch.jit.script", dummy_compile)


def patch_features() -> None:
    """Import-time body of ``mindspeed.megatron_adaptor``: apply every feature's patches once per process."""
    if _State.features_patched:
        return
    _State.features_patched = True
    _register_basic_requirements()
    MindSpeedPatchesManager.apply_patches()


def repatch(args: Any) -> None:
    """``mindspeed.megatron_adaptor.repatch``: drop every patch, register and apply them all again."""
    MindSpeedPatchesManager.remove_patches()
    _register_basic_requirements()
    MindSpeedPatchesManager.apply_patches()


# --- installation as importable modules --------------------------------------------------------------------------


def _module_contents() -> dict[str, dict[str, Any]]:
    return {
        "mindspeed": {"__version__": "0.12.1"},
        "mindspeed.core": {},
        "mindspeed.core.megatron_basic": {},
        "mindspeed.patch_utils": {"Patch": Patch, "MindSpeedPatchesManager": MindSpeedPatchesManager},
        "mindspeed.core.megatron_basic.requirements_basic": {"dummy_compile": dummy_compile},
        "mindspeed.megatron_adaptor": {"repatch": repatch, "patch_features": patch_features},
    }


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__.update(_module_contents()[module.__name__])
        module.__file__ = f"<r1-ascend fake of {module.__name__} at MindSpeed {PINNED_COMMIT[:8]}>"
        setattr(module, _MARKER, True)
        if module.__name__ == "mindspeed.megatron_adaptor":
            patch_features()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _module_contents():
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=fullname in _PACKAGES)


def is_installed() -> bool:
    return _State.finder is not None


def install(*, register_torch_compile: bool = True) -> None:
    """Make ``import mindspeed...`` load this fake; idempotent. Nothing is patched until the adaptor is imported.

    ``register_torch_compile=False`` models a MindSpeed without the ``"torch.compile"`` registry entry.
    """
    if _State.finder is not None:
        if _State.register_torch_compile != register_torch_compile:
            uninstall()
        else:
            return
    real = importlib.util.find_spec("mindspeed") if "mindspeed" not in sys.modules else None
    if real is not None:
        msg = f"a real MindSpeed is importable from {real.origin}; the fake is only for machines without it"
        raise RuntimeError(msg)
    import torch

    _State.originals = {"torch.compile": torch.compile, "torch.jit.script": torch.jit.script}
    _State.register_torch_compile = register_torch_compile
    _State.features_patched = False
    MindSpeedPatchesManager.patches_info.clear()
    _State.finder = _Finder()
    sys.meta_path.insert(0, _State.finder)


def uninstall() -> None:
    """Undo every fake patch (everywhere it was bound), forget the registry and remove the fake modules."""
    if _State.finder is None:
        return
    stand_ins = [entry.final_patch_func for entry in MindSpeedPatchesManager.patches_info.values()]
    MindSpeedPatchesManager.remove_patches()
    MindSpeedPatchesManager.patches_info.clear()
    import torch

    torch.compile = _State.originals["torch.compile"]
    torch.jit.script = _State.originals["torch.jit.script"]
    by_attribute = {"compile": _State.originals["torch.compile"], "script": _State.originals["torch.jit.script"]}
    for module in list(sys.modules.values()):
        if not isinstance(module, types.ModuleType) or getattr(module, _MARKER, False):
            continue
        for attr, original in by_attribute.items():
            value = vars(module).get(attr)
            if value is not None and any(value is s for s in stand_ins if s is not None):
                setattr(module, attr, original)
    for name in [n for n in sys.modules if n == "mindspeed" or n.startswith("mindspeed.")]:
        if getattr(sys.modules[name], _MARKER, False):
            del sys.modules[name]
    sys.meta_path.remove(_State.finder)
    _State.finder = None
    _State.features_patched = False
