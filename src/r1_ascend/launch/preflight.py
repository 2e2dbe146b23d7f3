"""``r1-ascend preflight``: resolve a run configuration and check it before taking the cluster.

Composes the chosen overlay with Hydra (plus ``key=value`` overrides, exactly as the run script passes them) and
checks cluster size, parallel layouts, batch divisibility, rollout engine settings, model config, data schema,
checkpoint, patches and a per-die memory estimate, then runs the stack's own validation on the result: verl's
``validate_config``, dataclass conversions and reward loader, vLLM's argument checks, Megatron's head rules.
Prints the plan and one line per check (ok, warn, FAIL, or skip with the reason); exits 1 on any error, and with
``--strict`` on any warning (a run that would go on but learn nothing, waste compute or hit a known bug). Imports no
torch, verl or vLLM (their config code is loaded from source), so it answers in seconds on a login node.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence

from r1_ascend import envs
from r1_ascend.launch.checks import CHECKS, ERROR, OK, SKIPPED, WARNING, Finding, Run, prepare
from r1_ascend.launch.memory import A3_DIE_MEMORY_GB, GIB
from r1_ascend.launch.overlays import DEFAULT_OVERLAY, OverlayError, compose, overlay_names
from r1_ascend.launch.units import human_count, plural

#: Environment variables the checks read (docs/environment.md).
ENV_KEYS = (envs.NNODES, envs.NPUS_PER_NODE, "VLLM_DP_SIZE")


def run_checks(
    config_name: str,
    overrides: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    device_memory_gb: float = A3_DIE_MEMORY_GB,
    check_patches: bool = True,
) -> tuple[Run, list[Finding]]:
    """Compose ``config_name`` + ``overrides`` and run every check (raises OverlayError if it cannot compose)."""
    config = compose(config_name, overrides)
    environment = dict(os.environ if env is None else env)
    run = Run(
        config,
        {k: environment[k] for k in ENV_KEYS if k in environment},
        device_memory_gb * 1e9,
        full_env=environment,
        check_patches=check_patches,
        config_name=config_name,
    )
    prepare(run)
    from r1_ascend.launch.group_routing import ROUTING_CHECKS
    from r1_ascend.launch.pitfalls import check_pitfalls
    from r1_ascend.launch.upstream_checks import UPSTREAM_CHECKS

    findings: list[Finding] = []
    for check in (*CHECKS, *ROUTING_CHECKS, *UPSTREAM_CHECKS, check_pitfalls):
        findings.extend(check(run))
    return run, findings


def format_plan(run: Run) -> list[str]:
    cfg = run.config
    rollout = cfg.actor_rollout_ref.rollout
    megatron = cfg.actor_rollout_ref.actor.megatron
    rows = [
        (
            "cluster",
            f"{plural(cfg.trainer.nnodes, 'node')} x {plural(cfg.trainer.n_gpus_per_node, 'NPU')} = "
            f"{plural(run.world, 'die')} (device {cfg.trainer.device})",
        )
    ]
    model = run.model
    if model is not None:
        experts = f"{model.num_experts} experts, {model.num_dense_layers} dense layers" if model.is_moe else "dense"
        shape = f"{model.num_layers} layers, {experts}, {human_count(model.total_params())} params"
        rows.append(
            (
                "model",
                f"{model.model_type} at {model.path}: {shape}, max_position_embeddings {model.max_position_embeddings}",
            )
        )
    train = run.train
    if train is not None:
        split = f"; stages {run.stages}" if run.stages else ""
        offload = "/".join(_onoff(megatron[key]) for key in ("param_offload", "grad_offload", "optimizer_offload"))
        swap = _onoff(megatron.override_transformer_config.get("swap_optimizer", False))
        parallel = f"TP{train.tp} PP{train.pp} EP{train.ep} CP{train.cp} -> DP {train.dp}, expert DP {train.expert_dp}"
        rows.append(("actor+ref", f"{parallel}{split}; offload param/grad/optimizer {offload}, swap optimizer {swap}"))
    if run.rollout is not None:
        engine = f"vLLM TP{run.rollout.tp} x DP{run.rollout.dp} (VLLM_DP_SIZE={run.rollout.dp}) -> EP {run.rollout.ep}"
        limits = f"max_num_seqs {rollout.max_num_seqs}, max_num_batched_tokens {rollout.max_num_batched_tokens}"
        rows.append(("rollout", f"{engine}; {limits}, mode {rollout.mode}"))
    lengths = f"prompt {cfg.data.max_prompt_length} + response {cfg.data.max_response_length} tokens"
    steps = f"{cfg.trainer.total_training_steps} steps"
    rows.append(("batch", f"{cfg.data.train_batch_size} prompts x {rollout.n} samples, {lengths}, {steps}"))
    return ["Plan", *(f"  {label:<9} {text}" for label, text in rows)]


def format_guard(run: Run) -> list[str]:
    """The rollout guard's levels in force for this config: the absolute caps, calibration, factors, floors and
    escalation (docs/rollout_guard.md "Levels")."""
    from r1_ascend.patches.rules.rollout_guard import CONFIG_KEY, GuardConfig, RolloutGuardConfigError
    from r1_ascend.patches.rules.switches import read_switches

    title = f"Rollout guard ({CONFIG_KEY}; docs/rollout_guard.md)"
    switches = read_switches(run.full_env, strict=False)
    engine = (
        "engine model config: compared with the actor's when the engine is built (patch verl_rollout_model_config)"
        if switches.enabled("verl_rollout_model_config")
        else "engine model config: not compared (patch verl_rollout_model_config is disabled)"
    )
    if not switches.enabled("verl_rollout_guard"):
        return [title, "  off: patch verl_rollout_guard is disabled (R1_ASCEND_DISABLE)", f"  {engine}"]
    try:
        settings = GuardConfig.from_config(run.config)
    except RolloutGuardConfigError:
        return [title, "  not read: its settings are refused (see check rollout_engine below)", f"  {engine}"]
    return [title, *(f"  {line}" for line in settings.describe()), f"  {engine}"]


def format_memory(run: Run) -> list[str]:
    if not run.memory:
        return []
    lines = [f"Memory per die (GiB, estimate; die = {run.die_bytes / 1e9:.0f} GB assumed, see docs/launch.md)"]
    for phase in run.memory:
        lines.append(f"  {phase.phase}")
        width = max(len(item) for item, _ in phase.rows)
        for item, value in phase.rows:
            lines.append(f"    {item:<{width}}  {value / GIB:7.1f}")
        budget = f"of {phase.budget_bytes / GIB:.1f} ({phase.budget_label})"
        lines.append(f"    {'total':<{width}}  {phase.total / GIB:7.1f}   {budget}")
    return lines


def format_findings(findings: Sequence[Finding]) -> list[str]:
    marks = {ERROR: "FAIL", WARNING: "warn", OK: "ok  ", SKIPPED: "skip"}
    return ["Checks", *(f"  [{marks[f.level]}] {f.check}: {f.message}" for f in findings)]


def _onoff(value: object) -> str:
    return "on" if value else "off"


def main(argv: list[str] | None = None) -> int:
    from r1_ascend.cli import plain_help

    parser = argparse.ArgumentParser(prog="r1-ascend preflight", description=plain_help(__doc__))
    parser.add_argument(
        "--config",
        default=envs.run_config(DEFAULT_OVERLAY),
        help=f"run configuration in recipe/config (default: $R1_ASCEND_CONFIG or {DEFAULT_OVERLAY})",
    )
    parser.add_argument(
        "--device-memory-gb",
        type=float,
        default=A3_DIE_MEMORY_GB,
        help=f"device memory of one NPU die in GB (default {A3_DIE_MEMORY_GB:g}, Atlas 800T A3)",
    )
    parser.add_argument("--skip-patches", action="store_true", help="do not check the patch targets (no stack here)")
    parser.add_argument(
        "--strict", action="store_true", help="fail on warnings too (a run that would go on but waste the cluster)"
    )
    parser.add_argument("--list", action="store_true", help="list the run configurations and exit")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. trainer.nnodes=2 (as for the recipe)")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(overlay_names()))
        return 0
    start = time.monotonic()
    try:
        run, findings = run_checks(
            args.config, args.overrides, device_memory_gb=args.device_memory_gb, check_patches=not args.skip_patches
        )
    except OverlayError as exc:
        print(f"preflight: {exc}", file=sys.stderr)
        return 1
    extra = f" with {len(args.overrides)} override(s)" if args.overrides else ""
    print(f"r1-ascend preflight: {args.config}{extra}")
    for line in (*format_plan(run), *format_guard(run), *format_memory(run), *format_findings(findings)):
        print(line)
    errors = [f for f in findings if f.level == ERROR]
    warnings = [f for f in findings if f.level == WARNING]
    elapsed = time.monotonic() - start
    if errors or (args.strict and warnings):
        strict = " (--strict: warnings fail)" if args.strict and warnings else ""
        print(
            f"preflight: {len(errors)} error(s), {len(warnings)} warning(s){strict} in {elapsed:.1f} s", file=sys.stderr
        )
        return 1
    if warnings:
        names = ", ".join(dict.fromkeys(f.check for f in warnings))
        print(
            f"preflight: passed with {len(warnings)} warning(s) ({names}) in {elapsed:.1f} s; the run would go on "
            "with them (--strict fails on them)"
        )
        return 0
    print(f"preflight: passed (0 warnings) in {elapsed:.1f} s")
    return 0
