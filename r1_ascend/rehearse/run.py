"""``r1-ascend rehearse``: the whole run on one CPU machine, then kill it mid-step, resume it, and report on it.

1. inputs: a model directory and parquet from ``r1-ascend prepare-data`` (r1_ascend.rehearse.inputs);
2. cluster: ``scripts/ray_start_npu.sh`` on NODES loopback addresses (127.0.0.2, 127.0.0.3, ...), in a network
   namespace of their own when one can be made, each node advertising NPUS_PER_NODE fake ``NPU`` resources;
3. run 1: the head execs the recipe's real entry point (verl's run_ppo -> TaskRunner -> RayPPOTrainer.fit); once
   the first checkpoint is saved and the next step has started generating, the driver is killed (SIGKILL);
4. run 2: the same driver command on the same cluster; verl resumes from the checkpoint (resume_mode=auto);
5. checks (:func:`r1_ascend.rehearse.verdicts.judge`, pure functions of the logs, records and directories the runs
   left): every node joined, run 2 resumed from the checkpoint before the killed step and ran the remaining steps,
   the checkpoint layout, TensorBoard events, validation metrics, the rollout lifecycle order on every worker, the
   checkpoint each worker loaded, the overlay prelude's summary line of every worker; then ``r1-ascend report`` on
   both logs.

This module holds the command (arguments, the dispatch to a fault scenario, the summary file) and the plain run;
the cluster is :mod:`r1_ascend.rehearse.cluster`, the checks :mod:`r1_ascend.rehearse.verdicts`. Every process it
starts is recorded and stopped by pid (Ctrl-C included): drivers directly, the Ray nodes through
``ray_start_npu.sh stop`` (the pids that script recorded). Wall time and the summed peak RSS of all its processes
are measured (r1_ascend.rehearse.budget) and printed.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from r1_ascend.rehearse import expert_checks, training
from r1_ascend.rehearse.budget import RssSampler
from r1_ascend.rehearse.cluster import kill_mid_step, new_cluster, prepare, relaunch, start_cluster, stop_cluster
from r1_ascend.rehearse.config import Plan
from r1_ascend.rehearse.export import ExportError, export
from r1_ascend.rehearse.faults import FAULTS, MOE_FAULTS, PROCESS_FAULTS, FaultError, plan_for
from r1_ascend.rehearse.lifecycle import LifecycleError
from r1_ascend.rehearse.progress import RehearsalError, log_progress, read_log
from r1_ascend.rehearse.rollout_faults import FAULTS as ROLLOUT_FAULTS
from r1_ascend.rehearse.summary import print_summary
from r1_ascend.rehearse.verdicts import judge, judge_training

DEFAULT_OUT = Path("outputs/rehearse")

#: A Ray log-forwarding prefix naming a node IP, e.g. "(WorkerDict pid=12, ip=127.0.0.3)", colour codes optional.
FORWARDED_WITH_IP = re.compile(r"^(?:\x1b\[\d+m)?\([^()]*\bpid=\d+, ip=[^()]*\)")


def single_copy(log: Path) -> Path:
    """The driver log with each forwarded worker line once.

    The simulated nodes share one host and therefore one Ray session directory, so the log monitor of every node
    forwards every worker line: once plain and once tagged with a node IP. On a real cluster each line arrives once.
    """
    kept = [line for line in read_log(log).splitlines(keepends=True) if not FORWARDED_WITH_IP.match(line)]
    target = log.with_suffix(".console.log")
    target.write_text("".join(kept))
    return target


def run_report(out: Path, logs: list[Path]) -> Path:
    report_dir = out / "report"
    logs = [single_copy(log) for log in logs]
    cmd = [sys.executable, "-m", "r1_ascend.cli", "report", *map(str, logs), str(out / "tensorboard")]
    done = subprocess.run(
        [*cmd, "--out", str(report_dir), "--name", "rehearsal"], capture_output=True, text=True, check=False
    )
    (out / "report.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0 or not (report_dir / "report.md").is_file():
        raise RehearsalError(f"r1-ascend report failed ({done.returncode}); log: {out / 'report.log'}")
    return report_dir / "report.md"


def rehearse(out: Path, plan: Plan, sampler: RssSampler, weights: Path | None = None) -> dict[str, object]:
    launch = prepare(out, plan, weights)
    cluster = new_cluster(out, plan, launch, sampler)
    temp_dir, netns = cluster.temp_dir, cluster.netns
    logs = [out / "run1.log", out / "run2.log"]
    try:
        head = start_cluster(cluster, logs[0])
        log_progress(f"run 1: the head runs the recipe entry point (log {logs[0]})")
        killed_step, killed_pids = kill_mid_step(head, out, plan, logs[0])
        log_progress(f"run 2: relaunching on the same cluster (log {logs[1]})")
        relaunch(cluster, launch, logs[1], timeout=900)
    finally:
        log_progress("stopping the drivers and the Ray nodes (recorded pids)")
        stop_cluster(cluster)
    summary = judge(out, logs, plan, killed_step, killed_pids)
    summary.update(judge_training(out, logs, plan))
    summary["ray_temp_dir"] = temp_dir
    summary["netns"] = netns
    summary["report"] = str(run_report(out, logs))
    final = out / "checkpoints" / f"global_step_{plan.total_steps}"
    log_progress(f"export: convert-weights to-hf {final}, then a strict transformers load and a greedy answer")
    summary["export"] = export(final, out / "exported-hf", out / "export.log")
    return summary


def main(argv: list[str] | None = None) -> int:
    from r1_ascend.cli import plain_help

    parser = argparse.ArgumentParser(prog="r1-ascend rehearse", description=plain_help(__doc__.split("\n\n")[0]))
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT} (replaced)")
    parser.add_argument("--nodes", type=int, default=Plan.nodes, help="simulated nodes (>= 2)")
    parser.add_argument("--npus-per-node", type=int, default=Plan.npus_per_node, help="fake NPUs per node")
    parser.add_argument(
        "--lr",
        type=float,
        default=Plan.lr,
        help=f"the actor's learning rate (default {Plan.lr}); 0 is the control run: the reward must not rise, so the "
        "rise is not required",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=Plan.total_steps,
        help=f"training steps (default {Plan.total_steps}); the kill comes in the step after the checkpoint of step "
        f"STEPS // 2. The reward's rise is judged only at {Plan.total_steps} or more: fewer steps check the loop, "
        "the kill and the resume, not learning",
    )
    parser.add_argument(
        "--weights",
        type=Path,
        help="the quickstart's converted checkpoint to start from (outputs/quickstart/weights: hf-bf16/ and mcore/); "
        "default: convert one under the output directory",
    )
    parser.add_argument(
        "--seed", type=int, help="seed of the data order, the actor and the rollout sampling (default: the configs')"
    )
    parser.add_argument(
        "--guard-levels",
        choices=("cpu", "config"),
        default="cpu",
        help="the rollout guard's levels: measured for this CPU rehearsal (default), or the smoke config's NPU "
        "levels, to measure healthy runs with for r1-ascend guard-levels",
    )
    parser.add_argument(
        "--fault",
        choices=(*FAULTS, *PROCESS_FAULTS, *MOE_FAULTS),
        help="plant one checkpoint or process fault in a shorter run (2 or 3 steps) and check the run stops clearly "
        "within its bound, leaves no process, and resumes from the last complete checkpoint; or a MoE fault "
        "(dead-expert, stale-bias) the expert verdicts must catch (docs/launch.md, Faults)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the interrupted rehearsal in --output-dir on fresh nodes (nothing is deleted); Hydra overrides "
        "may follow, e.g. the trainer.resume_from_path=... a refused resume printed",
    )
    parser.add_argument(
        "--rollout-fault",
        choices=sorted(name for name, fault in ROLLOUT_FAULTS.items() if not fault.persistent),
        help="plant a rollout fault in the engine's second weight sync of a 2-step run; the rollout guard must stop "
        "the run in that step (docs/rollout_guard.md)",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="with --resume: Hydra overrides for the relaunch; with --fault: for both launches (key=value, e.g. "
        "r1_ascend.watchdog.enabled=false)",
    )
    args = parser.parse_args(argv)
    if args.nodes < 2 or args.npus_per_node < 1:
        parser.error("--nodes must be >= 2 and --npus-per-node >= 1")
    if args.lr < 0:
        parser.error("--lr must be >= 0")
    if args.steps < 2:
        parser.error("--steps must be >= 2: a checkpoint, then a step the driver is killed in")
    if args.steps != Plan.total_steps and (args.resume or args.fault or args.rollout_fault):
        parser.error("--steps sets a plain rehearsal's length; --resume and the fault runs have their own")
    if args.overrides and not (args.resume or args.fault):
        parser.error("overrides (key=value) are only taken with --resume or --fault")
    if args.resume and (args.fault or args.rollout_fault):
        parser.error("--resume continues a rehearsal; it plants no fault")
    if args.fault and args.rollout_fault:
        parser.error("plant one fault per run: --fault or --rollout-fault")
    rise = Plan.min_reward_rise if args.lr > 0 and args.steps >= Plan.total_steps else None
    half = max(1, args.steps // 2)
    plan = Plan(
        total_steps=args.steps,
        save_freq=half,
        test_freq=half,
        nodes=args.nodes,
        npus_per_node=args.npus_per_node,
        lr=args.lr,
        min_reward_rise=rise,
        seed=args.seed,
        guard_levels=args.guard_levels,
        overrides=tuple(args.overrides) if args.fault else (),
    )
    out = args.output_dir.resolve()
    weights = args.weights.resolve() if args.weights else None
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    # Ctrl-C must stop what the rehearsal starts even when its parent ignored SIGINT (a background job of a
    # non-interactive shell, a test runner's worker): a process inherits that and Python keeps it ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    start = time.monotonic()
    with RssSampler() as sampler:
        try:
            if args.resume:
                from r1_ascend.rehearse.resume import print_resume_summary as show
                from r1_ascend.rehearse.resume import resume_rehearsal

                summary = resume_rehearsal(out, args.overrides, sampler)
            elif args.rollout_fault:
                from r1_ascend.rehearse.rollout_fault_run import plan_for as rollout_plan
                from r1_ascend.rehearse.rollout_fault_run import print_rollout_fault_summary as show
                from r1_ascend.rehearse.rollout_fault_run import rehearse_rollout_fault

                plan = rollout_plan(args.rollout_fault, plan)
                summary = rehearse_rollout_fault(out, args.rollout_fault, plan, sampler, weights)
            elif args.fault in MOE_FAULTS:
                from r1_ascend.rehearse.moe_fault_run import plan_for as moe_plan
                from r1_ascend.rehearse.moe_fault_run import print_moe_fault_summary as show
                from r1_ascend.rehearse.moe_fault_run import rehearse_moe_fault

                plan = moe_plan(args.fault, plan)
                summary = rehearse_moe_fault(out, args.fault, plan, sampler, weights)
            elif args.fault:
                from r1_ascend.rehearse.fault_run import print_fault_summary as show
                from r1_ascend.rehearse.fault_run import rehearse_fault

                summary = rehearse_fault(out, args.fault, plan_for(args.fault, plan), sampler, weights)
            else:
                show = print_summary
                summary = rehearse(out, plan, sampler, weights)
        except (LifecycleError, FaultError, expert_checks.ExpertLoadError) as exc:
            print(f"rehearse: failed: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("rehearse: interrupted; everything it started has been stopped", file=sys.stderr)
            return 130
        except (RehearsalError, training.TrainingError, ExportError) as exc:
            print(f"rehearse: failed: {exc}", file=sys.stderr)
            return 1
    summary["wall_s"] = round(time.monotonic() - start, 1)
    summary["peak_rss_gib"] = round(sampler.summed_peak_bytes() / 1024**3, 2)
    summary["concurrent_peak_rss_gib"] = round(sampler.concurrent_peak / 1024**3, 2)
    summary["concurrent_peak_pss_gib"] = round(sampler.concurrent_peak_pss / 1024**3, 2)
    summary["processes_sampled"] = sampler.process_count()
    summary["rss_by_process"] = sampler.breakdown()
    variant = "resume" if args.resume else (args.fault or args.rollout_fault)
    name = f"summary-{variant}.json" if variant else "summary.json"
    (out / name).write_text(json.dumps(summary, indent=2) + "\n")
    show(summary)
    return 0
