"""The on/off rule of the overlay: which patches ``R1_ASCEND_DISABLE_ALL`` and ``R1_ASCEND_DISABLE`` switch off.

The installer, the recipe's start-up checks and preflight all ask ``read_switches``; nothing else reads the two
variables' meaning.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from r1_ascend import envs

from .._errors import PatchConfigError
from .._registry import PATCHES, PatchSpec

__all__ = ["Switches", "read_switches"]


@dataclass(frozen=True)
class Switches:
    """The switched-off patches, and whether they are off because every patch is."""

    disable_all: bool
    disabled: frozenset[str]

    def enabled(self, name: str) -> bool:
        return name not in self.disabled


def read_switches(
    environ: Mapping[str, str] | None = None,
    *,
    disabled: Iterable[str] | None = None,
    disable_all: bool | None = None,
    specs: Sequence[PatchSpec] = PATCHES,
    strict: bool = True,
) -> Switches:
    """The switches from ``environ`` (default: this process's environment), or from explicit arguments.

    An unknown patch name is a ``PatchConfigError`` naming the valid ones; with ``strict=False`` it is ignored
    (for a check that reports it elsewhere).
    """
    names = {spec.name for spec in specs}
    everything = disable_all if disable_all is not None else envs.disable_all(environ)
    if everything:
        return Switches(True, frozenset(names))
    chosen = set(disabled if disabled is not None else envs.disabled_patch_names(environ))
    unknown = sorted(chosen - names)
    if unknown and strict:
        msg = (
            f"unknown patch name(s) in {envs.R1_ASCEND_DISABLE}: {', '.join(unknown)}; "
            f"valid names: {', '.join(sorted(names))}"
        )
        raise PatchConfigError(msg)
    return Switches(False, frozenset(chosen & names))
