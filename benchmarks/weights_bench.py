"""Weight-preparation benchmark: throughput vs a plain copy, and peak RSS as the checkpoint doubles.

Generates two synthetic DeepSeek-V3-shaped FP8 checkpoints (``--size-gb`` and twice that) under ``--workdir``,
then runs each step in a fresh subprocess and reads that process's peak RSS (``ru_maxrss``):
  * copy      : plain byte copy of the FP8 shards (the I/O baseline on this machine)
  * fp8-to-bf16 : streaming dequantisation (reads the same bytes, writes twice as many)
  * to-megatron : BF16 HF -> Megatron torch_dist
Prints a table and the ratios; everything generated is deleted at the end.

    .venv/bin/python benchmarks/weights_bench.py --size-gb 1 --workdir /tmp
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = r"""
import json, resource, shutil, sys, time
from pathlib import Path
step, src, dst = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
t0 = time.perf_counter()
if step == "copy":
    dst.mkdir(parents=True)
    for f in sorted(src.glob("*.safetensors")):
        shutil.copyfile(f, dst / f.name)
elif step == "fp8-to-bf16":
    from r1_ascend.weights import convert_fp8_to_bf16
    convert_fp8_to_bf16(src, dst, progress=False)
elif step == "to-megatron":
    from r1_ascend.weights import convert_hf_to_megatron
    convert_hf_to_megatron(src, dst, progress=False)
elif step == "baseline":
    import torch, safetensors  # interpreter + torch import only
    dst.mkdir(parents=True)
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def _run(step: str, src: Path, dst: Path) -> dict[str, float]:
    subprocess.run(["sync"], check=False)
    out = subprocess.run([sys.executable, "-c", _CHILD, step, str(src), str(dst)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{step} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=1.0, help="smaller checkpoint size; the larger is 2x")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    from r1_ascend.weights.tiny import config_for_size, make_tiny

    root = Path(tempfile.mkdtemp(prefix="r1-weights-bench-", dir=args.workdir))
    rows = []
    try:
        base = _run("baseline", root, root / "baseline")
        for factor in (1, 2):
            target = int(args.size_gb * factor * 1e9)
            fp8 = root / f"fp8-{factor}"
            t0 = time.perf_counter()
            make_tiny(fp8, config_overrides=config_for_size(target), fast=True, max_shard_bytes=256_000_000)
            gen_s = time.perf_counter() - t0
            size = _bytes(fp8)
            copy = _run("copy", fp8, root / f"copy-{factor}")
            shutil.rmtree(root / f"copy-{factor}")
            deq = _run("fp8-to-bf16", fp8, root / f"bf16-{factor}")
            shutil.rmtree(fp8)
            mc = _run("to-megatron", root / f"bf16-{factor}", root / f"mcore-{factor}")
            bf16_size = _bytes(root / f"bf16-{factor}")
            shutil.rmtree(root / f"bf16-{factor}")
            shutil.rmtree(root / f"mcore-{factor}")
            rows.append((factor, size, bf16_size, gen_s, copy, deq, mc))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"python+torch import baseline peak RSS: {base['maxrss_kb'] / 1024:.0f} MiB")
    print("size_fp8_GB step          seconds  GB/s(in)  peak_RSS_MiB")
    for _factor, size, bf16_size, gen_s, copy, deq, mc in rows:
        for name, r, nbytes in (("copy", copy, size), ("fp8-to-bf16", deq, size), ("to-megatron", mc, bf16_size)):
            print(
                f"{size / 1e9:11.2f} {name:13s} {r['seconds']:8.2f} {nbytes / 1e9 / r['seconds']:9.3f}"
                f" {r['maxrss_kb'] / 1024:13.0f}"
            )
        print(f"  (generation took {gen_s:.1f} s)")
    (_, s1, _, _, c1, d1, m1), (_, s2, _, _, c2, d2, m2) = rows
    print(
        f"fp8-to-bf16 throughput / plain copy: {c1['seconds'] / d1['seconds']:.3f} (1x), "
        f"{c2['seconds'] / d2['seconds']:.3f} (2x)"
    )
    print(f"checkpoint size ratio: {s2 / s1:.2f}")
    print(f"fp8-to-bf16 peak RSS ratio (2x / 1x): {d2['maxrss_kb'] / d1['maxrss_kb']:.3f}")
    print(f"to-megatron peak RSS ratio (2x / 1x): {m2['maxrss_kb'] / m1['maxrss_kb']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
