"""Apply the registered patches in order, honouring the switches, once per process."""

from __future__ import annotations

import enum
import importlib
import logging
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from r1_ascend.stack import installed_version

from ._errors import PatchError, PatchTargetError, PatchVersionError
from ._install import modules_imported
from ._registry import PATCHES, PatchSpec
from ._target import check_signature, disable_hint, read_target, version_hint
from .rules.switches import read_switches
from .source_check import check_static

logger = logging.getLogger(__name__)


class Status(enum.Enum):
    APPLIED = "applied"
    ALREADY_APPLIED = "already applied"
    DISABLED = "disabled"


@dataclass(frozen=True)
class PatchResult:
    name: str
    status: Status


_lock = threading.Lock()
_results: dict[str, PatchResult] = {}


def check_versions(spec: PatchSpec) -> None:
    """Raise ``PatchVersionError`` unless every required distribution is installed at the pinned version."""
    for dist, wanted in spec.requires.items():
        found = installed_version(dist)
        if found is None or found.split("+", 1)[0] != wanted:
            raise PatchVersionError(_version_mismatch(spec.name, dist, wanted, found))


def _version_mismatch(patch: str, dist: str, wanted: str, found: str | None) -> str:
    installed = "not installed" if found is None else found
    fix = (
        "Install the pinned stack (src/r1_ascend/stack.toml), or, if you are upgrading, check the patch's "
        f"'Remove when' condition and disable it with R1_ASCEND_DISABLE={patch}."
    )
    return f"patch {patch!r} was written for {dist}=={wanted}, but {dist} is {installed}. {fix}"


def check_targets(spec: PatchSpec) -> None:
    """Check every declared target before anything is installed, so a patch with several targets is never left
    half-applied by drift in one of them (``PatchTargetError`` naming target, versions and switch).

    A target whose modules this process has imported is resolved strictly, as the installer will; one whose
    modules it has not is checked in the installed source, without importing them (the installer resolves it
    strictly once they are imported)."""
    for target in spec.targets:
        if modules_imported(target):
            current = read_target(target, patch=spec.name)
            if not target.is_dict_entry:
                check_signature(target, current, patch=spec.name)
            continue
        found = check_static(target)
        if not found.ok:
            msg = f"patch {spec.name!r}: target {target.path} does not match the installed source: {found.detail}"
            raise PatchTargetError(f"{msg}. {version_hint(target)} {disable_hint(spec.name)}")


def apply_one(spec: PatchSpec) -> Status:
    """Check versions, import the patch module and run its ``apply(spec)``; errors name the patch."""
    with _lock:
        done = _results.get(spec.name)
    if done is not None and done.status is Status.APPLIED:
        return Status.ALREADY_APPLIED
    check_versions(spec)
    check_targets(spec)
    module = importlib.import_module(spec.module)
    try:
        module.apply(spec)
    except PatchError:
        raise
    except Exception as exc:
        msg = f"patch {spec.name!r} failed to apply: {type(exc).__name__}: {exc}. {disable_hint(spec.name)}"
        raise PatchError(msg) from exc
    with _lock:
        _results[spec.name] = PatchResult(spec.name, Status.APPLIED)
    return Status.APPLIED


def apply_all(
    disabled: Iterable[str] | None = None,
    *,
    disable_all: bool | None = None,
    specs: Sequence[PatchSpec] = PATCHES,
) -> list[PatchResult]:
    """Apply every enabled patch in registry order; idempotent. Returns one result per patch."""
    skip = read_switches(disabled=disabled, disable_all=disable_all, specs=specs).disabled
    results = []
    for spec in specs:
        if spec.name in skip:
            results.append(PatchResult(spec.name, Status.DISABLED))
            continue
        results.append(PatchResult(spec.name, apply_one(spec)))
    return results


def applied_names() -> list[str]:
    with _lock:
        return [name for name, result in _results.items() if result.status is Status.APPLIED]


def forget_applied() -> None:
    """Forget what was applied (tests pair it with ``restore_all``)."""
    with _lock:
        _results.clear()


def summary_line(results: Sequence[PatchResult]) -> str:
    def names(status: Status) -> str:
        chosen = [r.name for r in results if r.status is status]
        return ",".join(chosen) if chosen else "none"

    return (
        f"r1-ascend overlay (pid {os.getpid()}): applied={names(Status.APPLIED)} "
        f"already={names(Status.ALREADY_APPLIED)} disabled={names(Status.DISABLED)}"
    )
