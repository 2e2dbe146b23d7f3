"""Fixtures for the data-preparation tests: the shipped sample, input-file writers and a tiny tokenizer."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SAMPLE = REPO_ROOT / "data" / "sample" / "deepscaler_sample.json"


@pytest.fixture
def sample_path() -> Path:
    return SAMPLE


@pytest.fixture
def write_json(tmp_path: Path) -> Callable[..., Path]:
    """Write rows as a JSON array (``fmt="json"``) or JSON Lines (``fmt="jsonl"``); raw strings are written as-is."""
    counter = iter(range(1_000_000))

    def write(rows: list[Any] | str, fmt: str = "json", name: str | None = None) -> Path:
        path = tmp_path / (name or f"input{next(counter)}.{fmt}")
        if isinstance(rows, str):
            text = rows
        elif fmt == "json":
            text = json.dumps(rows, indent=1)
        else:
            text = "".join(json.dumps(row) + "\n" for row in rows)
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture
def read_jsonl() -> Callable[[Path], list[dict[str, Any]]]:
    def read(path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

    return read


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A word-level tokenizer trained on the shipped sample, with DeepSeek's special tokens and chat format.

    Stands in for DeepSeek-V3's tokenizer (not downloadable here): what matters for verl's RLHFDataset is a
    working ``apply_chat_template`` and token ids, not the vocabulary.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from r1_ascend.data import template

    rows = json.loads(SAMPLE.read_text(encoding="utf-8"))
    texts = [template.R1_ZERO_INSTRUCTION] + [row["problem"] for row in rows]
    specials = [
        "[UNK]",
        "[PAD]",
        template.DEEPSEEK_BOS,
        template.DEEPSEEK_EOS,
        template.DEEPSEEK_USER,
        template.DEEPSEEK_ASSISTANT,
    ]
    model = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    model.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=specials))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=model,
        bos_token=template.DEEPSEEK_BOS,
        eos_token=template.DEEPSEEK_EOS,
        pad_token="[PAD]",
        unk_token="[UNK]",
    )
    tokenizer.chat_template = template.DEEPSEEK_V3_CHAT_TEMPLATE_SUBSET
    return tokenizer
