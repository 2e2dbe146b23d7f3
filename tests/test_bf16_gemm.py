"""The CPU's bf16 matrix products (r1_ascend.cpu.bf16_gemm): bf16 operands, fp32 accumulation, one rounding.

Each replaced op must give, for bf16 operands, the fp32 product of the same numbers rounded once to bf16 (what an
NPU's cube unit gives, up to the order of the sums), keep the shape, dtype and gradients torch gives, and leave every
other dtype to torch's own kernels.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from r1_ascend import envs
from r1_ascend.cpu import bf16_gemm

pytestmark = pytest.mark.usefixtures("installed")


@pytest.fixture(scope="module")
def installed() -> None:
    assert bf16_gemm.install(), f"{envs.R1_ASCEND_CPU_BF16_GEMM} is set to keep torch's kernels in this environment"


def _bf16(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _close_to_rounded(result: torch.Tensor, exact: torch.Tensor) -> None:
    """Within one bf16 rounding of the fp32 result (the fp32 sums may be added in another order)."""
    assert result.dtype == torch.bfloat16
    assert result.shape == exact.shape
    torch.testing.assert_close(result.float(), exact.to(torch.bfloat16).float(), rtol=2**-7, atol=1e-6)


@given(m=st.integers(1, 40), k=st.integers(1, 40), n=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_mm_and_addmm_are_the_fp32_product_rounded_once(m: int, k: int, n: int, seed: int) -> None:
    a, b, bias = _bf16(m, k, seed=seed), _bf16(k, n, seed=seed + 1), _bf16(n, seed=seed + 2)
    exact = a.float() @ b.float()
    _close_to_rounded(torch.mm(a, b), exact)
    _close_to_rounded(torch.addmm(bias, a, b, beta=0.5, alpha=2.0), 0.5 * bias.float() + 2.0 * exact)
    _close_to_rounded(torch.nn.functional.linear(a, b.t(), bias), exact + bias.float())


@given(
    batch=st.integers(1, 4), m=st.integers(1, 16), k=st.integers(1, 16), n=st.integers(1, 16), seed=st.integers(0, 99)
)
def test_bmm_and_baddbmm_are_the_fp32_product_rounded_once(batch: int, m: int, k: int, n: int, seed: int) -> None:
    a, b, base = _bf16(batch, m, k, seed=seed), _bf16(batch, k, n, seed=seed + 1), _bf16(batch, m, n, seed=seed + 2)
    exact = torch.bmm(a.float(), b.float())
    _close_to_rounded(torch.bmm(a, b), exact)
    _close_to_rounded(torch.baddbmm(base, a, b, beta=0.0, alpha=0.25), 0.25 * exact)
    _close_to_rounded(torch.matmul(a, b), exact)


def test_a_transposed_operand_is_multiplied_as_it_is_viewed() -> None:
    a, w = _bf16(7, 5, seed=1), _bf16(3, 5, seed=2)
    _close_to_rounded(torch.matmul(a, w.t()), a.float() @ w.float().t())


def test_gradients_flow_and_stay_bf16() -> None:
    a = _bf16(6, 4, seed=3).requires_grad_()
    w = _bf16(5, 4, seed=4).requires_grad_()
    torch.nn.functional.linear(a, w).sum().backward()
    assert a.grad is not None
    assert w.grad is not None
    assert a.grad.dtype == w.grad.dtype == torch.bfloat16
    ones = torch.ones(6, 5)
    _close_to_rounded(a.grad, ones @ w.detach().float())
    _close_to_rounded(w.grad, ones.t() @ a.detach().float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_other_dtypes_keep_torchs_own_results(dtype: torch.dtype) -> None:
    a = (torch.arange(12).reshape(3, 4) - 5).to(dtype)
    b = (torch.arange(8).reshape(4, 2) - 3).to(dtype)
    expected = torch.tensor([[sum(int(a[i, j]) * int(b[j, c]) for j in range(4)) for c in range(2)] for i in range(3)])
    result = torch.mm(a, b)
    assert result.dtype == dtype
    assert torch.equal(result.to(torch.int64), expected)


def test_the_switch_keeps_torchs_kernels_and_refuses_a_typo() -> None:
    code = "from r1_ascend.cpu import bf16_gemm; print(bf16_gemm.install())"
    env = {"PATH": "", f"{envs.R1_ASCEND_CPU_BF16_GEMM}": "native"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == "False"
    env[envs.R1_ASCEND_CPU_BF16_GEMM] = "fp32"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert done.returncode != 0
    assert "expected 'fp32-accumulate' (the default) or 'native'" in done.stderr
