"""Fixtures shared by the patch tests: every test leaves upstream exactly as it found it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from r1_ascend.patches import _apply, restore_all


@pytest.fixture(autouse=True)
def _restore_upstream() -> Iterator[None]:
    yield
    restore_all()
    _apply.forget_applied()
