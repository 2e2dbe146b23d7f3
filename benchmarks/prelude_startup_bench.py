"""Start-up of the processes the rehearsal launches in turn: the overlay installed on import against every target
imported up front, in fresh processes of one run.

Each case is a fresh Python process with the rehearsal's stand-in site (no NPU), importing what that process
imports before it can work:
- driver: ``r1_ascend.recipe.main_grpo`` (the prelude, verl's ``main_ppo``);
- TaskRunner: the same and ``verl.workers.megatron_workers``, with ``VERL_USE_EXTERNAL_MODULES`` set as in the
  Ray runtime env (verl imports the prelude).
The baseline of each case also imports every module a patch targets, which the prelude did before targets were
installed on import. Prints the median CPU seconds (user + system) and wall seconds of each, and their ratio.

    python benchmarks/prelude_startup_bench.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

from r1_ascend.patches import PATCHES, modules_needed
from r1_ascend.rehearse.cluster import with_site

CASES = {
    "driver": "import r1_ascend.recipe.main_grpo",
    "TaskRunner": "import verl, r1_ascend.recipe.main_grpo, verl.workers.megatron_workers",
}


def target_modules() -> list[str]:
    return sorted({module for spec in PATCHES for target in spec.targets for module in modules_needed(target)})


def run_once(code: str) -> tuple[float, float]:
    """CPU seconds and wall seconds of one fresh process running ``code``."""
    env = with_site({**os.environ, "VERL_USE_EXTERNAL_MODULES": "r1_ascend.patches.prelude"})
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per case and variant (median)")
    args = parser.parse_args()
    modules = target_modules()
    every_target = "; ".join(f"import {module}" for module in modules)
    print(f"{len(modules)} target modules; {args.repeat} fresh processes each, interleaved; medians")
    for name, code in CASES.items():
        samples: dict[str, list[tuple[float, float]]] = {"on import": [], "every target": []}
        for _ in range(args.repeat):
            samples["on import"].append(run_once(code))
            samples["every target"].append(run_once(f"{code}; {every_target}"))
        cpu = {variant: statistics.median(s[0] for s in runs) for variant, runs in samples.items()}
        wall = {variant: statistics.median(s[1] for s in runs) for variant, runs in samples.items()}
        print(
            f"{name:>10}: installed on import {cpu['on import']:.2f} CPU-s ({wall['on import']:.2f} s wall); "
            f"every target imported {cpu['every target']:.2f} CPU-s ({wall['every target']:.2f} s wall); "
            f"ratio {cpu['on import'] / cpu['every target']:.2f} (CPU), "
            f"saved {cpu['every target'] - cpu['on import']:.2f} CPU-s"
        )


if __name__ == "__main__":
    main()
