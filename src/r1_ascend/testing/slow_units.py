"""Which test modules hold slow tests, for the test scheduler (conftest.py), which sees test ids but not markers."""

from __future__ import annotations

from pathlib import Path


def holds_slow_tests(module: Path) -> bool:
    """Whether the test module at ``module`` marks tests ``slow`` (``@pytest.mark.slow`` or a module-wide
    ``pytestmark``); a path that is no file holds none."""
    return module.is_file() and "mark.slow" in module.read_text(encoding="utf-8")
