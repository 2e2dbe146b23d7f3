"""Parent side of the symbolic stage: a persistent worker subprocess with a hard wall-clock bound per call.

``signal.alarm`` only works on the main thread, and verl may call the reward from threads or Ray workers, so the
bound is enforced by process isolation instead: the comparison runs in a warm child process; if it does not answer
in time the child is killed (SIGKILL) and a replacement is started at once. Works from any thread; each
``SymbolicWorker`` serialises its own calls with a lock, and ``WorkerPool`` hands out several for parallel batches.

A worker's start (importing Math-Verify, about 2 s) is never charged to a comparison's bound: a comparison that
finds its worker still starting waits for it (bounded by ``STARTUP_TIMEOUT_S``), so a verdict never depends on
whether a worker happened to be ready — only on the comparison itself. The price is latency, not correctness: the
first comparison in a process, and the first one after a timeout, wait for a start. ``warm_up()`` pays the first
one ahead of time. (Forking a fresh child per comparison instead would avoid the restart but costs ~20 ms per call,
which made the symbolic stage several times slower on the benchmark.)
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time

logger = logging.getLogger(__name__)

WORKER_MODULE = "r1_ascend.recipe.reward.symbolic_worker"
STARTUP_TIMEOUT_S = 60.0


class SymbolicTimeout(Exception):
    """The symbolic comparison did not finish within its bound (the worker was killed)."""


class SymbolicWorker:
    """One child process running ``symbolic_worker``; restarted after a timeout or crash."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._ready = False
        self._buffer = b""
        self.restarts = 0

    # -- lifecycle -------------------------------------------------------------------------------
    def _spawn(self) -> None:
        env = dict(os.environ)
        env.setdefault("PYTHONHASHSEED", "0")
        self._process = subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        self._ready = False
        self._buffer = b""

    def _kill(self) -> None:
        process, self._process = self._process, None
        self._ready = False
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        if process is not None:
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()

    def close(self) -> None:
        with self._lock:
            self._kill()

    def start(self, *, wait: bool = True) -> None:
        """Start the child (idempotent); with ``wait``, block until it has imported Math-Verify."""
        if not self._lock.acquire(blocking=wait):
            return  # busy comparing: it is running already
        try:
            if self._process is None or self._process.poll() is not None:
                self._spawn()
            if wait and not self._ready:
                self._read_line(time.monotonic() + STARTUP_TIMEOUT_S)
                self._ready = True
        finally:
            self._lock.release()

    # -- I/O -------------------------------------------------------------------------------------
    def _read_line(self, deadline: float) -> bytes:
        assert self._process is not None
        assert self._process.stdout is not None
        fd = self._process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SymbolicTimeout
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                raise SymbolicTimeout
            chunk = os.read(fd, 65536)
            if not chunk:
                msg = "symbolic worker exited"
                raise BrokenPipeError(msg)
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def compare(self, gold: str, pred: str, timeout_s: float) -> bool:
        """True/False from Math-Verify, or ``SymbolicTimeout`` once ``timeout_s`` (lock wait included) has passed.

        A worker that is still starting is waited for first (start-up is not charged to ``timeout_s``).
        """
        deadline = time.monotonic() + timeout_s
        if not self._lock.acquire(timeout=max(timeout_s, 0.0)):
            raise SymbolicTimeout
        try:
            if self._process is None or self._process.poll() is not None:
                self._spawn()
            try:
                if not self._ready:
                    started = time.monotonic()
                    self._read_line(started + STARTUP_TIMEOUT_S)
                    self._ready = True
                    deadline += time.monotonic() - started
                assert self._process is not None
                assert self._process.stdin is not None
                remaining = max(deadline - time.monotonic(), 0.0)
                request = json.dumps({"gold": gold, "pred": pred, "timeout_s": remaining}).encode() + b"\n"
                self._process.stdin.write(request)
                self._process.stdin.flush()
                reply = json.loads(self._read_line(deadline))
            except (SymbolicTimeout, BrokenPipeError, OSError, ValueError) as error:
                self._kill()
                self.restarts += 1
                self._spawn()  # start the replacement now so its import overlaps with other work
                if isinstance(error, SymbolicTimeout):
                    raise
                logger.warning("symbolic worker failed (%s); restarted", error)
                return False
            if "error" in reply:
                logger.debug("symbolic comparison error: %s", reply["error"])
                return False
            return bool(reply["equal"])
        finally:
            self._lock.release()


class WorkerPool:
    """A fixed set of workers; ``acquire`` returns an idle one so parallel threads never share a child."""

    def __init__(self, size: int) -> None:
        self._workers = [SymbolicWorker() for _ in range(max(1, size))]
        self._idle = list(self._workers)
        self._condition = threading.Condition()

    def __len__(self) -> int:
        return len(self._workers)

    def start(self) -> None:
        for worker in self._workers:
            worker.start(wait=False)
        for worker in self._workers:
            worker.start(wait=True)

    def acquire(self) -> SymbolicWorker:
        with self._condition:
            while not self._idle:
                self._condition.wait()
            return self._idle.pop()

    def release(self, worker: SymbolicWorker) -> None:
        with self._condition:
            self._idle.append(worker)
            self._condition.notify()

    def close(self) -> None:
        for worker in self._workers:
            worker.close()


_default_worker: SymbolicWorker | None = None
_default_lock = threading.Lock()


def default_worker(*, wait: bool = False) -> SymbolicWorker:
    """The process-wide worker used by single-item ``compute_score``.

    Started on first use without blocking: a comparison that arrives before the child is ready waits only for
    its own remaining bound (and times out rather than stalling the reward step). ``wait=True`` (``warm_up()``)
    blocks until the child has loaded sympy and Math-Verify.
    """
    global _default_worker
    with _default_lock:
        if _default_worker is None:
            _default_worker = SymbolicWorker()
            atexit.register(_default_worker.close)
        worker = _default_worker
    worker.start(wait=wait)
    return worker
