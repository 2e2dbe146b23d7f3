"""The rollout guard's statistics on the real model path: healthy runs over seeds and dtypes, and planted faults.

Runs :mod:`r1_ascend.rehearse.guard_calibration` (megatron-core's DeepSeek-V3 actor from the converted checkpoint,
verl's weight export, the CPU rollout engine, a GRPO step per iteration) on the CPU:

- healthy: ``--steps`` steps for every seed in ``--seeds`` and every dtype in ``--dtypes``; per statistic the
  mean, p99 and maximum over all steps;
- faults: every fault of :mod:`r1_ascend.rehearse.rollout_faults` planted at step ``--fault-step`` (healthy steps
  before it; default: the first step after calibration) for every seed; per fault and statistic the value at the
  planted step and its separation, the value divided by the healthy maximum of the same dtype, whether the guard
  warns or stops there at the levels that seed's run has in force then (the shipped settings, or those of
  ``--config``: the absolute levels while calibrating, then those calibrated from the seed's healthy steps before
  the fault), and whether the weight-sync check (``verl_weight_sync_check``) stopped its sync (the step is measured
  either way); a fault the rollout's weight loader refuses is written down as refused, with the loader's message.
  Faults that need more than one rank (``needs``) are left out. Healthy steps are judged as a run judges them
  (calibration, escalation): the steps above a warn level are counted, and per statistic the least warn margin
  (warn level / value) over the gated steps is printed.

    python benchmarks/rollout_guard_bench.py                       # 5 seeds, bf16 and fp32, all faults
    python benchmarks/rollout_guard_bench.py --seeds 0 --dtypes bf16 --faults expert-swap --json out.json
    python benchmarks/rollout_guard_bench.py --faults none --steps 10   # healthy steps only
    python benchmarks/rollout_guard_bench.py --config recipe/config/grpo_qwen25_7b.yaml   # another config's settings

The figures are recorded in docs/rollout_guard.md. The process re-executes itself once with the rehearsal's CPU
site on ``PYTHONPATH`` (the ``torch_npu`` and MindSpeed stand-ins), as every rehearsal process runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _reexec_with_site() -> None:
    """Once: run again with the rehearsal's CPU site first on ``PYTHONPATH`` (its ``sitecustomize`` installs them)."""
    from r1_ascend.rehearse.cluster import SITE, with_site

    if str(SITE) in sys.path:
        return
    sys.exit(subprocess.call([sys.executable, *sys.argv], env=with_site(os.environ)))


def _settings(config_path: Path | None) -> Any:
    """The guard settings to judge with: the shipped ones the rehearsal runs (default) or those of a config file."""
    from omegaconf import OmegaConf

    from r1_ascend.patches.rules import rollout_guard as guard
    from r1_ascend.rehearse.config import guard_config

    return guard_config() if config_path is None else guard.GuardConfig.from_config(OmegaConf.load(config_path))


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    parser.add_argument("--steps", type=int, default=8, help="healthy steps per seed")
    parser.add_argument(
        "--fault-step", type=int, help="the step faults are planted in (default: the first after calibration)"
    )
    parser.add_argument("--faults", nargs="*", help="fault names (default: all; 'none': healthy steps only)")
    parser.add_argument("--fault-seeds", type=int, nargs="+", help="seeds of the fault runs (default: --seeds)")
    parser.add_argument(
        "--fresh",
        nargs="*",
        default=[],
        help="also plant these faults on a loop of their own (no fork), at the first fault seed: the check that a "
        "fault's forked step equals it",
    )
    parser.add_argument("--weights", type=Path, help="the quickstart's converted weights (default: made in a tmp dir)")
    parser.add_argument(
        "--config", type=Path, help="judge with this config's guard settings (default: the shipped ones)"
    )
    parser.add_argument("--json", type=Path, help="write every measured step here")
    args = parser.parse_args(argv)
    _reexec_with_site()

    from r1_ascend.cpu import mcore as mcore_cpu
    from r1_ascend.patches.prelude import apply_once
    from r1_ascend.patches.rules import rollout_guard as guard
    from r1_ascend.rehearse import guard_calibration as gc
    from r1_ascend.rehearse import rollout_faults
    from r1_ascend.rehearse.inputs import converted_weights, make_weights

    apply_once()
    mcore_cpu.install()
    settings = _settings(args.config)
    if args.fault_step is None:
        args.fault_step = settings.calibration.steps + 1
    if args.faults != ["none"] and args.steps < args.fault_step - 1:
        parser.error(f"--steps {args.steps}: the faults of step {args.fault_step} are judged after the healthy steps "
                     f"before it, so --steps must be at least {args.fault_step - 1}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, mcore = converted_weights(args.weights) if args.weights else make_weights(Path(tmp))
        records: list[dict[str, Any]] = []
        healthy: dict[str, dict[str, list[float]]] = {}
        started = time.perf_counter()
        # the faults one rank can carry (the others need a wider actor or rollout: tests/model/weight_check_child.py)
        one_rank = [n for n, f in rollout_faults.FAULTS.items() if f.needs is None]
        names = [] if args.faults == ["none"] else args.faults if args.faults else one_rank
        fault_seeds = args.fault_seeds or args.seeds
        planted: dict[tuple[str, int], Any] = {}
        # one loop per (dtype, seed): the faults (bf16) branch off its healthy steps before --fault-step
        for dtype in dict.fromkeys([*args.dtypes, *(["bf16"] if names else [])]):
            for seed in dict.fromkeys([*args.seeds, *(fault_seeds if dtype == "bf16" else [])]):
                steps = args.steps if dtype in args.dtypes and seed in args.seeds else 0
                here = names if dtype == "bf16" and seed in fault_seeds else []
                run = gc.branched(gc.Setup(hf_dir, mcore, dtype=dtype, seed=seed), steps, here, args.fault_step)
                for result in run.healthy:
                    records.append({"kind": "healthy", "dtype": dtype, "seed": seed, **_record(result)})
                    for name, value in result.values.items():
                        healthy.setdefault(dtype, {}).setdefault(name, []).append(value)
                planted |= {(name, seed): outcome for name, outcome in run.faults.items()}
                print(
                    f"{dtype} seed {seed}: {len(run.healthy)} healthy steps, {len(here)} faults, "
                    f"{time.perf_counter() - started:.0f} s",
                    flush=True,
                )
        for name in args.fresh:
            seed = fault_seeds[0]
            try:
                fresh = _record(gc.planted(gc.Setup(hf_dir, mcore, dtype="bf16", seed=seed), name, args.fault_step)[-1])
            except gc.SyncRefused as refused:
                fresh = {"step": refused.step, "fault": name, "refused": refused.message}
            records.append({"kind": "fresh", "dtype": "bf16", "seed": seed, **fresh})
            print(f"{name} on a loop of its own, seed {seed}: {time.perf_counter() - started:.0f} s", flush=True)
        print()
        for dtype, by_name in healthy.items():
            steps = len(next(iter(by_name.values())))
            print(f"healthy {dtype}: {steps} steps ({len(args.seeds)} seeds x {args.steps})")
            print(f"  {'statistic':<18} {'mean':>10} {'p99':>10} {'max':>10} {'warn x':>8}  (least warn level / value)")
            runs = [[r for r in records if r["kind"] == "healthy" and r["dtype"] == dtype and r["seed"] == seed]
                    for seed in args.seeds]  # fmt: skip
            warned, margins = _replay(runs, settings)
            for name, values in by_name.items():
                margin = f"{margins[name]:.2f}" if name in margins else "-"
                print(
                    f"  {name:<18} {statistics.fmean(values):>10.4g} {_quantile(values, 0.99):>10.4g} "
                    f"{max(values):>10.4g} {margin:>8}"
                )
            print(f"  steps above a warn level (judged as a run judges them): {warned or 'none'}")
        print()
        reference = healthy.get("bf16") or next(iter(healthy.values()), {})
        print(f"faults planted at step {args.fault_step} (bf16); separation = value / healthy bf16 max")
        print(f"  {'fault':<20} {'seed':>4} " + " ".join(f"{n:>22}" for n in guard.GATED) + "  verdict")
        for name in names:
            for seed in fault_seeds:
                before = [r for r in records if r["kind"] == "healthy" and r["dtype"] == "bf16" and r["seed"] == seed]
                levels = levels_before(before, settings, args.fault_step)
                result = planted[name, seed]
                if isinstance(result, gc.SyncRefused):
                    records.append(
                        {
                            "kind": "fault",
                            "dtype": "bf16",
                            "seed": seed,
                            "step": result.step,
                            "fault": name,
                            "refused": result.message,
                        }
                    )
                    print(f"  {name:<20} {seed:>4}  REFUSED by the loader in step {result.step}: {result.message}")
                    continue
                record = {"kind": "fault", "dtype": "bf16", "seed": seed, **_record(result)}
                record["stop_levels"] = dict(levels.stop)
                records.append(record)
                cells = []
                for stat in guard.GATED:
                    value, top = record["values"][stat], max(reference.get(stat, [0.0]))
                    ratio = value / top if top > 0 else math.inf
                    cells.append(f"{value:>10.4g} ({ratio:>7.1f}x)")
                warned, stopped = _judge(record, levels)
                verdict = "STOP " + ",".join(stopped) if stopped else ("warn " + ",".join(warned) if warned else "-")
                verdict += " (calibrated)" if levels.calibrated else " (absolute levels)"
                checked = "weight check: STOP" if record["weight_check"] else "weight check: passed"
                print(
                    f"  {name:<20} {seed:>4} " + " ".join(f"{c:>22}" for c in cells) + f"  {verdict}; {checked}",
                    flush=True,
                )
        print(f"\ntotal {time.perf_counter() - started:.0f} s")
        if args.json:
            args.json.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    return 0


def _record(result: Any) -> dict[str, Any]:
    return {
        "step": result.step,
        "fault": result.fault,
        "reward": result.reward,
        "values": result.values,
        "partials": dataclasses.asdict(result.stats),
        "weight_check": result.weight_check,
    }


def _judge(record: dict[str, Any], levels: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    from r1_ascend.patches.rules import rollout_guard as guard
    from r1_ascend.rehearse.guard_calibration import stats_from_partials

    verdict = guard.Verdict.judge(stats_from_partials(record["partials"]), levels)
    return verdict.warned, verdict.stopped


def levels_before(healthy: list[dict[str, Any]], settings: Any, step: int) -> Any:
    """The levels a run of these healthy records (one seed) has in force at ``step``: the absolute ones while it
    calibrates, then those calibrated from its first steps (r1_ascend.patches.rules.rollout_guard.GuardState)."""
    from r1_ascend.patches.rules import rollout_guard as guard
    from r1_ascend.rehearse.guard_calibration import stats_from_partials

    before = [(r["step"], stats_from_partials(r["partials"])) for r in healthy if r["step"] < step]
    return guard.GuardState.after(sorted(before, key=lambda item: item[0]), settings).levels(settings)


def _replay(runs: list[list[dict[str, Any]]], settings: Any) -> tuple[list[str], dict[str, float]]:
    """Each seed's healthy steps judged in order as a run judges them: the steps that warned or stopped, and per
    statistic the least warn level / value over the gated (calibrated) steps."""
    from r1_ascend.patches.rules import rollout_guard as guard
    from r1_ascend.rehearse.guard_calibration import stats_from_partials

    loud: list[str] = []
    margins: dict[str, float] = {}
    for records in runs:
        state = guard.GuardState()
        for record in sorted(records, key=lambda r: r["step"]):
            where = f"seed {record['seed']} step {record['step']}"
            try:
                verdict = state.judge(stats_from_partials(record["partials"]), settings, step=record["step"],
                                      in_update=False)  # fmt: skip
            except guard.RolloutActorMismatchError:
                loud.append(f"{where}: STOP")
                break
            if verdict.warned:
                loud.append(f"{where}: warn {','.join(verdict.warned)}")
            if verdict.levels.calibrated:
                for name in guard.GATED:
                    value = verdict.values[name]
                    if value > 0:
                        margins[name] = min(margins.get(name, math.inf), verdict.levels.warn[name] / value)
    return loud, margins


if __name__ == "__main__":
    sys.exit(main())
