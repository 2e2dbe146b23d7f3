"""Time and peak memory of ``prepare`` on a large deepscaler-format JSON array, against a naive baseline.

The baseline is the obvious implementation: ``json.load`` the whole file, build every row dict, and write them
with ``pandas.DataFrame(...).to_parquet``. Both run in this process on the same generated input; time is an untraced
run, peak memory the Python allocations of a second run under ``tracemalloc`` (same instrument for both).

    python benchmarks/data_bench.py [--source ../shared/data/deepscaler_component_math.json] [--copies 8]
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from r1_ascend.data.prepare import prepare
from r1_ascend.data.rows import to_verl_row, validate_record

DEFAULT_SOURCE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "deepscaler_component_math.json"


def make_input(source: Path, copies: int, target: Path) -> int:
    """Write ``copies`` renamed copies of ``source``'s rows as one JSON array (distinct problems, no dedup)."""
    rows = json.loads(source.read_text(encoding="utf-8"))
    count = 0
    with target.open("w", encoding="utf-8") as fh:
        fh.write("[\n")
        for copy in range(copies):
            for row in rows:
                fh.write(",\n" if count else "")
                fh.write(json.dumps(dict(row, problem=f"{row['problem']} (variant {copy})"), ensure_ascii=False))
                count += 1
        fh.write("\n]\n")
    return count


def naive(path: Path, out: Path) -> None:
    rows = json.load(path.open(encoding="utf-8"))
    converted = []
    for index, record in enumerate(rows):
        try:
            item = validate_record(record)
        except ValueError:
            continue
        where = {"index": index, "input_file": path.name, "input_row": index}
        converted.append(to_verl_row(item, data_source="deepscaler", split="train", **where))
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(converted).to_parquet(out / "train.parquet")


def ours(path: Path, out: Path) -> None:
    prepare([path], out, overwrite=True)


def measure(fn: Callable[[Path, Path], None], path: Path, out: Path) -> tuple[float, float]:
    """Wall time of an untraced run, then peak traced memory of a second run (tracemalloc slows Python code)."""
    gc.collect()
    start = time.perf_counter()
    fn(path, out / "timed")
    elapsed = time.perf_counter() - start
    gc.collect()
    tracemalloc.start()
    fn(path, out / "traced")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return elapsed, peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--copies", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = work / "big.json"
        n_rows = make_input(args.source, args.copies, data)
        size_mb = data.stat().st_size / 2**20
        print(f"input: {n_rows} rows, {size_mb:.1f} MiB JSON array ({args.copies} x {args.source.name})")
        base_t, base_m = measure(naive, data, work / "naive")
        our_t, our_m = measure(ours, data, work / "ours")
        print(f"baseline json.load + pandas: {base_t:6.2f} s, peak traced {base_m:7.1f} MiB")
        print(f"prepare (streaming):         {our_t:6.2f} s, peak traced {our_m:7.1f} MiB")
        print(f"ratio prepare/baseline: time {our_t / base_t:.2f}x, peak memory {our_m / base_m:.2f}x")
        print(f"prepare throughput: {n_rows / our_t:,.0f} rows/s, {size_mb / our_t:.1f} MiB/s")


if __name__ == "__main__":
    main()
