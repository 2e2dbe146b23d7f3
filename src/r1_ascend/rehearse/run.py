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

This module holds the command: its arguments, the scenario they name and the summary file. The runner and the
scenarios are :mod:`r1_ascend.rehearse.scenarios`, the cluster :mod:`r1_ascend.rehearse.cluster`, the checks
:mod:`r1_ascend.rehearse.verdicts`. Every process a scenario starts is recorded and stopped by pid (Ctrl-C
included): drivers directly, the Ray nodes through ``ray_start_npu.sh stop`` (the pids that script recorded). Wall
time and the summed peak RSS of all its processes are measured (r1_ascend.rehearse.budget) and printed.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from r1_ascend.rehearse.config import Plan
from r1_ascend.rehearse.faults import FAULTS, MOE_FAULTS, PROCESS_FAULTS
from r1_ascend.rehearse.progress import RehearsalError
from r1_ascend.rehearse.rollout_faults import FAULTS as ROLLOUT_FAULTS

if TYPE_CHECKING:  # the runner and the verdicts are imported once the arguments parsed: `--help` stays cheap
    from r1_ascend.rehearse.budget import RssSampler
    from r1_ascend.rehearse.scenarios import Scenario

DEFAULT_OUT = Path("outputs/rehearse")


def rehearse(
    out: Path, plan: Plan, sampler: RssSampler, weights: Path | None = None, scenario: Scenario | None = None
) -> dict[str, object]:
    """Run ``scenario`` (default: the plain rehearsal) from the base ``plan``: its summary."""
    from r1_ascend.rehearse.scenarios import PLAIN, run_scenario

    return run_scenario(scenario or PLAIN, out, plan, sampler, weights)


def main(argv: list[str] | None = None) -> int:
    from r1_ascend.cli import plain_help

    parser = argparse.ArgumentParser(prog="r1-ascend rehearse", description=plain_help(__doc__.split("\n\n")[0]))
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT} (replaced)")
    parser.add_argument("--nodes", type=int, default=Plan.nodes, help="simulated nodes (>= 2)")
    parser.add_argument("--npus-per-node", type=int, default=Plan.npus_per_node, help="fake NPUs per node")
    parser.add_argument(
        "--actor-pp",
        type=int,
        default=Plan.actor_pp,
        help="the actor's pipeline stages (megatron-core PP over gloo, verl's export across the stages); e.g. 2 with "
        "--npus-per-node 2",
    )
    parser.add_argument(
        "--rollout-dp",
        type=int,
        default=Plan.rollout_dp,
        help="the rollout's data-parallel engines (TP = the world / DP, EP over every rank; the overlay's "
        "vllm_dp_ep_groups builds vLLM's DP and EP groups); e.g. 2 with --npus-per-node 2",
    )
    parser.add_argument(
        "--lr",
        type=float,
        default=Plan.lr,
        help=f"the actor's learning rate (default {Plan.lr}); 0 is the updates-off control: one launch with nothing "
        "killed, and the reward must not rise",
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
        "--shuffle-rewards",
        action="store_true",
        help="the reward control: each training batch's rewards permuted across its responses, one launch with "
        "nothing killed; the reward must not rise (with --lr 0 the other control, whose updates are off)",
    )
    parser.add_argument(
        "--rollout-fault",
        # stale-stage is planted in the actor's export by a PP >= 2 harness, not in the engine's sync
        choices=sorted(n for n, f in ROLLOUT_FAULTS.items() if not f.persistent and n != "stale-stage"),
        help="plant a rollout fault in the engine's second weight sync of a 2-step run; the weight-sync check (a "
        "weight or layout fault) or the rollout guard must stop the run there (docs/rollout_guard.md)",
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
    world = args.nodes * args.npus_per_node
    if args.actor_pp < 1 or world % args.actor_pp or (world // args.actor_pp) % Plan.actor_ep:
        parser.error(
            f"--actor-pp {args.actor_pp}: the world of {world} ranks divided by the pipeline stages must be a multiple "
            f"of the actor's EP ({Plan.actor_ep}); e.g. --actor-pp 2 with --npus-per-node 2"
        )
    if args.rollout_dp < 1 or world % args.rollout_dp:
        parser.error(f"--rollout-dp {args.rollout_dp} must divide the world of {world} ranks (TP = world / DP)")
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
    control = "shuffled-rewards" if args.shuffle_rewards else "lr0" if args.lr == 0 else None
    if args.shuffle_rewards and args.lr == 0:
        parser.error("one control per run: --lr 0 or --shuffle-rewards")
    if control and (args.resume or args.fault or args.rollout_fault):
        parser.error("a control run (--lr 0, --shuffle-rewards) plants no fault and resumes nothing")
    rise = Plan.min_reward_rise if control is None and args.steps >= Plan.total_steps else None
    half = max(1, args.steps // 2)
    plan = Plan(
        total_steps=args.steps,
        save_freq=half,
        test_freq=half,
        nodes=args.nodes,
        npus_per_node=args.npus_per_node,
        actor_pp=args.actor_pp,
        rollout_dp=args.rollout_dp,
        lr=args.lr,
        min_reward_rise=rise,
        seed=args.seed,
        shuffle_rewards=args.shuffle_rewards,
        overrides=tuple(args.overrides) if args.fault else (),
    )
    from r1_ascend.rehearse import expert_checks, training
    from r1_ascend.rehearse.budget import RssSampler
    from r1_ascend.rehearse.export import ExportError
    from r1_ascend.rehearse.faults import FaultError
    from r1_ascend.rehearse.lifecycle import LifecycleError
    from r1_ascend.rehearse.scenarios import scenario_for

    scenario = scenario_for(
        fault=args.fault,
        rollout_fault=args.rollout_fault,
        resume_with=args.overrides if args.resume else None,
        control=control,
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
            summary = rehearse(out, plan, sampler, weights, scenario)
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
    name = f"summary-{scenario.variant}.json" if scenario.variant else "summary.json"
    (out / name).write_text(json.dumps(summary, indent=2) + "\n")
    scenario.show(summary)
    return 0
