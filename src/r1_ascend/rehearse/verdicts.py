"""The rehearsal's verdicts: pure functions of what a run left behind (its logs, the workers' lifecycle records, the
checkpoint and TensorBoard directories). Each raises on the first failure with what was expected and where to look."""

from __future__ import annotations

import re
from pathlib import Path

from r1_ascend.rehearse import expert_checks, training
from r1_ascend.rehearse.config import Plan, node_ip
from r1_ascend.rehearse.lifecycle import (
    LifecycleError,
    check_checkpoint_loads,
    check_lifecycle,
    check_preludes,
    read_lifecycle,
)
from r1_ascend.rehearse.progress import RehearsalError, read_log

STEP_LINE = re.compile(r"\bstep:(\d+) - ")
RESUME_LINE = re.compile(r"Load from checkpoint folder: \S*global_step_(\d+)")
READY_LINE = re.compile(r"ray cluster ready: (.*); NPU total (\S+)")


def check_joined(head_text: str, plan: Plan, log: Path) -> tuple[str, float]:
    """Every simulated node joined with its NPUs: the head's ``ray cluster ready`` line names them all.

    Returns the nodes as listed by the line and the NPU total."""
    ready = READY_LINE.search(head_text)
    if not ready:
        raise RehearsalError(f"the head never reported a ready cluster ('ray cluster ready: ...'); log: {log}")
    joined, total = ready.group(1), float(ready.group(2))
    expected = ", ".join(f"{node_ip(i)} ({plan.npus_per_node} NPU)" for i in range(plan.nodes))
    if set(joined.split(", ")) != set(expected.split(", ")) or total != plan.world:
        raise RehearsalError(
            f"the cluster that joined is {joined} ({total:g} NPUs), expected {expected} ({plan.world} NPUs); log: {log}"
        )
    return joined, total


def check_resume(
    texts: list[str], logs: list[Path], plan: Plan, killed_step: int, expected_from: int | None = None
) -> tuple[list[list[int]], int]:
    """Run 1 started fresh and was killed in ``killed_step``; run 2 loaded the checkpoint of the step before it
    (or of ``expected_from``: the last complete one) and ran every remaining step once. Returns the steps each run
    logged and the step run 2 resumed from."""
    steps = [sorted({int(s) for s in STEP_LINE.findall(t)}) for t in texts]
    if not steps[0] or steps[0] != list(range(1, steps[0][-1] + 1)):
        raise RehearsalError(f"run 1 logged steps {steps[0]}, expected 1, 2, ... from a fresh start; log: {logs[0]}")
    if max(steps[0], default=0) >= killed_step:
        raise RehearsalError(f"run 1 finished step {killed_step}, it was meant to be killed in it; log: {logs[0]}")
    expected = killed_step - 1 if expected_from is None else expected_from
    why = f"the last checkpoint before the kill in step {killed_step}"
    return [steps[0], check_resumed(texts[1], logs[1], plan, expected, why)], expected


def check_resumed(text: str, log: Path, plan: Plan, expected: int, why: str) -> list[int]:
    """A relaunched run loaded ``global_step_<expected>`` (0: none, no checkpoint was saved) and ran every remaining
    step once; returns its steps."""
    steps = sorted({int(s) for s in STEP_LINE.findall(text)})
    resumed = RESUME_LINE.findall(text)
    if expected == 0 and resumed:
        raise RehearsalError(
            f"the relaunched run resumed from global_step_{resumed[-1]}, but no checkpoint was saved before; log: {log}"
        )
    if expected and not resumed:
        raise RehearsalError(
            f"the relaunched run did not resume from a checkpoint (no 'Load from checkpoint folder: ...global_step_N' "
            f"line; it logged steps {steps}); log: {log}"
        )
    resumed_from = int(resumed[-1]) if resumed else 0
    if resumed_from != expected:
        raise RehearsalError(
            f"the relaunched run resumed from global_step_{resumed_from}, expected global_step_{expected} "
            f"({why}); log: {log}"
        )
    expected_after = list(range(resumed_from + 1, plan.total_steps + 1))
    if steps != expected_after:
        raise RehearsalError(f"the resumed run logged steps {steps}, expected {expected_after}; log: {log}")
    return steps


def check_checkpoint(checkpoints: Path, step: int, world: int) -> None:
    """``global_step_<step>`` holds the trainer's ``data.pt`` and verl's Megatron dist checkpoint of the actor
    (``actor/dist_ckpt``: metadata, the common state and a ``__<rank>_*.distcp`` shard file from every rank)."""
    layout = checkpoints / f"global_step_{step}"
    dist_ckpt = layout / "actor" / "dist_ckpt"
    for needed in (layout / "data.pt", dist_ckpt / "metadata.json", dist_ckpt / ".metadata", dist_ckpt / "common.pt"):
        if not needed.is_file():
            raise RehearsalError(f"checkpoint layout: {needed} is missing (expected data.pt and a dist checkpoint)")
    for rank in range(world):
        if not list(dist_ckpt.glob(f"__{rank}_*.distcp")):
            raise RehearsalError(f"checkpoint layout: rank {rank} wrote no shard (__{rank}_*.distcp) in {dist_ckpt}")


def check_tensorboard(directory: Path) -> int:
    """At least one TensorBoard event file; returns how many."""
    events = list(directory.rglob("events.out.tfevents.*"))
    if not events:
        raise RehearsalError(f"no TensorBoard event file (events.out.tfevents.*) under {directory}")
    return len(events)


def check_validation(texts: list[str], logs: list[Path]) -> None:
    """verl's validation ran: its ``val-core/...`` metrics are in a step line of one of the run logs."""
    if "val-core/" not in "".join(texts):
        raise RehearsalError(f"no validation metrics (val-core/...) in the run logs: {', '.join(map(str, logs))}")


def summarise(
    out: Path, logs: list[Path], plan: Plan, killed_step: int, expected_from: int | None = None
) -> dict[str, object]:
    texts = [read_log(p) for p in logs]
    joined, npus = check_joined(texts[0], plan, logs[0])
    steps, resumed_from = check_resume(texts, logs, plan, killed_step, expected_from)
    # the checkpoint run 2 resumed from, unless the plan keeps fewer checkpoints than it saves: then the last one
    check_checkpoint(
        out / "checkpoints", resumed_from if plan.max_ckpt_to_keep is None else plan.total_steps, plan.world
    )
    check_tensorboard(out / "tensorboard")
    check_validation(texts, logs)
    return {
        "nodes_joined": joined,
        "npus_seen": npus,
        "steps_run": {"run 1 (killed)": steps[0], "run 2 (resumed)": steps[1]},
        "killed_in_step": killed_step,
        "resumed_from_step": resumed_from,
    }


def judge_training(out: Path, logs: list[Path], plan: Plan) -> dict[str, object]:
    """What the run learned (r1_ascend.rehearse.training) and which model it trained (the workers' records)."""
    metrics = training.step_metrics(logs)
    training.check_finite(metrics, logs)
    training.check_gradients(metrics)
    training.check_guard_quiet(metrics)
    curve = training.reward_curve(metrics)
    if plan.min_reward_rise is not None:
        training.check_learning(curve, plan.min_reward_rise)
        training.check_learning_holds(curve)
    events = read_lifecycle(out / "lifecycle")
    try:
        moe = expert_checks.judge(events)
    except expert_checks.ExpertLoadError as exc:
        raise expert_checks.ExpertLoadError(f"{exc}; records: {out / 'lifecycle'}") from exc
    return {
        "model": model_summary(events),
        "moe": moe,
        "reward": {"first": round(curve.first, 3), "last": round(curve.last, 3), "window": curve.window},
        "reward_curve": {step: round(value, 4) for step, value in curve.rewards.items()},
        "rollout_actor_gap_max": training.max_gap(metrics),
    }


def model_summary(events: list[dict[str, object]]) -> dict[str, object]:
    """The actor's model class, its parameters (summed over one expert-parallel group) and layout, from the
    workers' ``model`` records."""
    models = [e for e in events if e.get("event") == "model"]
    if not models:
        raise RehearsalError("no worker recorded the model it built (stand-ins not installed?)")
    first = models[0]
    per_ep_rank = {int(e["ep_rank"]): int(e["parameters"]) for e in models if e["cls"] == first["cls"]}
    return {
        "class": first["cls"],
        "parameters_per_rank": sorted(set(per_ep_rank.values())),
        "layout": {key: first[key] for key in ("tp", "ep", "pp", "dp")},
    }


def judge(
    out: Path, logs: list[Path], plan: Plan, killed_step: int, killed_pids: set[int], expected_from: int | None = None
) -> dict[str, object]:
    """Every verdict on a finished rehearsal, from what it left under ``out``; raises on the first that fails.

    ``killed_pids``: the processes that had written a lifecycle record when the driver of run 1 was killed;
    ``expected_from``: the step run 2 must resume from (default: the one before ``killed_step``)."""
    summary = summarise(out, logs, plan, killed_step, expected_from)
    events = read_lifecycle(out / "lifecycle")
    try:
        summary["lifecycle"] = check_lifecycle(events, killed_pids, workers_per_run=plan.world)
        summary["checkpoint_loads"] = check_checkpoint_loads(events, killed_pids, summary["resumed_from_step"])
        summary["preludes"] = check_preludes([read_log(p) for p in logs], events)
    except LifecycleError as exc:
        raise LifecycleError(f"{exc}; records: {out / 'lifecycle'}, logs: {logs[0]}, {logs[1]}") from exc
    return summary
