"""``r1-ascend guard-levels``: the rollout guard's absolute warn and stop levels, measured on healthy runs.

Reads the ``rollout_guard/*`` statistics that healthy runs logged (console logs, TensorBoard event files or run
directories, as ``r1-ascend report`` reads them; each path one run, all steps pooled) and proposes, for every gated
statistic, a warn level of twice and a stop level of four times the largest healthy value (rounded up to two
significant digits, never below the statistic's floor). Twice the healthy maximum leaves room for a step worse than
any seen; four times keeps a factor of two between warning and stopping. These are the absolute levels: those a
run has while it calibrates, and the caps of the levels it calibrates from its own first steps (docs/rollout_guard.md
"Levels"); the calibrated levels themselves need no measuring. On a new cluster or model: run the first steps with
the defaults (a stop names the statistic; raise that level on the command line only if the run is known to be
healthy), then

    r1-ascend guard-levels outputs/run1 outputs/run2 --yaml

and put the printed block under ``r1_ascend.rollout_guard`` in the run's config. Exit status: 0 with a proposal,
1 when fewer than ``--min-steps`` healthy steps were found (the proposal is printed but should not be trusted),
2 when no guard statistic was logged.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from r1_ascend.patches.rules import rollout_guard as guard

#: warn = WARN_FACTOR x healthy max, stop = STOP_FACTOR x healthy max.
WARN_FACTOR = 2.0
STOP_FACTOR = 4.0
#: Lowest levels proposed, by statistic: a tail fraction healthy runs keep at 0 still needs a few tokens' room.
FLOORS: dict[str, tuple[float, float]] = {"tail_fraction": (0.01, 0.02)}


def round_up(value: float, digits: int = 2) -> float:
    """``value`` rounded up to ``digits`` significant digits (0 stays 0)."""
    if value <= 0 or not math.isfinite(value):
        return value
    scale = 10 ** (math.floor(math.log10(value)) - digits + 1)
    # the product's floating-point noise (3.5000000000000004e-12) cut at the same significant digits, not decimals
    return float(f"{math.ceil(round(value / scale, 9)) * scale:.{digits}g}")


@dataclass(frozen=True)
class Proposal:
    statistic: str
    steps: int
    healthy_max: float
    warn: float
    stop: float


def propose(values: dict[str, list[float]]) -> list[Proposal]:
    """One proposal per gated statistic that has values (NaN steps are skipped: they are not healthy)."""
    proposals = []
    for name in guard.GATED:
        finite = [v for v in values.get(name, []) if math.isfinite(v)]
        if not finite:
            continue
        top = max(finite)
        warn_floor, stop_floor = FLOORS.get(name, (0.0, 0.0))
        warn = max(round_up(WARN_FACTOR * top), warn_floor)
        stop = max(round_up(STOP_FACTOR * top), stop_floor, warn)
        proposals.append(Proposal(name, len(finite), top, warn, stop))
    return proposals


def collect(paths: list[Path]) -> dict[str, list[float]]:
    """Every logged value of each gated statistic over all steps of all runs."""
    from r1_ascend.report.run import load_run

    values: dict[str, list[float]] = {}
    for path in paths:
        run = load_run([path], read_dumps=False)
        for name in guard.GATED:
            _, logged = run.series(guard.METRIC_NAMES[name])
            values.setdefault(name, []).extend(logged)
    return values


def yaml_block(proposals: list[Proposal]) -> str:
    lines = ["r1_ascend:", "  rollout_guard:", "    enabled: true"]
    for level in ("warn", "stop"):
        lines.append(f"    {level}:")
        lines += [f"      {p.statistic}: {getattr(p, level):g}" for p in proposals]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from r1_ascend.cli import plain_help

    parser = argparse.ArgumentParser(prog="r1-ascend guard-levels", description=plain_help(__doc__.split("\n\n")[0]))
    parser.add_argument("paths", nargs="+", type=Path, help="healthy runs: log files or run directories")
    parser.add_argument("--min-steps", type=int, default=10, help="fewer healthy steps than this: exit 1")
    parser.add_argument("--yaml", action="store_true", help="also print the levels as a config block")
    args = parser.parse_args(argv)
    missing = [p for p in args.paths if not p.exists()]
    if missing:
        print(f"error: not found: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    proposals = propose(collect(args.paths))
    if not proposals:
        print(
            "error: no rollout_guard/* statistic in these runs: was the guard enabled "
            "(r1_ascend.rollout_guard.enabled) and did a training step finish?",
            file=sys.stderr,
        )
        return 2
    print(f"{'statistic':<18} {'steps':>6} {'healthy max':>12} {'warn':>10} {'stop':>10}")
    for p in proposals:
        print(f"{p.statistic:<18} {p.steps:>6} {p.healthy_max:>12.4g} {p.warn:>10g} {p.stop:>10g}")
    if args.yaml:
        print()
        print(yaml_block(proposals))
    steps = min(p.steps for p in proposals)
    if steps < args.min_steps:
        print(
            f"warning: only {steps} healthy steps; levels from fewer than {args.min_steps} steps can sit inside the "
            "healthy range: measure more steps or seeds before relying on them",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
