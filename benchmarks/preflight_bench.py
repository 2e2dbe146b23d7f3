"""Wall time of ``r1-ascend preflight`` per shipped configuration, against the project-only checks as the baseline.

Each measurement is a fresh interpreter (what a user pays: imports, Hydra composition, every check), run
``--repeat`` times, median reported. The baseline runs the same composition and the project's own checks but not
the upstream ones (verl's validation and dataclasses, the reward loader, vLLM's and Megatron's rules), so the ratio
is the cost of running upstream's validation. The preflight's budget is 3 s for the 671B configuration.

    python benchmarks/preflight_bench.py [--repeat 3] [--configs grpo_deepseekv3_671b,...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from r1_ascend.launch.overlays import DEFAULT_OVERLAY, QWEN_OVERLAY, SMOKE_OVERLAY

BUDGET_S = 3.0

_FULL = "from r1_ascend.launch.preflight import main; main(['--config', {config!r}])"
_BASELINE = (
    "import os; from r1_ascend.launch import checks; from r1_ascend.launch.overlays import compose; "
    "run = checks.Run(compose({config!r}), {{}}, 64e9, full_env=dict(os.environ), config_name={config!r}); "
    "checks.prepare(run); [list(c(run)) for c in checks.CHECKS]"
)


def wall_time(code: str) -> float:
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--configs", default=",".join((DEFAULT_OVERLAY, SMOKE_OVERLAY, QWEN_OVERLAY)))
    args = parser.parse_args(argv)
    print(f"{'configuration':<24} {'baseline':>9} {'preflight':>10} {'ratio':>6}  budget {BUDGET_S:.0f} s")
    for config in args.configs.split(","):
        base, full = [], []
        for _ in range(args.repeat):  # interleaved, so load changes hit both alike
            base.append(wall_time(_BASELINE.format(config=config)))
            full.append(wall_time(_FULL.format(config=config)))
        b, f = statistics.median(base), statistics.median(full)
        verdict = "within" if f <= BUDGET_S else "OVER"
        print(f"{config:<24} {b:8.2f}s {f:9.2f}s {f / b:5.2f}x  {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
