"""Patch targets: where in upstream code a patch rebinds something, and how to find it at run time."""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any

from ._errors import PatchTargetError

_MISSING = object()


@dataclass(frozen=True)
class Target:
    """One upstream attribute (or registry entry) that a patch replaces.

    ``module`` is the dotted module that defines it and ``attribute`` the dotted path inside that module
    (``"vLLMRollout.resume"``). ``params`` are the parameter names the patch was written against (checked with
    ``inspect.signature``; ``None`` skips the check). ``key`` makes the target an entry of a dict attribute.
    ``aliases`` are other ``module:attribute`` locations holding the same object (``from x import y`` copies)
    that must be rebound too; they are checked by identity, never found by scanning ``sys.modules``.
    ``distribution`` is the installed package providing the module, for error messages and version checks.
    """

    module: str
    attribute: str
    distribution: str
    params: tuple[str, ...] | None = None
    key: Any = None
    aliases: tuple[str, ...] = field(default=())

    @property
    def path(self) -> str:
        suffix = f"[{self.key!r}]" if self.key is not None else ""
        return f"{self.module}.{self.attribute}{suffix}"

    @property
    def is_dict_entry(self) -> bool:
        return self.key is not None


def import_module_strict(module: str, *, patch: str, target: Target) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        msg = (
            f"patch {patch!r}: cannot import {module!r} for target {target.path} ({exc}). "
            f"Is {target.distribution} installed? {disable_hint(patch)}"
        )
        raise PatchTargetError(msg) from exc


def resolve_owner(target: Target, *, patch: str) -> tuple[Any, str]:
    """Return ``(owner, name)`` such that ``owner.name`` is the target (strict: every step must exist)."""
    obj: Any = import_module_strict(target.module, patch=patch, target=target)
    *parents, name = target.attribute.split(".")
    walked = target.module
    for part in parents:
        walked = f"{walked}.{part}"
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            raise missing_target_error(target, patch=patch, what=walked)
    return obj, name


def read_target(target: Target, *, patch: str) -> Any:
    """The current upstream object at ``target`` (the dict value for an entry), strictly resolved."""
    owner, name = resolve_owner(target, patch=patch)
    # Defined on the owner itself: an inherited attribute means upstream moved the definition.
    value = vars(owner).get(name, _MISSING) if inspect.isclass(owner) else getattr(owner, name, _MISSING)
    if value is _MISSING:
        raise missing_target_error(target, patch=patch, what=f"{target.module}.{target.attribute}")
    if target.is_dict_entry:
        if not isinstance(value, dict):
            msg = f"patch {patch!r}: {target.module}.{target.attribute} is a {type(value).__name__}, expected a dict"
            raise PatchTargetError(f"{msg}. {version_hint(target)} {disable_hint(patch)}")
        if target.key not in value:
            raise missing_target_error(target, patch=patch, what=target.path, present=sorted(map(repr, value)))
        return value[target.key]
    return value


def check_signature(target: Target, obj: Any, *, patch: str) -> None:
    if target.params is None:
        return
    func = obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj
    try:
        found = tuple(inspect.signature(_undecorated(func)).parameters)
    except (TypeError, ValueError) as exc:
        msg = f"patch {patch!r}: {target.path} is not a callable with a signature ({exc})"
        raise PatchTargetError(f"{msg}. {version_hint(target)} {disable_hint(patch)}") from exc
    if found != target.params:
        msg = (
            f"patch {patch!r}: signature of {target.path} drifted: expected ({', '.join(target.params)}), "
            f"found ({', '.join(found)})"
        )
        raise PatchTargetError(f"{msg}. {version_hint(target)} {disable_hint(patch)}")


def _undecorated(func: Any) -> Any:
    """``func`` through decorators that did not use ``functools.wraps`` (verl's ``GPUMemoryLogger`` and
    ``register`` return a bare ``(*args, **kwargs)`` wrapper): the one function such a wrapper holds in its closure,
    followed inwards; ``func`` itself when a wrapper holds none or several."""
    for _ in range(8):
        params = inspect.signature(func).parameters.values() if callable(func) else ()
        if [p.kind for p in params] != [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]:
            return func
        inner = [
            cell.cell_contents
            for cell in getattr(func, "__closure__", None) or ()
            if inspect.isfunction(cell.cell_contents)
        ]
        if len(inner) != 1:
            return func
        func = inner[0]
    return func


def missing_target_error(
    target: Target, *, patch: str, what: str, present: list[str] | None = None
) -> PatchTargetError:
    extra = f" (present: {', '.join(present)})" if present is not None else ""
    msg = f"patch {patch!r}: target {what} not found{extra}. {version_hint(target)} {disable_hint(patch)}"
    return PatchTargetError(msg)


def version_hint(target: Target) -> str:
    from r1_ascend.stack import installed_version, pins

    installed = installed_version(target.distribution) or "not installed"
    expected = pins()["packages"].get(target.distribution) or _source_ref(target.distribution)
    return f"Installed {target.distribution}: {installed}; the patch was written for {target.distribution} {expected}."


def _source_ref(distribution: str) -> str:
    from r1_ascend.stack import pins

    source = pins().get("sources", {}).get(distribution, {})
    return str(source.get("commit") or source.get("ref") or "(unpinned)")


def disable_hint(patch: str) -> str:
    return f"Fix the patch for the installed upstream, or disable it with R1_ASCEND_DISABLE={patch}."
