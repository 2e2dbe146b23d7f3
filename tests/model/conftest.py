"""One converted smoke-model checkpoint per session, made as the rehearsal makes it: the quickstart's FP8 -> BF16 ->
Megatron chain, plus the tiny tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from r1_ascend.rehearse.inputs import make_weights

    hf_dir, _ = make_weights(tmp_path_factory.mktemp("model"))
    return hf_dir.parent
