"""The CPU's bf16 matrix products: torch's own kernels against r1_ascend.cpu.bf16_gemm, in one process.

Times a forward and backward pass of ``F.linear`` and of a batched product at the rehearsal's shapes (a fault batch
of 16 sequences x ~52 tokens, a learning batch of 64, the tiny model's hidden size 96, its expert and attention
widths), first with torch's kernels, then with the replacement installed, and prints the time of each and their
ratio. The results of the two differ by at most one bf16 rounding (tests/test_bf16_gemm.py).

    R1_ASCEND_CPU_BF16_GEMM=native python benchmarks/bf16_gemm_bench.py [--repeat 20] [--threads 1]

(``native`` keeps the stand-in site, if any, from installing the replacement before the baseline is timed.)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

SHAPES = {
    # name: (tokens, in features, out features) for F.linear, or (batch, m, k, n) for bmm
    "linear fault batch 832x96 -> 320 (experts' w13)": (832, 96, 320),
    "linear learning batch 3328x96 -> 320": (3328, 96, 320),
    "linear 3328x160 -> 96 (down_proj)": (3328, 160, 96),
    "bmm attention 64 x 52x52 (k 64)": (64, 52, 64, 52),
}


def _case(shape: tuple[int, ...]) -> Callable[[], None]:
    import torch

    generator = torch.Generator().manual_seed(0)
    if len(shape) == 3:
        tokens, fan_in, fan_out = shape
        x = torch.randn(tokens, fan_in, generator=generator).bfloat16().requires_grad_()
        w = torch.randn(fan_out, fan_in, generator=generator).bfloat16().requires_grad_()

        def linear() -> None:
            torch.nn.functional.linear(x, w).float().sum().backward()

        return linear
    batch, m, k, n = shape
    a = torch.randn(batch, m, k, generator=generator).bfloat16().requires_grad_()
    b = torch.randn(batch, k, n, generator=generator).bfloat16().requires_grad_()

    def bmm() -> None:
        torch.bmm(a, b).float().sum().backward()

    return bmm


def _seconds(work: Callable[[], None], repeat: int) -> float:
    work()  # warm-up
    started = time.perf_counter()
    for _ in range(repeat):
        work()
    return (time.perf_counter() - started) / repeat


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the rehearsal's workers run one)")
    args = parser.parse_args(argv)
    from r1_ascend import envs

    if envs.cpu_bf16_gemm():
        sys.exit(f"set {envs.R1_ASCEND_CPU_BF16_GEMM}=native so that torch's own kernels are timed first")
    import torch

    from r1_ascend.cpu import bf16_gemm

    torch.set_num_threads(args.threads)
    cases = {name: _case(shape) for name, shape in SHAPES.items()}
    native = {name: _seconds(work, args.repeat) for name, work in cases.items()}
    bf16_gemm.install({envs.R1_ASCEND_CPU_BF16_GEMM: "fp32-accumulate"})
    replaced = {name: _seconds(work, args.repeat) for name, work in cases.items()}
    print(f"forward + backward, {args.threads} thread(s), mean of {args.repeat}")
    print(f"  {'case':<48} {'torch bf16 ms':>14} {'fp32-accumulate ms':>19} {'ratio':>7}")
    for name in cases:
        ratio = native[name] / replaced[name]
        print(f"  {name:<48} {native[name] * 1e3:>14.2f} {replaced[name] * 1e3:>19.2f} {ratio:>6.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
