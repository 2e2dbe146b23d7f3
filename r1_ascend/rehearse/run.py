"""``r1-ascend rehearse``: the whole run on one CPU machine, then kill it mid-step, resume it, and report on it.

1. inputs: a model directory and parquet from ``r1-ascend prepare-data`` (r1_ascend.rehearse.inputs);
2. cluster: ``scripts/ray_start_npu.sh`` on NODES loopback addresses (127.0.0.2, 127.0.0.3, ...), in a network
   namespace of their own when one can be made, each node advertising NPUS_PER_NODE fake ``NPU`` resources;
3. run 1: the head execs the recipe's real entry point (verl's run_ppo -> TaskRunner -> RayPPOTrainer.fit); once
   the first checkpoint is saved and the next step has started generating, the driver is killed (SIGKILL);
4. run 2: the same driver command on the same cluster; verl resumes from the checkpoint (resume_mode=auto);
5. checks (:func:`judge`, pure functions of the logs, records and directories the runs left): every node joined,
   run 2 resumed from the checkpoint before the killed step and ran the remaining steps, the checkpoint layout,
   TensorBoard events, validation metrics, the rollout lifecycle order on every worker, the checkpoint each worker
   loaded, the overlay prelude's summary line of every worker; then ``r1-ascend report`` on both logs.

Every process it starts is recorded and stopped by pid (Ctrl-C included): drivers directly, the Ray nodes through
``ray_start_npu.sh stop`` (the pids that script recorded). Wall time and the summed peak RSS of all its processes
are measured (r1_ascend.rehearse.budget) and printed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from r1_ascend.ports import unused_local_port
from r1_ascend.rehearse import expert_checks, training
from r1_ascend.rehearse.budget import RssSampler
from r1_ascend.rehearse.config import Plan, driver_command, node_ip
from r1_ascend.rehearse.export import ExportError, export
from r1_ascend.rehearse.faults import FAULTS, MOE_FAULTS, PROCESS_FAULTS, FaultError, plan_for
from r1_ascend.rehearse.inputs import make_inputs
from r1_ascend.rehearse.lifecycle import (
    LifecycleError,
    check_checkpoint_loads,
    check_lifecycle,
    check_preludes,
    read_lifecycle,
)
from r1_ascend.rehearse.rollout_faults import FAULTS as ROLLOUT_FAULTS

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "ray_start_npu.sh"
SITE = Path(__file__).resolve().parent / "site"
DEFAULT_OUT = Path("outputs/rehearse")


class RehearsalError(RuntimeError):
    """A stage of the rehearsal failed; the message says which and where its log is."""


def log_progress(message: str) -> None:
    """A progress line on stdout. Once the reader has gone (``rehearse ... | head``, a closed terminal), lines are
    dropped rather than raised: a BrokenPipeError here ended the cleanup that stops the Ray nodes."""
    try:
        print(f"[rehearse {time.strftime('%H:%M:%S')}] {message}", flush=True)
    except BrokenPipeError:
        # what Python's docs advise for SIGPIPE: point stdout at /dev/null, so no later write or the exit flush raises
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


@dataclass
class Cluster:
    """The simulated nodes: their environments, the namespace prefix, and what was started."""

    out: Path
    plan: Plan
    prefix: list[str]
    netns: str | None
    envs: list[dict[str, str]] = field(default_factory=list)
    temp_dir: str = ""
    drivers: list[subprocess.Popen] = field(default_factory=list)
    began: float = field(default_factory=time.time)  # seconds since the epoch, before any process was started

    @property
    def head_ip(self) -> str:
        return node_ip(0)

    def address(self) -> str:
        return f"{self.head_ip}:{self.envs[0]['RAY_PORT']}"


def make_netns() -> tuple[list[str], str | None]:
    """A loopback-only network namespace (prefix, name), or ([], None) where none can be made."""
    if shutil.which("ip") is None:
        return [], None
    name = f"r1rh-{uuid.uuid4().hex[:8]}"
    if subprocess.run(["ip", "netns", "add", name], capture_output=True, check=False).returncode != 0:
        return [], None
    prefix = ["ip", "netns", "exec", name]
    subprocess.run([*prefix, "ip", "link", "set", "lo", "up"], check=True, capture_output=True)
    return prefix, name


def node_dir(out: Path, ip: str) -> Path:
    """A simulated node's run directory (its ``R1_ASCEND_RUN_DIR``: pid files and Ray start logs)."""
    return out / "nodes" / ip


def node_pid_files(cluster: Cluster) -> tuple[Path, ...]:
    """The pid files ``ray_start_npu.sh`` writes for each node's ``ray start --block`` (head first)."""
    roles = ["head"] + ["worker"] * (cluster.plan.nodes - 1)
    ips = [node_ip(i) for i in range(cluster.plan.nodes)]
    return tuple(node_dir(cluster.out, ip) / f"ray-{role}-{ip}.pid" for role, ip in zip(roles, ips, strict=True))


def node_envs(out: Path, plan: Plan, launch: Path) -> tuple[list[dict[str, str]], str]:
    """The environment of ``ray_start_npu.sh`` on each node (head first)."""
    ray_wrapper = out / "bin" / "ray"  # Ray of this interpreter (console scripts may point at another venv)
    ray_wrapper.parent.mkdir(parents=True, exist_ok=True)
    ray_wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m ray.scripts.scripts "$@"\n')
    ray_wrapper.chmod(0o755)
    temp_dir = f"/tmp/r1rh-{uuid.uuid4().hex[:8]}"  # short: Ray's socket paths must stay under 108 bytes
    port = unused_local_port()
    base = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PYTHON": sys.executable,
        "RAY": str(ray_wrapper),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SITE), os.environ.get("PYTHONPATH", "")])),
        "NNODES": str(plan.nodes),
        "NPUS_PER_NODE": str(plan.npus_per_node),
        "MASTER_ADDR": node_ip(0),
        "RAY_PORT": str(port),
        "RAY_NUM_CPUS": "2",
        "RAY_TEMP_DIR": temp_dir,
        "RAY_WAIT_TIMEOUT": "180",
        "RAY_JOIN_TIMEOUT": "180",
        "RAY_REPORT_EVERY": "10",
        "RAY_DEDUP_LOGS": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        # no idle Python workers started ahead of demand: each would import Ray for nothing (about 270 MB apiece)
        "RAY_enable_worker_prestart": "0",
        "RAY_prestart_worker_first_driver": "0",
        "R1_ASCEND_PREFLIGHT_CMD": "",
        "R1_ASCEND_LAUNCH_CMD": f"bash {launch}",
        "TOKENIZERS_PARALLELISM": "false",
    }
    for key in ("VLLM_DP_SIZE", "RAY_ADDRESS", "NODE_IPS", "SOCKET_IFNAME", "HCCL_SOCKET_IFNAME"):
        base.pop(key, None)
    envs = []
    for index in range(plan.nodes):
        ip = node_ip(index)
        extra = f"--object-store-memory=120000000 --dashboard-agent-listen-port={unused_local_port()}"
        if index == 0:
            extra += f" --ray-client-server-port={unused_local_port()}"
        envs.append({**base, "NODE_IP": ip, "R1_ASCEND_RUN_DIR": str(node_dir(out, ip)), "RAY_START_EXTRA_ARGS": extra})
    return envs, temp_dir


def wait_for(predicate, what: str, timeout: float, alive: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        if alive is not None and alive.poll() is not None:
            raise RehearsalError(f"{what}: the process exited with {alive.returncode} first{_run_error(log)}")
        time.sleep(0.5)
    raise RehearsalError(f"{what}: not reached within {timeout:g} s; log: {log}")


#: The line the recipe's entry point prints when the run stopped for a lost worker (WorkerLostError).
RUN_ERROR = re.compile(r"^r1-ascend: (\w+Error: .*)$", re.M)


def _run_error(log: Path | None) -> str:
    """``: <the run's own error>; log: ...`` and, after a lost worker, how to continue the rehearsal."""
    if log is None:
        return ""
    errors = RUN_ERROR.findall(read_log(log))
    if not errors:
        return f"; log: {log}"
    hint = ""
    if errors[-1].startswith("WorkerLostError"):
        hint = f"; continue the rehearsal with: r1-ascend rehearse --resume --output-dir {log.parent}"
    return f": {errors[-1]}; log: {log}{hint}"


def read_log(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def start_cluster(cluster: Cluster, head_log: Path) -> subprocess.Popen:
    """Start the head (which will exec the driver once every node joined), then the other nodes."""
    head_env = cluster.envs[0]
    with head_log.open("w") as log:
        head = subprocess.Popen([*cluster.prefix, "bash", str(SCRIPT)], env=head_env, stdout=log, stderr=log)
    cluster.drivers.append(head)  # after the exec, this pid is the driver of run 1
    ray_log = node_dir(cluster.out, cluster.head_ip) / f"ray-head-{cluster.head_ip}.log"
    wait_for(lambda: "Ray runtime started" in read_log(ray_log), "the Ray head to start", 180, head, head_log)
    for env in cluster.envs[1:]:
        join_node(cluster, env)
    return head


def join_node(cluster: Cluster, env: dict[str, str]) -> None:
    """Start Ray on a non-head node (``ray_start_npu.sh`` returns once it joined)."""
    done = subprocess.run(
        [*cluster.prefix, "bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=240, check=False
    )
    (node_dir(cluster.out, env["NODE_IP"]) / "start.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RehearsalError(f"node {env['NODE_IP']} did not join: {done.stderr.strip()[-1500:]}")


def rejoin_node(cluster: Cluster, env: dict[str, str]) -> None:
    """A lost node back, as an operator brings it back: ``ray_start_npu.sh`` on it again (its ``ray start`` ended
    with the raylet, so the recorded pid is gone and the start goes ahead). Not ``stop`` first: its clean-up of
    leftovers matches the node's Ray temp dir, which the simulated nodes share with the head."""
    join_node(cluster, env)


def stop_node(cluster: Cluster, env: dict[str, str]) -> None:
    """``ray_start_npu.sh stop`` on one node: it stops the pids that node's start recorded."""
    subprocess.run(
        [*cluster.prefix, "bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=120, check=False
    )


def stop_cluster(cluster: Cluster) -> None:
    for proc in cluster.drivers:
        if proc.poll() is None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(20)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    for env in reversed(cluster.envs):
        stop_node(cluster, env)
    if cluster.temp_dir:
        shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    if cluster.netns:
        subprocess.run(["ip", "netns", "delete", cluster.netns], capture_output=True, check=False)


def _saved_step(checkpoints: Path) -> int:
    text = read_log(checkpoints / "latest_checkpointed_iteration.txt").strip()
    return int(text) if text.isdigit() else 0


def kill_mid_step(
    driver: subprocess.Popen, out: Path, plan: Plan, log: Path, after_step: int | None = None
) -> tuple[int, set[int]]:
    """Wait for the checkpoint of ``after_step`` (default: the first) and the next step's generation, then SIGKILL
    the driver; return that step and the workers it had."""
    checkpoints = out / "checkpoints"
    saved = after_step or plan.save_freq
    wait_for(lambda: _saved_step(checkpoints) >= saved, f"the checkpoint of step {saved}", 900, driver, log)
    saved_at = time.time()

    def next_step_generating() -> bool:
        events = read_lifecycle(out / "lifecycle")
        return any(e["event"] == "generate" and not e.get("validate") and e["t"] > saved_at for e in events)

    wait_for(next_step_generating, f"step {saved + 1} to start generating", 300, driver, log)
    killed_step = _saved_step(checkpoints) + 1
    log_progress(f"killing the driver (pid {driver.pid}) in the middle of step {killed_step}")
    driver.send_signal(signal.SIGKILL)
    driver.wait(30)
    workers = {e["pid"] for e in read_lifecycle(out / "lifecycle")}
    wait_for(lambda: not any(psutil.pid_exists(p) for p in workers), "Ray to stop the killed job's workers", 120)
    return killed_step, workers


def start_driver(cluster: Cluster, launch: Path, log: Path) -> subprocess.Popen:
    """The driver command again, on the running cluster (``RAY_ADDRESS`` set, as the head's exec sets it)."""
    env = {**cluster.envs[0], "RAY_ADDRESS": cluster.address()}
    with log.open("w") as f:
        driver = subprocess.Popen([*cluster.prefix, "bash", str(launch)], env=env, stdout=f, stderr=f)
    cluster.drivers.append(driver)
    return driver


def relaunch(cluster: Cluster, launch: Path, log: Path, timeout: float) -> None:
    driver = start_driver(cluster, launch, log)
    try:
        code = driver.wait(timeout)
    except subprocess.TimeoutExpired:
        raise RehearsalError(f"the resumed run did not finish within {timeout:g} s; log: {log}") from None
    if code != 0:
        raise RehearsalError(f"the resumed run failed with exit code {code}; log: {log}")


STEP_LINE = re.compile(r"\bstep:(\d+) - ")
RESUME_LINE = re.compile(r"Load from checkpoint folder: \S*global_step_(\d+)")
READY_LINE = re.compile(r"ray cluster ready: (.*); NPU total (\S+)")

# --- verdicts: pure functions of what the run left behind (logs, checkpoint and TensorBoard directories) ----------


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


PLAN_FILE = "plan.json"


def prepare(out: Path, plan: Plan, weights: Path | None) -> Path:
    """A fresh output directory with the inputs, the plan and the driver's launch script; returns the script."""
    if out.exists():
        shutil.rmtree(out)
    (out / "lifecycle").mkdir(parents=True)
    source = f"the quickstart's checkpoint in {weights}" if weights else f"a converted smoke checkpoint under {out}"
    log_progress(f"inputs: {source}, the toy task's parquet under {out / 'inputs'}")
    try:
        inputs = make_inputs(out / "inputs", weights)
    except FileNotFoundError as exc:
        raise RehearsalError(str(exc)) from None
    (out / PLAN_FILE).write_text(json.dumps(dataclasses.asdict(plan), indent=2) + "\n")
    return write_launch(out / "launch.sh", driver_command(sys.executable, plan, inputs, out, REPO))


def write_launch(path: Path, command: list[str]) -> Path:
    path.write_text(f"#!/usr/bin/env bash\nset -euo pipefail\nexec {shlex.join(command)}\n")
    return path


def new_cluster(out: Path, plan: Plan, launch: Path, sampler: RssSampler) -> Cluster:
    """The simulated nodes' settings (nothing started yet); the head will exec ``launch``."""
    prefix, netns = make_netns()
    envs, temp_dir = node_envs(out, plan, launch)
    cluster = Cluster(out, plan, prefix, netns, envs, temp_dir)
    sampler.watch_cmdline(temp_dir)
    where = f"network namespace {netns}" if netns else "the host's loopback (no network namespace available)"
    log_progress(f"cluster: {plan.nodes} nodes x {plan.npus_per_node} NPU on {where}, Ray temp dir {temp_dir}")
    return cluster


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


def print_summary(summary: dict[str, object]) -> None:
    steps = summary["steps_run"]
    assert isinstance(steps, dict)
    print("rehearse: ok")
    print(f"  nodes joined:      {summary['nodes_joined']}")
    print(f"  NPUs seen:         {summary['npus_seen']:g}")
    print(f"  steps run:         {'; '.join(f'{k}: {v}' for k, v in steps.items())}")
    print(f"  killed in step:    {summary['killed_in_step']}")
    print(f"  resumed from step: {summary['resumed_from_step']}")
    print(f"  rollout lifecycle: {summary['lifecycle']}")
    print(f"  overlay preludes:  {summary['preludes']}")
    print(f"  checkpoint loads:  {summary['checkpoint_loads']}")
    model = summary["model"]
    assert isinstance(model, dict)
    layout = ", ".join(f"{k.upper()} {v}" for k, v in model["layout"].items())
    print(f"  actor model:       {model['class']}, {model['parameters_per_rank']} parameters per rank; {layout}")
    reward = summary["reward"]
    assert isinstance(reward, dict)
    curve = summary["reward_curve"]
    assert isinstance(curve, dict)
    print(
        f"  reward:            {reward['first']:.3f} over the first {reward['window']} steps -> {reward['last']:.3f} "
        f"over the last {reward['window']} ({len(curve)} steps: {', '.join(f'{v:.2f}' for v in curve.values())})"
    )
    print(f"  rollout-actor gap: {summary['rollout_actor_gap_max']:.2e} nat (largest step mean |Δ log-prob|)")
    print_moe(summary["moe"])
    exported = summary["export"]
    assert isinstance(exported, dict)
    print(
        f"  exported:          {exported['hf_dir']} (to-hf; transformers loads it strictly, "
        f"{exported['parameters']} parameters; {exported['prompt']!r} -> {exported['answer']!r})"
    )
    print(f"  report:            {summary['report']}")
    print(
        f"  wall time:         {summary['wall_s']} s; summed peak RSS {summary['peak_rss_gib']} GiB over "
        f"{summary['processes_sampled']} processes; at one moment at most {summary['concurrent_peak_pss_gib']} GiB "
        f"in use (PSS; {summary['concurrent_peak_rss_gib']} GiB summing RSS, which counts shared pages per process)"
    )


def print_moe(moe: object) -> None:
    """The MoE verdicts' figures (r1_ascend.rehearse.expert_checks)."""
    assert isinstance(moe, dict)
    experts = moe["experts"]
    print(
        f"  experts:           every expert of {experts['layers']} MoE layers routed "
        f"(fewest tokens of an expert over the run: {experts['fewest_tokens']:g}); smallest expert-parallel rank "
        f"share {moe['smallest_ep_share']:.1%} of a layer's tokens in a step"
    )
    moves = ", ".join(f"{m['step']}: {m['largest_bias_change']:.4f}" for m in moe["bias_moves"])
    print(f"  expert bias moved: largest change per step {moves}")
    follows = ", ".join(
        f"{d['after_update_of_step']}: {d['engine_vs_actor']:.1g} "
        f"(actor's moved {d['actor_moved_since_first_update']:.3f})"
        for d in moe["engine_bias"]
    )
    print(f"  engine bias:       |engine - actor| at the syncs after the update of step {follows}")


if __name__ == "__main__":
    raise SystemExit(main())
