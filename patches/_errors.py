"""Errors raised by the patch overlay. Every message says what failed, what was expected and how to fix it."""

from __future__ import annotations


class PatchError(RuntimeError):
    """Base class: a patch could not be applied or configured."""


class PatchTargetError(PatchError):
    """An upstream target is missing or its signature drifted from the one the patch was written against."""


class PatchVersionError(PatchError):
    """The installed upstream version does not satisfy the patch's declared requirement."""


class PatchConfigError(PatchError):
    """The overlay's switches are invalid (e.g. an unknown patch name in R1_ASCEND_DISABLE)."""
