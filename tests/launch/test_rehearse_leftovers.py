"""Finding what of a rehearsal's run still runs anywhere on the machine (r1_ascend.rehearse.leftovers).

Real processes stand in for the run's: one carrying the run's Ray temp dir in its environment (as every Ray process
and worker of the rehearsal does, and what a worker forks inherits), one writing to a log under it (a worker's
stdout), one titled like a Ray worker with no other tie, another run's worker, and an unrelated process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from r1_ascend.rehearse.leftovers import node_daemons, run_processes

pytestmark = pytest.mark.machine

#: A process that prints "ready" and sleeps; started with its title as ``argv[0]``, its command line reads as Ray's
#: worker titles do (``ray::WorkerDict ...``).
SLEEPER = "import time; print('ready', flush=True); time.sleep(600)"


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen]]:
    processes: list[subprocess.Popen] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(10)


def _spawn(started: list[subprocess.Popen], title: str, env: dict[str, str] | None = None, stdout=None) -> int:
    process = subprocess.Popen(
        [title, "-c", SLEEPER],
        executable=sys.executable,
        env={**os.environ, **(env or {})},
        stdout=stdout or subprocess.PIPE,
    )
    started.append(process)
    if stdout is None:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == b"ready"
    else:
        time.sleep(1)
    return process.pid


def test_every_process_tied_to_the_run_is_found_and_nothing_else(
    tmp_path: Path, started: list[subprocess.Popen]
) -> None:
    temp_dir = str(tmp_path / "r1rh-ours")
    logs = Path(temp_dir) / "session_2026-01-01_00-00-00_1" / "logs"
    logs.mkdir(parents=True)
    began = time.time() - 1
    by_env = _spawn(started, "ray::WorkerDict.actor_rollout_save_checkpoint", {"RAY_TEMP_DIR": temp_dir})
    with (logs / "worker-1.out").open("w") as log:
        by_log = _spawn(started, "ray::IDLE", stdout=log)
    untied = _spawn(started, "ray::HeartbeatMonitor")
    other_run = _spawn(started, "ray::WorkerDict", {"RAY_TEMP_DIR": str(tmp_path / "r1rh-theirs")})
    unrelated = _spawn(started, "python sleeping")
    found = {p.pid: p.tie for p in run_processes(temp_dir, began)}
    assert found.get(by_env) == "environment"
    assert found.get(by_log) == "open files"
    assert found.get(untied) == "a Ray worker started during the run that no other Ray session claims"
    assert other_run not in found
    assert unrelated not in found
    # a Ray worker that was running before the run began is not the run's, unless tied to it
    assert untied not in {p.pid for p in run_processes(temp_dir, time.time() + 60)}
    assert by_env in {p.pid for p in run_processes(temp_dir, time.time() + 60)}
    assert by_env not in {p.pid for p in run_processes(temp_dir, began, ignore={by_env})}


def test_the_live_nodes_daemons_are_told_apart_from_their_workers(
    tmp_path: Path, started: list[subprocess.Popen]
) -> None:
    """A ``ray start`` stand-in with a daemon child and a worker child (which forked a helper of its own)."""
    # titled processes do not know their interpreter (sys.executable is empty): it is passed on
    helper = f"import subprocess, time; subprocess.Popen([{sys.executable!r}, '-c', {SLEEPER!r}]); time.sleep(600)"
    tree = textwrap.dedent(
        f"""
        import subprocess, sys, time
        # their own output goes nowhere: the first line on this one's is the pids
        quiet = {{"stdout": subprocess.DEVNULL, "executable": sys.executable}}
        worker = subprocess.Popen(["ray::WorkerDict", "-c", {helper!r}], **quiet)
        # the raylet's command line names the worker script as an option: it is no worker
        worker_command = "--python_worker_command=python /ray/_private/workers/default_worker.py"
        daemon = subprocess.Popen(["raylet", "-c", {SLEEPER!r}, worker_command], **quiet)
        print(worker.pid, daemon.pid, flush=True)
        time.sleep(600)
        """
    )
    root = subprocess.Popen([sys.executable, "-c", tree], stdout=subprocess.PIPE, text=True, start_new_session=True)
    started.append(root)
    try:
        assert root.stdout is not None
        worker, daemon = map(int, root.stdout.readline().split())
        deadline = time.monotonic() + 30
        while not psutil.Process(worker).children():
            assert time.monotonic() < deadline, "the stand-in worker did not start its helper"
            time.sleep(0.1)
        forked = psutil.Process(worker).children()[0].pid
        pid_file = tmp_path / "ray-worker-127.0.0.3.pid"
        pid_file.write_text(f"{root.pid}\n")
        daemons = node_daemons([pid_file, tmp_path / "ray-head-gone.pid"])
        assert root.pid in daemons
        assert daemon in daemons
        assert worker not in daemons
        assert forked not in daemons
        pid_file.write_text("999999999\n")  # a node whose ray start is gone has no daemons left to spare
        assert node_daemons([pid_file]) == set()
    finally:
        os.killpg(root.pid, signal.SIGKILL)
