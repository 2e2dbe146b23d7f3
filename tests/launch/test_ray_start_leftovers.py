"""scripts/ray_start_npu.sh stops what a lost node's Ray left running, when the node is brought back.

A one-node Ray started by the script runs a job whose actor forks a helper (as megatron-core's checkpoint writer
does); the test then SIGKILLs the node's raylet and the worker, as a lost node's Ray can end (the OOM killer, a
kill of every Ray process). Neither Ray's clean-up of a worker's children (it runs when the worker exits by itself)
nor the raylet's subreaper (dead) reaches the helper: it is orphaned, with the worker's process title and no
mention of the Ray session on its command line. Starting the script again on that node (what the WorkerLostError of
a lost node tells the user to do) must stop it: every process of a start carries that start's mark in its
environment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "ray_start_npu.sh"
VENV_BIN = Path(sys.executable).parent
NODE_IP = "127.0.0.2"

#: The job: an actor that forks a helper which outlives it, then waits for the test.
JOB = textwrap.dedent(
    """
    import os, sys, time
    import ray

    ray.init(_node_ip_address={ip!r})

    @ray.remote(num_cpus=0)
    class Worker:
        def fork_helper(self) -> tuple[int, int]:
            helper = os.fork()
            if helper == 0:
                time.sleep(600)
                os._exit(0)
            return os.getpid(), helper

    worker = Worker.remote()
    pids = ray.get(worker.fork_helper.remote())
    with open({marker!r}, "w") as f:
        f.write(" ".join(map(str, pids)))
    time.sleep(600)
    """
)

pytestmark = [pytest.mark.slow, pytest.mark.machine]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait(predicate, what: str, timeout: float, process: subprocess.Popen | None = None) -> None:
    """Wait for ``predicate``; fail at once, with its output, when ``process`` (the script under test) ends first."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if process is not None and process.poll() is not None:
            output = process.stdout.read().decode(errors="replace") if process.stdout else ""
            raise AssertionError(f"{what}: the script ended first (exit code {process.returncode}):\n{output}")
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.5)


def test_bringing_a_lost_node_back_stops_what_its_ray_left_running(
    tmp_path: Path, netns: list[str], free_port: Callable[[], int]
) -> None:
    marker = tmp_path / "pids.txt"
    job = tmp_path / "job.py"
    job.write_text(JOB.format(ip=NODE_IP, marker=str(marker)))
    launch = tmp_path / "launch.sh"
    launch.write_text(f'#!/usr/bin/env bash\nset -euo pipefail\nexec "{VENV_BIN / "python"}" {job}\n')
    temp_dir = f"/tmp/r1rl-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "run"
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
        "PYTHON": str(VENV_BIN / "python"),
        "RAY": str(VENV_BIN / "ray"),
        "NNODES": "1",
        "NPUS_PER_NODE": "1",
        "NODE_IP": NODE_IP,
        "MASTER_ADDR": NODE_IP,
        "RAY_PORT": str(free_port()),
        "RAY_NUM_CPUS": "1",
        "RAY_TEMP_DIR": temp_dir,
        "R1_ASCEND_RUN_DIR": str(run_dir),
        "OUTPUT_DIR": str(tmp_path / "outputs"),
        "R1_ASCEND_PREFLIGHT_CMD": "",
        "R1_ASCEND_LAUNCH_CMD": f"bash {launch}",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_START_EXTRA_ARGS": f"--ray-client-server-port={free_port()} --dashboard-agent-listen-port={free_port()}",
    }
    env.pop("VLLM_DP_SIZE", None)
    pid_file = run_dir / f"ray-head-{NODE_IP}.pid"
    head = subprocess.Popen([*netns, "bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    helper = 0
    try:
        _wait(lambda: marker.is_file() and marker.read_text().strip(), "the job's actor forked its helper", 240, head)
        worker, helper = map(int, marker.read_text().split())
        raylet = next(p for p in psutil.Process(int(pid_file.read_text())).children() if p.name() == "raylet")
        raylet.send_signal(signal.SIGKILL)  # the node's Ray is lost, its worker killed with it (no exit of its own:
        os.kill(worker, signal.SIGKILL)  # Ray's own clean-up of the worker's children never runs)
        _wait(lambda: not _alive(worker), "the worker to end", 60)
        assert _alive(helper), "the helper ended with its worker: nothing left to clean up"
        head.kill()  # the driver of the lost job
        head.wait(30)
        started = int(pid_file.read_text())  # gone, not only a zombie: the script asks `kill -0`
        _wait(lambda: not psutil.pid_exists(started), "ray start --block to end with its raylet", 60)
        # the operator brings the node back: the new start stops what the lost one left, then starts Ray afresh
        env["R1_ASCEND_LAUNCH_CMD"] = "true"
        again = subprocess.run(
            [*netns, "bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300, check=False
        )
        assert "ended without stop" in again.stdout, again.stdout + again.stderr
        assert not _alive(helper), f"the helper (pid {helper}) of the lost node's worker still runs: {again.stdout}"
    finally:
        if head.poll() is None:
            head.kill()
        subprocess.run([*netns, "bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=120, check=False)
        if helper and _alive(helper):
            os.kill(helper, signal.SIGKILL)
        subprocess.run(["rm", "-rf", temp_dir], check=False)
