"""Shared fixtures: one synthetic DeepSeek-V3 FP8 checkpoint and its BF16 conversion per test session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from r1_ascend.weights import convert_fp8_to_bf16, make_tiny


def oracle_dequant(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Elementwise statement of DeepSeek's rule: y[m, n] = bf16(f32(x[m, n]) * s[m // 128, n // 128])."""
    rows, cols = weight.shape
    expanded = scale[torch.arange(rows) // 128][:, torch.arange(cols) // 128]
    return (weight.to(torch.float32) * expanded.to(torch.float32)).to(torch.bfloat16)


@pytest.fixture(scope="session")
def oracle():
    return oracle_dequant


@pytest.fixture(scope="session")
def tiny_fp8(tmp_path_factory: pytest.TempPathFactory):
    return make_tiny(tmp_path_factory.mktemp("tiny") / "fp8", seed=1)


@pytest.fixture(scope="session")
def tiny_bf16(tiny_fp8, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bf16") / "bf16"
    convert_fp8_to_bf16(tiny_fp8.path, out, progress=False)
    return out
