"""The simulated cluster of a rehearsal: its output directory and launch script, the network namespace, the Ray
nodes (``scripts/ray_start_npu.sh`` on loopback addresses 127.0.0.2, 127.0.0.3, ...), and the driver processes.

Every process started here is recorded and stopped by pid: drivers directly, the Ray nodes through
``ray_start_npu.sh stop`` (the pids that script recorded).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
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
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from r1_ascend.checkout import script
from r1_ascend.patches.rules.checkpoints import TRACKER, tracker_written_at
from r1_ascend.ports import unused_local_port
from r1_ascend.rehearse.budget import RssSampler
from r1_ascend.rehearse.config import CONFIG_NAME, Plan, driver_command, node_ip
from r1_ascend.rehearse.inputs import make_inputs
from r1_ascend.rehearse.lifecycle import read_lifecycle
from r1_ascend.rehearse.progress import RehearsalError, log_progress, read_log

SITE = Path(__file__).resolve().parent / "site"


def node_script() -> Path:
    """``scripts/ray_start_npu.sh`` of the checkout (``R1_ASCEND_HOME``, or the one the package runs from)."""
    return script("ray_start_npu.sh")


def with_site(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with :data:`SITE` first on ``PYTHONPATH``: its ``sitecustomize`` installs the ``torch_npu`` and
    MindSpeed stand-ins, as in every process of the rehearsal."""
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(SITE), env.get("PYTHONPATH", "")]))}


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


def delete_netns(name: str) -> None:
    """Delete a namespace :func:`make_netns` made (nothing runs in it any more)."""
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)


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
        **with_site(os.environ),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PYTHON": sys.executable,
        "RAY": str(ray_wrapper),
        "NNODES": str(plan.nodes),
        "NPUS_PER_NODE": str(plan.npus_per_node),
        "MASTER_ADDR": node_ip(0),
        "RAY_PORT": str(port),
        # Ray's logical CPUs: verl's worker bundles ask one each, and the head also hosts the TaskRunner (one); with
        # fewer, a node of two or more fake NPUs never places its workers and the run waits for good
        "RAY_NUM_CPUS": str(plan.npus_per_node + 1),
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
        # the run's outputs and the head's console logs (logs/), on the file system both nodes share
        "OUTPUT_DIR": str(out),
        "R1_ASCEND_CONFIG": CONFIG_NAME,
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


def start_cluster(cluster: Cluster, head_log: Path) -> subprocess.Popen:
    """Start the head (which will exec the driver once every node joined), then the other nodes."""
    head_env = cluster.envs[0]
    with head_log.open("w") as log:
        head = subprocess.Popen([*cluster.prefix, "bash", str(node_script())], env=head_env, stdout=log, stderr=log)
    cluster.drivers.append(head)  # after the exec, this pid is the driver of run 1
    ray_log = node_dir(cluster.out, cluster.head_ip) / f"ray-head-{cluster.head_ip}.log"
    wait_for(lambda: "Ray runtime started" in read_log(ray_log), "the Ray head to start", 180, head, head_log)
    for env in cluster.envs[1:]:
        join_node(cluster, env)
    return head


def join_node(cluster: Cluster, env: dict[str, str]) -> None:
    """Start Ray on a non-head node (``ray_start_npu.sh`` returns once it joined)."""
    done = subprocess.run(
        [*cluster.prefix, "bash", str(node_script())], env=env, capture_output=True, text=True, timeout=240, check=False
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
        [*cluster.prefix, "bash", str(node_script()), "stop"], env=env, capture_output=True, timeout=120, check=False
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
    # all nodes at once: each ``ray start --block`` ends its processes one by one, up to a second each (3.4 s for a
    # head here), and the nodes do not wait for one another
    with ThreadPoolExecutor(max_workers=max(1, len(cluster.envs))) as pool:
        list(pool.map(functools.partial(stop_node, cluster), reversed(cluster.envs)))
    if cluster.temp_dir:
        shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    if cluster.netns:
        delete_netns(cluster.netns)


def _saved_step(checkpoints: Path) -> int:
    text = read_log(checkpoints / TRACKER).strip()
    return int(text) if text.isdigit() else 0


def kill_mid_step(
    driver: subprocess.Popen, out: Path, plan: Plan, log: Path, after_step: int | None = None
) -> tuple[int, set[int]]:
    """Wait for the checkpoint of ``after_step`` (default: the first) and the next step's generation, then SIGKILL
    the driver; return that step and the workers it had."""
    checkpoints = out / "checkpoints"
    saved = after_step or plan.save_freq
    wait_for(lambda: _saved_step(checkpoints) >= saved, f"the checkpoint of step {saved}", 900, driver, log)
    # when the tracker was written, not when this poll saw it: a step of the fault plan's batch can begin generating
    # within the poll's half second, and a later origin missed that generation (and then waited for the run's end)
    saved_at = tracker_written_at(checkpoints)

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


def start_driver(cluster: Cluster, log: Path) -> subprocess.Popen:
    """The run again on the running cluster, as an operator relaunches it: ``ray_start_npu.sh restart`` on the head
    (Ray and the joined nodes kept; the head waits for every node, then execs the launch command: this process
    becomes the driver)."""
    with log.open("w") as f:
        driver = subprocess.Popen(
            [*cluster.prefix, "bash", str(node_script()), "restart"], env=cluster.envs[0], stdout=f, stderr=f
        )
    cluster.drivers.append(driver)
    return driver


def restart_worker(cluster: Cluster, env: dict[str, str]) -> str:
    """``ray_start_npu.sh restart`` on a worker node, as the relaunch documents it for every node: what it said."""
    done = subprocess.run(
        [*cluster.prefix, "bash", str(node_script()), "restart"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    said = done.stdout + done.stderr
    (node_dir(cluster.out, env["NODE_IP"]) / "restart.log").write_text(said)
    if done.returncode != 0:
        raise RehearsalError(f"restart on node {env['NODE_IP']} failed: {said.strip()[-1500:]}")
    return said


def relaunch(cluster: Cluster, log: Path, timeout: float) -> None:
    driver = start_driver(cluster, log)
    try:
        code = driver.wait(timeout)
    except subprocess.TimeoutExpired:
        raise RehearsalError(f"the resumed run did not finish within {timeout:g} s; log: {log}") from None
    if code != 0:
        raise RehearsalError(f"the resumed run failed with exit code {code}; log: {log}")


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
    return write_launch(out / "launch.sh", driver_command(sys.executable, plan, inputs, out))


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
