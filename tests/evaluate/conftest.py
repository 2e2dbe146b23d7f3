"""Fixtures: a tiny DeepSeek-V3-shaped HF checkpoint (and its round trip through Megatron and ``to-hf``), small
validation sets written as ``r1-ascend prepare-data --val`` writes them, and a backend that answers as told."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from r1_ascend.data.template import build_prompt
from r1_ascend.evaluate import generation as gen

#: Three small sets, as deepscaler-format JSON: (problem, answer) rows.
SETS: dict[str, list[tuple[str, str]]] = {
    "aime24": [("What is 2 + 3?", "5"), ("What is 7 times 6?", "42"), ("What is 10 - 4?", "6")],
    "amc": [("What is 1/2 + 1/4?", "\\frac{3}{4}"), ("What is 9 squared?", "81")],
    "math500": [("What is the square root of 16?", "4")],
}


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quickstart's tiny DeepSeek-V3-shaped model as an HF BF16 directory with its tokenizer (seconds)."""
    from r1_ascend.launch.quickstart import add_tokenizer
    from r1_ascend.launch.smoke_model import smoke_overrides
    from r1_ascend.weights import convert_fp8_to_bf16, fix_checkpoint, make_tiny

    root = tmp_path_factory.mktemp("tiny-hf")
    make_tiny(root / "fp8", config_overrides=smoke_overrides("tiny"))
    convert_fp8_to_bf16(root / "fp8", root / "hf", drop_mtp=True, progress=False)
    fix_checkpoint(root / "hf")
    add_tokenizer(root / "hf")
    return root / "hf"


@pytest.fixture(scope="session")
def tiny_export(tiny_hf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny_hf`` through ``to-megatron`` and back with ``to-hf``: what a user evaluates after a run."""
    from r1_ascend.weights import convert_hf_to_megatron, convert_megatron_to_hf

    root = tmp_path_factory.mktemp("tiny-export")
    convert_hf_to_megatron(tiny_hf, root / "mcore", progress=False)
    convert_megatron_to_hf(root / "mcore", root / "export", hf_dir=tiny_hf, progress=False)
    return root / "export"


@pytest.fixture
def val_parquet(tmp_path: Path) -> Callable[..., Path]:
    """``make(sets=SETS) -> val.parquet``: the sets written as deepscaler JSON, then prepared with prepare_val."""
    from r1_ascend.data.prepare import prepare_val

    def make(sets: dict[str, list[tuple[str, str]]] = SETS, name: str = "prepared") -> Path:
        specs = []
        for set_name, rows in sets.items():
            path = tmp_path / f"{name}-{set_name}.json"
            path.write_text(json.dumps([{"problem": p, "answer": a} for p, a in rows]), encoding="utf-8")
            specs.append(f"{set_name}={path}")
        prepare_val(tmp_path / name, val_sets=specs)
        return tmp_path / name / "val.parquet"

    return make


def row(source: str | None, problem: str = "What is 1 + 1?", answer: str | None = "2", **changes) -> dict:
    """A prepared validation row (r1_ascend.data.rows.to_verl_row's layout), with fields replaced by ``changes``."""
    base = {
        "data_source": source,
        "prompt": build_prompt(problem),
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {
            "index": 0,
            "split": "test",
            "input_file": "x.json",
            "input_row": 0,
            "problem": problem,
            "solution": None,
            "extra_fields": "{}",
        },
    }
    return base | changes


def user_text(problem: str) -> str:
    """The user turn of a problem's prompt, as prepare-data writes it."""
    return next(m["content"] for m in build_prompt(problem) if m["role"] == "user")


class ScriptedBackend:
    """Answers each prompt with the completions ``script`` gives for its problem text; records what it was asked.

    The problem is found by decoding the prompt ids and looking for the problem's text in them, independently of how
    the command rendered the prompt."""

    name = "scripted"

    def __init__(self, tokenizer, script: dict[str, Sequence[gen.Completion]]) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.calls: list[tuple[list[gen.Request], gen.SamplingOptions]] = []

    def generate(self, requests, options, progress):
        self.calls.append((list(requests), options))
        out = []
        for request in requests:
            text = self.tokenizer.decode(list(request.token_ids))
            matches = [p for p in self.script if user_text(p) in text]
            assert len(matches) == 1, f"prompt matches {matches}: {text[-200:]!r}"
            completions = list(self.script[matches[0]])
            assert len(completions) == options.n
            out.append(completions)
            progress.update(options.n)
        return out


def boxed(answer: str) -> str:
    """A response in the R1 protocol whose final answer is ``answer``."""
    return f"<think>Let me compute.</think> <answer>The final answer is \\boxed{{{answer}}}.</answer>"
