"""The CPU replacements of megatron-core's device-only calls match the pinned upstream, and say so when not."""

from __future__ import annotations

import pytest

from r1_ascend.cpu import mcore as mcore_cpu


def test_every_target_matches_the_pinned_upstream() -> None:
    assert mcore_cpu.check_targets() == []


@pytest.mark.parametrize(
    ("module", "needle"),
    [
        ("megatron.core.models.gpt.gpt_layer_specs", "TEDotProductAttention"),
        ("megatron.core.transformer.moe.token_dispatcher", "torch.cuda.Stream()"),
        ("megatron.core.models.common.embeddings.yarn_rotary_pos_embedding", "torch.cuda.current_device()"),
    ],
)
def test_drift_in_a_target_is_named(monkeypatch: pytest.MonkeyPatch, module: str, needle: str) -> None:
    real = mcore_cpu.module_source

    def drifted(name: str) -> str:
        text = real(name)
        return text.replace(needle, "something_else") if name == module else text

    monkeypatch.setattr(mcore_cpu, "module_source", drifted)
    problems = mcore_cpu.check_targets()
    assert len(problems) == 1
    assert module in problems[0]
    assert needle.removesuffix("()").split(".")[-1] in problems[0] or needle in problems[0]


def test_every_replacement_is_documented() -> None:
    from pathlib import Path

    launch = (Path(__file__).resolve().parents[2] / "docs" / "rehearsal.md").read_text(encoding="utf-8")
    for replacement in mcore_cpu.REPLACEMENTS:
        assert replacement.what in launch, f"docs/rehearsal.md does not list {replacement.what!r}"
