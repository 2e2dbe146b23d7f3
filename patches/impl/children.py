"""What a training worker forks ends with it, however the worker ends.

A Ray worker forks helpers that outlive it unless someone stops them: megatron-core's dist-checkpoint writer forks a
``multiprocessing`` Manager at the first save (``filesystem_async._get_write_results_queue``), which serves until
told to stop. When the worker is killed on a live node, the raylet (Ray's subreaper mode, scripts/npu_env.sh) adopts
and kills it within 10 s. When the raylet itself dies (the node's Ray is killed, OOM-killed or crashes), Ray's worker
notices and exits (it polls its raylet's pid), but the processes it forked are orphaned to PID 1 and run for good:
on a cluster they keep the worker's device memory, and the relaunch on that node fails.

:func:`end_children_with_this_process` registers a fork handler in the worker: every child it forks (``os.fork``,
``multiprocessing``'s fork start method) asks the kernel to SIGKILL it when its parent ends (``PR_SET_PDEATHSIG``),
and, when it was forked from another thread than the main one (the kernel ties the signal to the forking thread's
end, not the process's), watches its parent from a thread instead. The handler is inherited, so a child's children
follow it too. Processes started with ``exec`` (``subprocess``) are not covered: they end through the raylet's
subreaper, or ``scripts/ray_start_npu.sh`` (``stop``, or the start that brings a lost node back) stops them.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading

logger = logging.getLogger(__name__)

#: prctl(2) option: the signal this process gets when the thread that forked it ends.
PR_SET_PDEATHSIG = 1
#: How often a child forked off the main thread checks that its parent still lives.
WATCH_S = 0.5

_installed = False
_lock = threading.Lock()
_forker: tuple[int, bool] = (0, True)  # (pid of the process about to fork, whether its main thread forks)


def end_children_with_this_process() -> None:
    """From now on, every child this process forks ends when this process ends (installed once per process)."""
    global _installed
    with _lock:
        if _installed:
            return
        os.register_at_fork(before=_before_fork, after_in_child=_follow_parent)
        _installed = True


def _before_fork() -> None:
    global _forker
    _forker = (os.getpid(), threading.current_thread() is threading.main_thread())


def _follow_parent() -> None:
    parent, from_main = _forker
    if not parent:
        return
    if from_main and _set_parent_death_signal(signal.SIGKILL):
        if os.getppid() != parent:  # the parent ended before the signal was asked for
            os.kill(os.getpid(), signal.SIGKILL)
        return
    threading.Thread(target=_watch, args=(parent,), name="r1-ascend-follow-parent", daemon=True).start()


def _set_parent_death_signal(sig: signal.Signals) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def _watch(parent: int) -> None:
    stop = threading.Event()
    while not stop.wait(WATCH_S):
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
