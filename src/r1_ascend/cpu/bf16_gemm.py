"""The CPU's bf16 matrix products, computed as an NPU's cube unit computes them: bf16 operands, fp32 accumulation,
one rounding of the result to bf16, through the CPU's fp32 BLAS.

Why: on a CPU without AVX-512 BF16 or AMX (the machines this project tests on), the CPU environment's torch
(requirements/cpu-constraints.txt) has no fast bf16 GEMM; its fallback kernel multiplies a rehearsal-sized product 8
to 18 times slower than the fp32 one (``benchmarks/bf16_gemm_bench.py``), and the rehearsal's steps spend most of
their time there. The products of bf16 numbers are exact in fp32, so widening the operands, multiplying in fp32 and
rounding once gives what a bf16 GEMM with fp32 accumulation gives, up to the order of the fp32 sums.

What it replaces: the CPU kernels of ``aten::mm``, ``aten::addmm``, ``aten::bmm`` and ``aten::baddbmm`` (the calls
``torch.matmul``, ``F.linear``, megatron-core's linear layers and attention, and autograd's backward of them reach),
through ``torch.library`` at the CPU dispatch key: bf16 operands are widened, other dtypes go straight on. Both reach
torch's own kernel of the op's ``out=`` overload, which is not replaced; autograd and every other op are untouched.
Installed with the stand-ins in every process of the rehearsal and the tests (r1_ascend.testing.stand_in_site,
conftest.py); ``R1_ASCEND_CPU_BF16_GEMM=native`` keeps torch's own kernels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from r1_ascend import envs

_installed: list[Any] = []


def installed() -> bool:
    """Whether this process multiplies bf16 through these kernels."""
    return bool(_installed)


def install(environ: Mapping[str, str] | None = None) -> bool:
    """Replace the four CPU kernels (once per process); False when ``R1_ASCEND_CPU_BF16_GEMM`` (of ``environ``, by
    default this process's) switches them off."""
    if _installed:
        return True
    if not envs.cpu_bf16_gemm(environ):
        return False
    import warnings

    import torch

    aten = torch.ops.aten
    bf16 = torch.bfloat16

    def widened(out_op: Any, rows_cols: Any) -> Any:
        """The kernel of one op: its last two tensors are the product's operands, a leading one the added term."""

        def kernel(*tensors: torch.Tensor, **scalars: Any) -> torch.Tensor:
            a, b = tensors[-2], tensors[-1]
            out = torch.empty(rows_cols(a, b), dtype=torch.float32 if a.dtype == bf16 else a.dtype)
            out_op(*(t.float() if t.dtype == bf16 else t for t in tensors), **scalars, out=out)
            return out.to(a.dtype)

        return kernel

    def matrix(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
        return (a.shape[0], b.shape[1])

    def batched(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
        return (a.shape[0], a.shape[1], b.shape[2])

    kernels = {
        "mm": widened(aten.mm.out, matrix),
        "addmm": widened(aten.addmm.out, matrix),
        "bmm": widened(aten.bmm.out, batched),
        "baddbmm": widened(aten.baddbmm.out, batched),
    }
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
        for name, kernel in kernels.items():
            library.impl(name, kernel, "CPU")
    _installed.append(library)  # the registrations live as long as the library object
    return True
