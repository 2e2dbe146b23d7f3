"""One converted smoke-model checkpoint per session: the quickstart's FP8 -> BF16 -> Megatron chain."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from r1_ascend.launch.quickstart import convert, make_checkpoint

    root = tmp_path_factory.mktemp("model")
    make_checkpoint(root / "fp8", "tiny")
    convert(root / "fp8", root / "weights")
    return root / "weights"
