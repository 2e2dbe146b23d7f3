"""The suite's scheduling list in conftest.py names real modules: a renamed module would silently leave it."""

from __future__ import annotations

from pathlib import Path

import conftest

REPO = Path(__file__).resolve().parents[1]


def test_every_machine_module_exists() -> None:
    missing = sorted(m for m in conftest.MACHINE_MODULES if not (REPO / m).is_file())
    assert missing == []
