"""Run a callback when a module has finished importing (at once if it already has).

The installer uses it to replace a target when its module is first imported instead of importing every patched
module in every process: the driver and verl's TaskRunner never import vLLM, and importing every target cost them
7.3 and 4.6 CPU-seconds at start-up (benchmarks/prelude_startup_bench.py). One finder at the front of
``sys.meta_path`` asks the finders behind it for the spec of a watched module and wraps its loader so that, right
after the module's code ran and before any importer gets it, the callbacks run. The module keeps its own loader
(``__loader__``, ``__spec__.loader``). A callback that raises makes the import raise, so a drifted target fails
loudly where it would be used.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

#: Called with the name of the module that has just finished importing.
Callback = Callable[[str], None]

_lock = threading.RLock()
_callbacks: dict[str, list[Callback]] = {}
_running: set[str] = set()  # watched modules whose code is running now (not imported yet)
_searching = threading.local()  # names this thread is resolving through the other finders


def is_imported(module: str) -> bool:
    """Whether ``module`` is in ``sys.modules`` and not a watched module whose code is still running."""
    with _lock:
        return module in sys.modules and module not in _running


def when_imported(module: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``module`` has finished importing: now if it has, else right after its code
    ran, in the importing thread. A callback stays registered until it returned without raising; registering it
    again for the same module before then changes nothing."""
    with _lock:
        if not is_imported(module):
            registered = _callbacks.setdefault(module, [])
            if callback not in registered:
                registered.append(callback)
            _ensure_finder()
            return
    callback(module)


def forget(callbacks: Sequence[Callback] | None = None) -> None:
    """Drop the given callbacks (all if None) wherever they are registered."""
    with _lock:
        for name in list(_callbacks):
            kept = [] if callbacks is None else [c for c in _callbacks[name] if c not in callbacks]
            if kept:
                _callbacks[name] = kept
            else:
                del _callbacks[name]


def _ensure_finder() -> None:
    if not any(isinstance(finder, _NotifyingFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _NotifyingFinder())


def _notify(module: str) -> None:
    """Run the callbacks of ``module`` in registration order; one that raises stays for the next import."""
    with _lock:
        pending = _callbacks.pop(module, [])
    for index, callback in enumerate(pending):
        try:
            callback(module)
        except BaseException:
            with _lock:
                _callbacks[module] = [*pending[index:], *_callbacks.get(module, [])]
            raise


class _NotifyingFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched module it returns the spec the other finders give, loader wrapped."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        with _lock:
            if fullname not in _callbacks:
                return None
        searching: set[str] = getattr(_searching, "names", set())
        if fullname in searching:
            return None
        _searching.names = searching | {fullname}
        try:
            spec = _spec_from_other_finders(self, fullname, path, target)
        finally:
            _searching.names = searching
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _NotifyingLoader(spec.loader)
        return spec


def _spec_from_other_finders(
    me: _NotifyingFinder, fullname: str, path: Sequence[str] | None, target: ModuleType | None
) -> ModuleSpec | None:
    for finder in list(sys.meta_path):
        find_spec = getattr(finder, "find_spec", None)
        if finder is me or find_spec is None:
            continue
        spec = find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


class _NotifyingLoader(importlib.abc.Loader):
    """The module's own loader, followed by the callbacks; the module is handed its own loader back first."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        with _lock:
            _running.add(name)
        try:
            self.loader.exec_module(module)
        finally:
            with _lock:
                _running.discard(name)
        _notify(name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)
