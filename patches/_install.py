"""The only code in r1-ascend that rebinds attributes of foreign modules.

``install`` resolves a target strictly, keeps the original (first original wins, so re-applying never wraps a
wrapper), marks the replacement with the patch name, rebinds the declared aliases and is idempotent.
``install_on_import`` does the same once the target's module and its aliases' modules have been imported, so a
process patches only what it imports. ``restore_all`` undoes everything, newest first, and drops what is still
waiting for an import (tests use it to leave upstream untouched).
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import _import_hooks as import_hooks
from ._errors import PatchTargetError
from ._target import Target, check_signature, disable_hint, read_target, resolve_owner

logger = logging.getLogger(__name__)

#: Attribute set on every replacement object: the name of the patch that installed it.
MARKER = "__r1_ascend_patch__"


@dataclass
class _Record:
    patch: str
    target: Target
    owner: Any
    name: str
    original: Any
    replacement: Any
    alias_owners: tuple[tuple[Any, str], ...]


@dataclass(frozen=True)
class _Waiting:
    patch: str
    target: Target
    build: Callable[[Any], Any]


_lock = threading.RLock()
_records: dict[str, _Record] = {}  # target path -> record, in installation order
_waiting: dict[str, _Waiting] = {}  # target path -> install waiting for its modules, in registration order


def install(patch: str, target: Target, build: Callable[[Any], Any]) -> Any:
    """Replace ``target`` with ``build(original)`` and return the replacement.

    Idempotent: if the target already carries this patch's replacement, nothing changes and the existing
    replacement is returned. Raises ``PatchTargetError`` when the target (or an alias) is missing, its signature
    drifted, or another patch already replaced it.
    """
    with _lock:
        record = _records.get(target.path)
        current = read_target(target, patch=patch)
        if record is not None:
            if record.patch != patch:
                msg = f"patch {patch!r}: {target.path} is already replaced by patch {record.patch!r}"
                raise PatchTargetError(msg)
            if current is record.replacement:
                return record.replacement
            msg = (
                f"patch {patch!r}: {target.path} was rebound by someone else after the patch was installed "
                f"(now {current!r}). {disable_hint(patch)}"
            )
            raise PatchTargetError(msg)
        if not target.is_dict_entry:
            check_signature(target, current, patch=patch)
        alias_owners = tuple(_resolve_alias(alias, current, patch=patch, target=target) for alias in target.aliases)
        replacement = build(current)
        if not target.is_dict_entry:
            _mark(replacement, patch)
        owner, name = resolve_owner(target, patch=patch)
        _bind(owner, name, target, replacement)
        for alias_owner, alias_name in alias_owners:
            setattr(alias_owner, alias_name, replacement)
        _records[target.path] = _Record(patch, target, owner, name, current, replacement, alias_owners)
        logger.debug("patch %s: replaced %s", patch, target.path)
        return replacement


def modules_needed(target: Target) -> tuple[str, ...]:
    """The modules that must have been imported before ``target`` can be replaced: its own and its aliases'."""
    alias_modules = (alias.partition(":")[0] for alias in target.aliases)
    return tuple(dict.fromkeys((target.module, *alias_modules)))


def modules_imported(target: Target) -> bool:
    """Whether every module of :func:`modules_needed` has finished importing in this process."""
    return all(import_hooks.is_imported(module) for module in modules_needed(target))


def install_on_import(patch: str, target: Target, build: Callable[[Any], Any]) -> bool:
    """``install`` now if :func:`modules_imported` (True), else right after the last of the modules it needs
    finishes importing (False). An install that fails then makes that import raise."""
    with _lock:
        if modules_imported(target):
            ready = True
        else:
            ready = False
            waiting = _waiting.get(target.path)
            if waiting is not None and waiting.patch != patch:
                msg = f"patch {patch!r}: {target.path} is already to be replaced by patch {waiting.patch!r}"
                raise PatchTargetError(msg)
            _waiting[target.path] = _Waiting(patch, target, build)
    if ready:
        install(patch, target, build)
        return True
    for module in modules_needed(target):
        import_hooks.when_imported(module, _install_ready)
    return False


def _install_ready(imported: str) -> None:
    """Install, in registration order, every waiting target whose modules have all been imported now."""
    with _lock:
        ready = [
            waiting
            for waiting in _waiting.values()
            if imported in modules_needed(waiting.target) and modules_imported(waiting.target)
        ]
    for waiting in ready:
        install(waiting.patch, waiting.target, waiting.build)
        with _lock:
            _waiting.pop(waiting.target.path, None)


def waiting_targets(patch: str | None = None) -> list[str]:
    """Targets declared but not replaced yet because their modules have not been imported in this process."""
    with _lock:
        return [path for path, waiting in _waiting.items() if patch is None or waiting.patch == patch]


def get_original(target: Target | str) -> Any:
    """The upstream object a patch replaced (``KeyError`` if the target is not patched)."""
    path = target.path if isinstance(target, Target) else target
    with _lock:
        return _records[path].original


def patched_by(obj: Any) -> str | None:
    """The name of the patch that produced ``obj``, or None for upstream objects."""
    func = obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj
    return getattr(func, MARKER, None)


def installed_targets(patch: str | None = None) -> list[str]:
    with _lock:
        return [path for path, rec in _records.items() if patch is None or rec.patch == patch]


def restore_all() -> None:
    """Put every original back, newest first, forget all records and drop the installs still waiting."""
    with _lock:
        _waiting.clear()
        import_hooks.forget([_install_ready])
        for record in reversed(list(_records.values())):
            _bind(record.owner, record.name, record.target, record.original)
            for alias_owner, alias_name in record.alias_owners:
                setattr(alias_owner, alias_name, record.original)
        _records.clear()


def _bind(owner: Any, name: str, target: Target, value: Any) -> None:
    if target.is_dict_entry:
        getattr(owner, name)[target.key] = value
    else:
        setattr(owner, name, value)


def _mark(obj: Any, patch: str) -> None:
    func = obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj
    try:
        setattr(func, MARKER, patch)
    except (AttributeError, TypeError) as exc:
        msg = f"patch {patch!r}: replacement {obj!r} cannot carry the patch marker ({exc})"
        raise PatchTargetError(msg) from exc


def _resolve_alias(alias: str, original: Any, *, patch: str, target: Target) -> tuple[Any, str]:
    module_name, _, attr = alias.partition(":")
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as exc:
        msg = f"patch {patch!r}: cannot import {module_name!r} for alias {alias} of {target.path} ({exc})"
        raise PatchTargetError(f"{msg}. {disable_hint(patch)}") from exc
    *parents, name = attr.split(".")
    for part in parents:
        owner = getattr(owner, part)
    if getattr(owner, name, None) is not original:
        msg = (
            f"patch {patch!r}: alias {alias} no longer refers to {target.path}; upstream changed how it "
            f"imports it. {disable_hint(patch)}"
        )
        raise PatchTargetError(msg)
    return owner, name
