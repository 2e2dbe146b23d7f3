"""Worker processes for the converters: started in milliseconds, one thread each, and never outliving the parent.

* Start-up: the pool forks the parent (which has already imported torch and parsed the checkpoint headers) instead
  of spawning fresh interpreters, which took seconds per worker re-importing torch.
* Threads: each worker runs torch with one intra-op thread; ``workers`` processes on ``workers`` cores never
  oversubscribe them (torch's default of one thread per core in every worker did).
* Lifetime: each worker asks the kernel to SIGKILL it when its parent dies (``prctl(PR_SET_PDEATHSIG)``), and a
  watchdog thread checks the parent pid twice a second as a fallback (other platforms, or a parent that died before
  the ``prctl``). Killing the main process therefore stops the workers at once, mid-shard; resume redoes that shard.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

_PR_SET_PDEATHSIG = 1
WATCHDOG_INTERVAL_S = 0.5
#: Set in every worker: any library that sizes a thread pool from the environment uses one thread.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _die_with_parent_kernel() -> bool:
    """Linux: have the kernel SIGKILL this process when its parent exits. False where unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(WATCHDOG_INTERVAL_S)


def _init(parent_pid: int, initializer: Callable[..., None] | None, initargs: tuple[Any, ...]) -> None:
    _die_with_parent_kernel()
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="parent-watchdog", daemon=True).start()
    for key in THREAD_ENV:
        os.environ[key] = "1"
    import torch

    torch.set_num_threads(1)
    if initializer is not None:
        initializer(*initargs)


def mp_context() -> Any:
    """fork where available (Linux): the worker inherits imported modules instead of importing them again."""
    return mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")


def worker_pool(
    workers: int, initializer: Callable[..., None] | None = None, initargs: tuple[Any, ...] = ()
) -> ProcessPoolExecutor:
    """A process pool whose workers start fast, use one thread and die with this process."""
    return ProcessPoolExecutor(
        workers, mp_context=mp_context(), initializer=_init, initargs=(os.getpid(), initializer, initargs)
    )
