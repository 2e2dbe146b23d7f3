"""The CPU build of vLLM's DeepSeek class stands in at named upstream lines: they are there at the pins, and a
release that moves one is named (fast: reads the installed sources, builds nothing)."""

from __future__ import annotations

import pytest
import torch

from r1_ascend.cpu import vllm_deepseek


def test_the_stood_in_lines_are_in_the_pinned_sources() -> None:
    vllm_deepseek.check_targets()


def test_a_moved_line_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    module, attribute, _ = vllm_deepseek.TARGETS[0]
    monkeypatch.setattr(vllm_deepseek, "TARGETS", ((module, attribute, 'device="tpu"'),))
    with pytest.raises(vllm_deepseek.UpstreamDriftError, match=rf"{attribute}.*device=\"tpu\".*vllm_deepseek.py"):
        vllm_deepseek.check_targets()


@pytest.mark.parametrize("device", ["npu", "npu:3", torch.device("cpu"), "cpu", None])
def test_tensors_asked_for_on_the_npu_are_made_on_the_cpu(device: object) -> None:
    # device strings only: naming the PrivateUse1 backend "npu" is for the build's own process, never a test worker
    with vllm_deepseek.NPUOnCPU():
        made = torch.arange(4, device=device) if device is not None else torch.arange(4)
        moved = made.to("npu:0" if device is not None else "cpu")
    assert made.device.type == "cpu"
    assert moved.device.type == "cpu"
