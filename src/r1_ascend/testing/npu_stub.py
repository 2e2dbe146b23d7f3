"""A stand-in for ``torch_npu`` and the CANN Python modules on machines without an Ascend NPU.

Why: vllm-ascend and verl import ``torch_npu``, ``torchair``, ``acl`` and ``llm_datadist`` at module level.
The real ``torch_npu`` wheel needs CANN's shared libraries, so on a CPU machine nothing that touches the
Ascend platform can be imported. This stub makes those imports succeed so tests run against the *real*
upstream source, while reporting that no NPU is present (``torch.npu.is_available()`` is ``False``).

Every stub module has a real ``__spec__`` (``importlib.util.find_spec`` raises on a module without one) and
answers any attribute with a permissive placeholder that can be called, subclassed, iterated and compared.
Attributes that code reads as constants get real values. What was asked for is recorded in
``REQUESTED`` so a test can see which surface upstream actually used.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any

STUB_PREFIXES = ("torch_npu", "torchair", "acl", "llm_datadist")
STUB_VERSION = "2.5.1.post1"
REQUESTED: set[str] = set()
_MARKER = "__r1_ascend_npu_stub__"


def _placeholder_attribute(owner: str, item: str) -> Placeholder:
    """What an unknown attribute of a stub module or placeholder is (dunder names stay missing, as Python expects)."""
    if item.startswith("__") and item.endswith("__"):
        raise AttributeError(item)
    full = f"{owner}.{item}"
    REQUESTED.add(full)
    return Placeholder(full)


class Placeholder:
    """A value that tolerates whatever import-time code does with it."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __repr__(self) -> str:
        return f"<npu-stub {self._name}>"

    def __getattr__(self, item: str) -> Placeholder:
        return _placeholder_attribute(self._name, item)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Used as a decorator (``@torchair.scope.super_kernel``) -> return the decorated object.
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return Placeholder(f"{self._name}()")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (type(self._name.rsplit(".", 1)[-1], (), {"__module__": "npu_stub"}),)

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __int__(self) -> int:
        return 0

    def __index__(self) -> int:
        return 0

    def __enter__(self) -> Placeholder:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __eq__(self, other: object) -> bool:
        return other is self

    def __hash__(self) -> int:
        return hash(self._name)


class StubModule(types.ModuleType):
    """A module whose unknown attributes are placeholders."""

    def __getattr__(self, item: str) -> Any:
        return _placeholder_attribute(self.__name__, item)


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StubModule(spec.name)
        module.__path__ = []  # every stub is a package, so any submodule can be imported
        setattr(module, _MARKER, True)
        if spec.name in ("torch_npu", "torchair"):
            module.__version__ = STUB_VERSION
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "torch_npu":
            _fill_torch_npu(module)


class _StubFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", 1)[0] not in STUB_PREFIXES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)


def _fill_torch_npu(module: types.ModuleType) -> None:
    import torch

    module.npu = torch.npu  # type: ignore[attr-defined]


def _make_torch_npu_namespace() -> types.ModuleType:
    """``torch.npu`` as torch_npu installs it, reporting no device."""
    npu = StubModule("torch.npu")
    npu.__spec__ = importlib.machinery.ModuleSpec("torch.npu", None, is_package=True)
    npu.__path__ = []
    setattr(npu, _MARKER, True)
    npu.is_available = lambda: False
    npu.device_count = lambda: 0
    npu.current_device = lambda: 0
    npu.is_initialized = lambda: False
    npu.synchronize = lambda *a, **k: None
    npu.empty_cache = lambda: None
    npu.memory_allocated = lambda *a, **k: 0
    npu.memory_reserved = lambda *a, **k: 0
    npu.max_memory_allocated = lambda *a, **k: 0
    npu.mem_get_info = lambda *a, **k: (0, 0)
    for name in ("Stream", "Event", "ExternalEvent"):
        setattr(npu, name, type(name, (), {"__init__": lambda self, *a, **k: None}))
    for sub in ("config", "memory", "streams", "amp"):
        child = StubModule(f"torch.npu.{sub}")
        child.__spec__ = importlib.machinery.ModuleSpec(f"torch.npu.{sub}", None)
        setattr(npu, sub, child)
        sys.modules[f"torch.npu.{sub}"] = child
    return npu


def is_installed() -> bool:
    """Whether this stub (not a real torch_npu) is what ``import torch_npu`` would give."""
    module = sys.modules.get("torch_npu")
    if module is not None:
        return bool(getattr(module, _MARKER, False))
    return any(isinstance(f, _StubFinder) for f in sys.meta_path)


def install() -> None:
    """Install the stub finder and ``torch.npu``; idempotent. Call before importing verl or vLLM."""
    real = importlib.util.find_spec("torch_npu") if "torch_npu" not in sys.modules else None
    if real is not None and not isinstance(real.loader, _StubLoader):
        msg = "a real torch_npu is installed; the NPU stub is only for machines without CANN"
        raise RuntimeError(msg)
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder())
    import torch

    if not getattr(getattr(torch, "npu", None), _MARKER, False):
        npu = _make_torch_npu_namespace()
        torch.npu = npu  # type: ignore[attr-defined]
        sys.modules["torch.npu"] = npu
