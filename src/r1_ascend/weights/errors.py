"""Exceptions of the weight tools: each message says what failed, what was expected and how to fix it."""

from __future__ import annotations


class WeightsError(RuntimeError):
    """Base class: a checkpoint or an option is not what the conversion needs."""


class CheckpointFormatError(WeightsError):
    """An input file is truncated, malformed or inconsistent with its index."""


class OutputExistsError(WeightsError):
    """The output directory holds something this run did not produce; nothing was touched."""


class AlreadyBF16Error(CheckpointFormatError):
    """fp8-to-bf16 was given a checkpoint without FP8 weights: refused rather than copied as a silent no-op."""


class OutputNotWritableError(WeightsError):
    """The output directory (or a file in it) cannot be created or written."""
