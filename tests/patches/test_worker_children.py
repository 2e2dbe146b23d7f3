"""What a training worker forks ends with it (r1_ascend.patches.impl.children), however the worker ends.

A real process stands in for the worker: it forks what megatron-core's checkpoint writer forks (a ``multiprocessing``
Manager, from the main thread and from another thread), prints the children's pids and is then SIGKILLed, as a
worker is when its raylet dies under it or the OOM killer takes it. Every child must be gone within seconds, without
a raylet (or anything else) to reap it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

pytestmark = pytest.mark.machine

#: The stand-in worker: ``install`` says whether it installs the fork handler first.
WORKER = textwrap.dedent(
    """
    import json, multiprocessing, sys, threading, time
    if sys.argv[1] == "install":
        from r1_ascend.patches.impl.children import end_children_with_this_process
        end_children_with_this_process()
    ctx = multiprocessing.get_context("fork")
    managers = [ctx.Manager()]  # as filesystem_async._get_write_results_queue does, on the task's thread
    def from_a_thread():
        managers.append(ctx.Manager())
    thread = threading.Thread(target=from_a_thread)
    thread.start()
    thread.join()  # the forking thread is gone: the child must still live while its parent does
    time.sleep(1.5)
    print(json.dumps([m._process.pid for m in managers]), flush=True)
    time.sleep(600)
    """
)


def _start(install: bool) -> tuple[subprocess.Popen, list[int]]:
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, "install" if install else "plain"], stdout=subprocess.PIPE, text=True
    )
    assert worker.stdout is not None
    children = json.loads(worker.stdout.readline())
    return worker, children


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _alive_after(pids: list[int], seconds: float) -> list[int]:
    """Those of ``pids`` still alive once all have ended or ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if _alive(pid)]


def _kill_alive(pids: list[int]) -> None:
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _kill_worker(worker: subprocess.Popen) -> None:
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)


def test_what_a_worker_forked_ends_when_the_worker_is_killed() -> None:
    worker, children = _start(install=True)
    try:
        assert len(children) == 2
        assert all(_alive(pid) for pid in children), "a child ended while its parent lives"
        _kill_worker(worker)
        left = _alive_after(children, 5.0)
        assert left == [], f"children {left} outlived their parent (forked from the main thread and another one)"
    finally:
        if worker.poll() is None:
            worker.kill()
        _kill_alive(children)


def test_without_the_handler_they_are_orphaned() -> None:
    """The failure the handler prevents: the same worker without it leaves its Manager processes running."""
    worker, children = _start(install=False)
    try:
        _kill_worker(worker)
        time.sleep(2)
        assert all(_alive(pid) for pid in children)
        assert all(psutil.Process(pid).ppid() != worker.pid for pid in children)
    finally:
        _kill_alive(children)


# --- on a real two-node Ray: a worker killed with its raylet ---------------------------------------------------------


def _manager_forking_worker() -> type:
    class Worker:
        """Enters a stage through the watchdog patch (as every training worker does), then forks megatron-core's
        writer Manager."""

        def fork_manager(self) -> tuple[int, list[int]]:
            import multiprocessing

            from r1_ascend.patches.verl_worker_watchdog import in_stage

            with in_stage("save_checkpoint", 1):
                self.queue = multiprocessing.get_context("fork").Manager().Queue()
            return os.getpid(), [child.pid for child in psutil.Process().children()]

    return Worker


@pytest.mark.slow
def test_a_worker_killed_with_its_raylet_leaves_nothing_it_forked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray ends a worker's children itself when the worker exits on its own (RAY_kill_child_processes_on_worker_exit)
    and reaps them while the raylet lives (subreaper mode); a worker SIGKILLed once its raylet is gone has neither.
    Measured without the handler: the Manager outlived it for good; with it, it is gone within a second."""
    import ray
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper", "true")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "node_ip_address": "127.0.0.2"},
    )
    children: list[int] = []
    try:
        node = cluster.add_node(num_cpus=1, resources={"lost": 1}, node_ip_address="127.0.0.3")
        ray.init(address=cluster.address, log_to_driver=False, _node_ip_address="127.0.0.2")
        worker = ray.remote(num_cpus=0, resources={"lost": 1})(_manager_forking_worker()).remote()
        pid, children = ray.get(worker.fork_manager.remote(), timeout=120)
        assert children, "the worker forked no Manager"
        os.kill(node.all_processes["raylet"][0].process.pid, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
        left = _alive_after(children, 5.0)
        assert left == [], f"what the worker forked outlived it and its raylet: {left}"
    finally:
        ray.shutdown()
        cluster.shutdown()
        _kill_alive(children)
        # the driver's core worker, started in subreaper mode, set SIGCHLD to SIG_IGN in this process and keeps it
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
