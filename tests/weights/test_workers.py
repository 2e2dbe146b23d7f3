"""Workers die with their parent: SIGKILL of the main pid of a ``--workers 2`` run leaves no worker behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from r1_ascend.weights.workers import worker_pool

#: The real CLI, each written tensor followed by a short sleep so that the run can be killed mid-shard.
SLOW_CLI = [str(Path(__file__).with_name("faults.py")), "--delay-per-tensor", "0.05", "--"]


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _kill_mid_run(args: list[str], out: Path, started: str) -> tuple[list[int], set[str]]:
    """Start the CLI, wait until its workers are writing, SIGKILL the main pid; returns worker pids and the
    files present once the parent is dead."""
    proc = subprocess.Popen([sys.executable, *SLOW_CLI, *args], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    workers: list[int] = []
    try:
        while time.monotonic() < deadline:
            workers = [c.pid for c in psutil.Process(proc.pid).children()]
            if len(workers) >= 2 and len(list(out.glob(started))) >= 2:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the run never had two workers writing")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        finished = {p.name for p in out.iterdir()}  # the parent is gone: from here on nothing may finish
    finally:
        if proc.poll() is None:
            proc.kill()
    return workers, finished


def _assert_workers_gone(workers: list[int], out: Path, finished: set[str]) -> None:
    deadline = time.monotonic() + 5
    while _alive(workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _alive(workers)
    for pid in left:  # clean up before failing
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers {left} outlived their parent"
    time.sleep(1.0)
    new = {p.name for p in out.iterdir() if not p.name.startswith(".")} - finished
    assert not new, f"workers finished {new} after the parent was killed"


@pytest.mark.slow
def test_fp8_to_bf16_workers_die_with_the_parent(tiny_fp8, tmp_path: Path) -> None:
    out = tmp_path / "bf16"
    args = ["fp8-to-bf16", str(tiny_fp8.path), str(out), "--workers", "2", "--quiet"]
    workers, finished = _kill_mid_run(args, out, ".*.tmp-*")
    _assert_workers_gone(workers, out, finished)
    assert list(out.glob(".*.tmp-*")), "the shards in hand were left unfinished"


@pytest.mark.slow
def test_to_megatron_workers_die_with_the_parent(tiny_bf16: Path, tmp_path: Path) -> None:
    out = tmp_path / "mcore"
    args = ["to-megatron", str(tiny_bf16), str(out), "--workers", "2", "--ep", "2", "--quiet"]
    workers, finished = _kill_mid_run(args, out, ".__*.tmp-*")
    _assert_workers_gone(workers, out, finished)


def _sleep_and_report(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def test_watchdog_kills_a_worker_whose_parent_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the kernel hook, the pid watchdog alone still stops an orphaned worker."""
    from r1_ascend.weights import workers as w

    monkeypatch.setattr(w, "_die_with_parent_kernel", lambda: False)
    monkeypatch.setattr(w, "WATCHDOG_INTERVAL_S", 0.05)
    with worker_pool(1) as pool:
        pid = pool.submit(_sleep_and_report, 0).result()
        # pretend the parent died: the watchdog compares getppid() with the recorded parent pid
        assert pid != os.getpid()
    # a worker started with a wrong parent pid kills itself at once
    monkeypatch.setattr(w.os, "getpid", lambda: -1)
    pool = worker_pool(1)
    monkeypatch.undo()
    fut = pool.submit(_sleep_and_report, 5)
    with pytest.raises(Exception, match="terminated abruptly"):
        fut.result(timeout=10)
    pool.shutdown()


def test_workers_run_one_thread() -> None:
    import torch

    with worker_pool(2) as pool:
        assert list(pool.map(_threads, range(2))) == [(1, "1")] * 2
    assert torch.get_num_threads() >= 1


def _threads(_: int) -> tuple[int, str | None]:
    import torch

    return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
