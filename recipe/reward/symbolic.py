"""Parent side of the symbolic stage: warm worker processes with a hard wall-clock bound per comparison.

``signal.alarm`` only works on the main thread, and verl may call the reward from threads or Ray workers, so the
bound is enforced by process isolation instead: a comparison runs in a worker process; if it does not answer in
time the worker is killed (SIGKILL).

Workers are forked from a warm template process (``symbolic_worker``) that imported Math-Verify once. Importing it
takes about 2 s, forking a warm copy a few milliseconds, so a worker killed on a timeout is replaced before the
next comparison at no visible cost: neither the replacement nor a slow comparison before it can push another
response past its bound. The template starts once per process (``warm_up()`` pays for it ahead of time; without
it the first symbolic comparison waits for it). The time to obtain a worker is not charged to a comparison's
budget, so a verdict depends only on the comparison itself. Works from any thread; each ``SymbolicWorker``
serialises its own calls with a lock, and ``WorkerPool`` hands out several for parallel batches.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

logger = logging.getLogger(__name__)

WORKER_MODULE = "r1_ascend.recipe.reward.symbolic_worker"
STARTUP_TIMEOUT_S = 180.0  # template start (imports, warm-up); waited for once per process, generous for load
FORK_TIMEOUT_S = 10.0  # a warm fork answers in milliseconds; this only catches a broken template


class SymbolicTimeout(Exception):
    """The symbolic comparison did not finish within its bound (the worker was killed)."""


class _LineReader:
    """Reads newline-terminated replies from a socket with a deadline (``select``, no signals)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def read(self, deadline: float) -> bytes:
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SymbolicTimeout
            readable, _, _ = select.select([self.sock], [], [], remaining)
            if not readable:
                raise SymbolicTimeout
            chunk = self.sock.recv(65536)
            if not chunk:
                msg = "symbolic process exited"
                raise BrokenPipeError(msg)
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line


class _Template:
    """The warm process that forks workers; one per parent process, restarted only if it dies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._reader: _LineReader | None = None
        self._ready = False

    def start(self, *, wait: bool) -> None:
        with self._lock:
            self._ensure(wait=wait)

    def _ensure(self, *, wait: bool) -> None:
        if self._process is None or self._process.poll() is not None:
            self._close()
            parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            env = dict(os.environ)
            env.setdefault("PYTHONHASHSEED", "0")
            self._process = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE, str(child_end.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                pass_fds=(child_end.fileno(),),
            )
            child_end.close()
            self._control, self._reader, self._ready = parent_end, _LineReader(parent_end), False
        if wait and not self._ready:
            assert self._reader is not None
            self._reader.read(time.monotonic() + STARTUP_TIMEOUT_S)
            self._ready = True

    def fork(self) -> tuple[socket.socket, int]:
        """A new warm worker: its socket and pid (waits for the template on its first start only)."""
        with self._lock:
            for attempt in range(2):
                self._ensure(wait=True)
                assert self._control is not None
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    socket.send_fds(self._control, [b"f"], [theirs.fileno()])
                except OSError:
                    ours.close()
                    if attempt:
                        raise
                    self._close()  # the template died: start a new one
                    continue
                finally:
                    theirs.close()
                reply = json.loads(_LineReader(ours).read(time.monotonic() + FORK_TIMEOUT_S))
                return ours, int(reply["pid"])
        msg = "unreachable"
        raise AssertionError(msg)

    def _close(self) -> None:
        process, self._process = self._process, None
        if self._control is not None:
            self._control.close()
            self._control = None
        self._ready = False
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def close(self) -> None:
        with self._lock:
            self._close()


_template_instance: _Template | None = None
_template_lock = threading.Lock()


def _template() -> _Template:
    global _template_instance
    with _template_lock:
        if _template_instance is None:
            _template_instance = _Template()
            atexit.register(_template_instance.close)
        return _template_instance


class SymbolicWorker:
    """One warm worker process (forked from the template); replaced after a timeout or crash."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._reader: _LineReader | None = None
        self.pid: int | None = None
        self.restarts = 0

    def _kill(self) -> None:
        sock, pid = self._sock, self.pid
        self._sock, self._reader, self.pid = None, None, None
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # the template reaps it
        if sock is not None:
            sock.close()

    def close(self) -> None:
        with self._lock:
            self._kill()

    def _ensure(self) -> None:
        if self._sock is None:
            self._sock, self.pid = _template().fork()
            self._reader = _LineReader(self._sock)

    def start(self, *, wait: bool = True) -> None:
        """Start the template (idempotent); with ``wait``, block until a warm worker is ready."""
        if not wait:
            _template().start(wait=False)
            return
        with self._lock:
            self._ensure()

    def compare(self, gold: str, pred: str, timeout_s: float) -> bool:
        """True/False from Math-Verify, or ``SymbolicTimeout`` once ``timeout_s`` (lock wait included) has passed.

        Obtaining a worker (a fork from the warm template; the template's own start once per process) is not
        charged to ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        if not self._lock.acquire(timeout=max(timeout_s, 0.0)):
            raise SymbolicTimeout
        try:
            if self._sock is None:
                started = time.monotonic()
                self._ensure()
                deadline += time.monotonic() - started
            assert self._sock is not None
            assert self._reader is not None
            try:
                self._sock.sendall(json.dumps({"gold": gold, "pred": pred}).encode() + b"\n")
                reply = json.loads(self._reader.read(deadline))
            except (SymbolicTimeout, BrokenPipeError, OSError, ValueError) as error:
                self._kill()
                self.restarts += 1
                if isinstance(error, SymbolicTimeout):
                    raise
                logger.warning("symbolic worker failed (%s); replaced", error)
                return False
            if "error" in reply:
                logger.debug("symbolic comparison error: %s", reply["error"])
                return False
            return bool(reply["equal"])
        finally:
            self._lock.release()


class WorkerPool:
    """A fixed set of workers; ``acquire`` returns an idle one so parallel threads never share a process."""

    def __init__(self, size: int) -> None:
        self._workers = [SymbolicWorker() for _ in range(max(1, size))]
        self._idle = list(self._workers)
        self._condition = threading.Condition()

    def __len__(self) -> int:
        return len(self._workers)

    def start(self) -> None:
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

    Without ``wait`` this only makes sure the template is starting (non-blocking); ``wait=True`` (``warm_up()``)
    blocks until the template has loaded sympy and Math-Verify and a worker is forked.
    """
    global _default_worker
    with _default_lock:
        if _default_worker is None:
            _default_worker = SymbolicWorker()
            atexit.register(_default_worker.close)
        worker = _default_worker
    worker.start(wait=wait)
    return worker
