"""Weight-preparation benchmark: every rate against a baseline measured in the same run, and peak RSS per worker.

Generates synthetic DeepSeek-V3-shaped FP8 checkpoints (``--size-gb`` and twice that) under ``--workdir`` and
prints:
  * dequantisation per core vs torch's raw FP8 -> BF16 cast (both one thread, same tensor);
  * fp8-to-bf16 with workers = cores vs the physical limit = min(plain copy of the same input, cold cache for both;
    raw cast rate per core x cores), for the whole process and for the conversion alone (the import of torch is a
    fixed cost of seconds); and, as an extra line, vs a cold copy of output-sized data (it writes 2 bytes per
    FP8 byte), which shows whether what remains is the disk;
  * to-megatron (BF16 -> torch_dist) with workers = cores vs a plain copy of its input, cold cache for both;
  * worker start-up (pool creation -> first task running) and threads per worker;
  * peak RSS of the main process and of the largest worker (``ru_maxrss``: memory-mapped pages would count), and
    its ratio when the checkpoint doubles.
Caches are dropped per file with ``posix_fadvise(DONTNEED)`` after a sync. Everything generated is deleted.

    .venv/bin/python benchmarks/weights_bench.py --workdir /tmp

The default, 1.5 GB and 3 GB, is large enough for the whole-process figure to mean something: importing torch is
a fixed 1.5-2.5 s, as long as a cold copy of a few hundred MB. Smaller sizes (``--size-gb 0.25``) run faster and
measure the conversion alone just as well.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = r"""
import json, os, resource, shutil, sys, time
from pathlib import Path
step, src, dst, workers = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
t0 = t_import = time.perf_counter()
if step == "copy":
    dst.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if f.is_file():
            with f.open("rb") as a, (dst / f.name).open("wb") as b:
                shutil.copyfileobj(a, b, 16 << 20)
                b.flush()
                os.fsync(b.fileno())
elif step == "fp8-to-bf16":
    from r1_ascend.weights.dequant import convert_fp8_to_bf16
    t_import = time.perf_counter()
    convert_fp8_to_bf16(src, dst, workers=workers, progress=False)
elif step == "to-megatron":
    from r1_ascend.weights import Layout, convert_hf_to_megatron
    t_import = time.perf_counter()
    convert_hf_to_megatron(src, dst, Layout(ep=2), workers=workers, progress=False)
seconds = time.perf_counter() - t0
# VmHWM (peak resident set of this process image, mapped file pages included); ru_maxrss would carry the
# benchmark parent's peak across exec.
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({
    "seconds": seconds,
    "import_seconds": t_import - t0,
    "main_rss_kb": hwm,
    "worker_rss_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
}))
"""

_RATES = r"""
import json, os, sys, time
os.environ["OMP_NUM_THREADS"] = "1"
import torch
torch.set_num_threads(1)
from r1_ascend.weights.fp8 import dequantize_rows
rows, cols = 2048, 7168
codes = torch.randint(0, 256, (rows, cols), dtype=torch.uint8)
codes[(codes & 0x7F) == 0x7F] = 0
x = codes.view(torch.float8_e4m3fn)
scale = torch.rand(rows // 128, cols // 128) * 1e-3
out = torch.empty((rows, cols), dtype=torch.bfloat16)
def best(fn, n=5):
    fn()
    times = []
    for _ in range(n):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return rows * cols / min(times)
cast = best(lambda: out.copy_(x))
deq = best(lambda: dequantize_rows(x, scale, 0, out))
cast_alloc = best(lambda: x.to(torch.bfloat16))
print(json.dumps({"cast": cast, "cast_alloc": cast_alloc, "dequant": deq}))
"""

_STARTUP = r"""
import json, os, time
# What the converter has imported when it creates its pool (forked workers inherit it, torch included).
import r1_ascend.weights.dequant
from r1_ascend.weights.workers import worker_pool
def probe(_):
    import torch
    return time.time(), torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
n = int(os.environ["BENCH_WORKERS"])
t_pool = time.time()
with worker_pool(n) as pool:
    got = list(pool.map(probe, range(n)))
print(json.dumps({"startup": max(t for t, _, _ in got) - t_pool, "threads": [t for _, t, _ in got],
                  "omp": [o for _, _, o in got]}))
"""


def _drop_cache(path: Path) -> None:
    """Evict ``path``'s files from the page cache (clean pages only, hence the sync first)."""
    os.sync()
    for f in path.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _py(code: str, *args: str, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    if out.returncode:
        raise SystemExit(f"benchmark step failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _step(step: str, src: Path, dst: Path, workers: int) -> dict:
    _drop_cache(src)
    return _py(_CHILD, step, str(src), str(dst), str(workers))


def _bytes(path: Path, suffix: str = "") -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and p.name.endswith(suffix))


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min) / {five:.1f} (5 min) on {os.cpu_count()} cores"


#: DeepSeek-V3's dimensions with one dense and one MoE layer (4 experts): the embedding and lm_head (1.85 GB BF16
#: each, copied) and the dense gate/up/down (132 M elements, the largest FP8 tensors) all land in one ~4.3 GB shard,
#: the size of V3's real shards.
V3_SHARD = {
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 1,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 4,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_nextn_predict_layers": 0,
}


def _v3_shard(workdir: Path) -> int:
    from r1_ascend.weights.tiny import make_tiny

    root = Path(tempfile.mkdtemp(prefix="r1-weights-v3-", dir=workdir))
    try:
        make_tiny(root / "fp8", config_overrides=V3_SHARD, fast=True, max_shard_bytes=10**10)
        shards = sorted((root / "fp8").glob("*.safetensors"))
        print(f"start: {_load()}; {len(shards)} shard(s), largest {max(p.stat().st_size for p in shards) / 1e9:.2f} GB")
        deq = _step("fp8-to-bf16", root / "fp8", root / "bf16", 1)
        shutil.rmtree(root / "fp8")
        mc = _step("to-megatron", root / "bf16", root / "mcore", 1)
        print(f"end: {_load()}")
        for name, r in (("fp8-to-bf16", deq), ("to-megatron", mc)):
            print(f"{name}: {r['seconds']:.1f} s, peak RSS {r['main_rss_kb'] / 1024:.0f} MiB (one process, no workers)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=1.5, help="smaller checkpoint size; the larger is 2x")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="default: one per core")
    parser.add_argument(
        "--v3-shard",
        action="store_true",
        help="instead: peak RSS on one ~4.3 GB shard with V3's real dimensions (embedding, lm_head, dense FFN)",
    )
    args = parser.parse_args()
    from r1_ascend.weights.tiny import config_for_size, make_tiny

    if args.v3_shard:
        return _v3_shard(args.workdir)

    cores, workers = os.cpu_count() or 1, args.workers
    print(f"start: {_load()}")
    rates = _py(_RATES)
    startup = _py(_STARTUP, env={"BENCH_WORKERS": str(workers)})
    root = Path(tempfile.mkdtemp(prefix="r1-weights-bench-", dir=args.workdir))
    rows = []
    try:
        for factor in (1, 2):
            target = int(args.size_gb * factor * 1e9)
            fp8 = root / f"fp8-{factor}"
            make_tiny(fp8, config_overrides=config_for_size(target), fast=True, max_shard_bytes=target // 4)
            size = _bytes(fp8, ".safetensors")
            copy = _step("copy", fp8, root / f"copy-{factor}", 1)
            shutil.rmtree(root / f"copy-{factor}")
            deq = _step("fp8-to-bf16", fp8, root / f"bf16-{factor}", workers)
            shutil.rmtree(fp8)
            bf16 = root / f"bf16-{factor}"
            bf16_size = _bytes(bf16, ".safetensors")
            copy_bf16 = _step("copy", bf16, root / f"copyb-{factor}", 1)
            shutil.rmtree(root / f"copyb-{factor}")
            mc = _step("to-megatron", bf16, root / f"mcore-{factor}", workers)
            shutil.rmtree(bf16)
            shutil.rmtree(root / f"mcore-{factor}")
            rows.append({"size": size, "bf16": bf16_size, "copy": copy, "deq": deq, "copyb": copy_bf16, "mc": mc})
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"end: {_load()}")
    print(
        f"\ntorch raw FP8->BF16 cast, 1 thread: {rates['cast'] / 1e6:.0f} M elem/s (into a preallocated tensor; "
        f"{rates['cast_alloc'] / 1e6:.0f} M elem/s with .to())"
    )
    print(f"dequantisation (table lookup), 1 thread: {rates['dequant'] / 1e6:.0f} M elem/s")
    print(f"RATIO dequant per core / raw cast per core: {rates['dequant'] / rates['cast']:.2f} (goal >= 0.8)")
    print(
        f"\nworker start-up ({workers} workers, pool creation -> all running): {startup['startup']:.3f} s (goal <= 2)"
    )
    print(
        f"threads per worker: {startup['threads']} (OMP_NUM_THREADS={startup['omp']}); "
        f"{workers} workers x {max(startup['threads'])} thread(s) on {cores} cores"
    )
    print("\nsize_fp8_GB step                 seconds  import_s  in_GB/s  main_RSS_MiB  worker_RSS_MiB")
    for r in rows:
        for name, res, nbytes in (
            ("copy FP8 (cold)", r["copy"], r["size"]),
            (f"fp8-to-bf16 w={workers}", r["deq"], r["size"]),
            ("copy BF16 (cold)", r["copyb"], r["bf16"]),
            (f"to-megatron w={workers}", r["mc"], r["bf16"]),
        ):
            print(
                f"{r['size'] / 1e9:11.2f} {name:20s} {res['seconds']:8.2f} {res['import_seconds']:9.2f}"
                f" {nbytes / 1e9 / res['seconds']:8.3f} {res['main_rss_kb'] / 1024:13.0f}"
                f" {res['worker_rss_kb'] / 1024:15.0f}"
            )
    print(
        "\n(seconds: whole process after interpreter start, imports included; import_s: of which importing the "
        "converter and torch, a fixed cost independent of the checkpoint size)"
    )
    for r in rows:
        deq = r["deq"]
        copy_rate = r["size"] / r["copy"]["seconds"]
        cast_limit = rates["cast"] * min(workers, cores)  # elements/s; FP8 input is ~1 byte per element
        limit = min(copy_rate, cast_limit)
        which = "copy" if copy_rate <= cast_limit else "cast x cores"
        whole = r["size"] / deq["seconds"] / limit
        conversion = r["size"] / (deq["seconds"] - deq["import_seconds"]) / limit
        print(
            f"{r['size'] / 1e9:.2f} GB: RATIO fp8-to-bf16 / physical limit ({which}, {limit / 1e9:.3f} GB/s): "
            f"{whole:.2f} whole process, {conversion:.2f} conversion alone (import excluded) (goal >= 0.8); "
            f"vs copy alone {r['size'] / deq['seconds'] / copy_rate:.2f}"
        )
        # The converter writes two bytes per FP8 input byte: a cold copy of its BF16 output (same bytes written,
        # fsynced the same way) is what the disk allows for this output. Extra line, not the goal's limit.
        print(
            f"{r['size'] / 1e9:.2f} GB: extra: fp8-to-bf16 / cold copy of output-sized data ({r['bf16'] / 1e9:.2f} GB "
            f"in {r['copyb']['seconds']:.2f} s): {r['copyb']['seconds'] / deq['seconds']:.2f} whole, "
            f"{r['copyb']['seconds'] / (deq['seconds'] - deq['import_seconds']):.2f} conversion alone"
        )
        mc = r["mc"]
        copyb_rate = r["bf16"] / r["copyb"]["seconds"]
        print(
            f"{r['size'] / 1e9:.2f} GB: RATIO to-megatron / plain copy of its input ({copyb_rate / 1e9:.3f} GB/s): "
            f"{r['bf16'] / mc['seconds'] / copyb_rate:.2f} whole process, "
            f"{r['bf16'] / (mc['seconds'] - mc['import_seconds']) / copyb_rate:.2f} conversion alone"
        )
    a, b = rows
    print(f"\ncheckpoint size ratio: {b['size'] / a['size']:.2f}")
    for key, label in (("deq", "fp8-to-bf16"), ("mc", "to-megatron")):
        print(
            f"{label} peak RSS ratio (2x / 1x): main {b[key]['main_rss_kb'] / a[key]['main_rss_kb']:.3f}, "
            f"worker {b[key]['worker_rss_kb'] / max(a[key]['worker_rss_kb'], 1):.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
