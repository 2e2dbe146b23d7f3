"""Counts in words a reader expects: ``1 node`` / ``2 nodes``, ``671 B`` / ``5.72 B`` / ``2.1 M`` params."""

from __future__ import annotations


def plural(count: object, noun: str) -> str:
    """``count`` with ``noun`` in the singular for exactly one, else with an ``s``."""
    number = int(str(count))
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def human_count(value: float) -> str:
    """A count with three significant digits in the largest unit it reaches (T, B, M, k), or as is below 1000."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f}"
