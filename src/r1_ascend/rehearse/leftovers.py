"""What of a rehearsal's run is still running anywhere on this machine, not only among the pids it recorded.

A process belongs to the run whose Ray temp dir is ``temp_dir`` when its command line, its environment or one of
its open files names that directory: the launch environment carries ``RAY_TEMP_DIR`` into every Ray process and
worker, a worker's output goes to its log under the Ray session, and what a worker forks inherits both, even once
it has been orphaned to PID 1 with a process title (``ray::WorkerDict.actor_rollout_save_checkpoint``) that names
nothing. A Ray worker (``ray::...``) started after the run began that no other Ray session claims counts as well.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import psutil

#: The title Ray gives its worker processes (``ray::IDLE``, ``ray::WorkerDict.method``, ``ray::Actor``).
RAY_WORKER_TITLE = "ray::"
#: The part of an open file's path that marks a Ray session directory (``<temp dir>/session_<date>/...``).
SESSION_MARK = "/session_"


@dataclass(frozen=True)
class Leftover:
    """A process of the run still running: pid, parent, title or command line, and what ties it to the run."""

    pid: int
    ppid: int
    command: str
    tie: str

    def describe(self) -> str:
        return f"pid {self.pid} (parent {self.ppid}): {self.command[:120]} [{self.tie}]"


def run_processes(temp_dir: str, since: float, *, ignore: Collection[int] = ()) -> list[Leftover]:
    """Every live process of the run whose Ray temp dir is ``temp_dir`` (zombies excluded), but the ``ignore``d
    ones and this process with its ancestors; ``since``: when the run began (seconds since the epoch)."""
    skip = {os.getpid(), *ignore, *(p.pid for p in psutil.Process().parents())}
    found = []
    for process in psutil.process_iter(["pid", "ppid", "cmdline", "create_time", "status"]):
        info = process.info
        if info["pid"] in skip or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        command = " ".join(info["cmdline"] or [])
        tie = _tie(process, command, temp_dir)
        if tie is None and command.startswith(RAY_WORKER_TITLE) and (info["create_time"] or 0) >= since:
            tie = "a Ray worker started during the run that no other Ray session claims"
            if _session_of(process) not in (None, temp_dir):
                tie = None
        if tie is not None:
            found.append(Leftover(info["pid"], info["ppid"] or 0, command, tie))
    return found


def _tie(process: psutil.Process, command: str, temp_dir: str) -> str | None:
    if temp_dir in command:
        return "command line"
    try:
        if any(temp_dir in value for value in process.environ().values()):
            return "environment"
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
        pass
    if any(path.startswith(temp_dir + "/") for path in _open_paths(process)):
        return "open files"
    return None


def _session_of(process: psutil.Process) -> str | None:
    """The Ray temp dir a process writes its session logs under (None: none found)."""
    try:
        value = process.environ().get("RAY_TEMP_DIR")
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
        value = None
    if value:
        return value
    for path in _open_paths(process):
        if SESSION_MARK in path:
            return path.split(SESSION_MARK, 1)[0]
    return None


def _open_paths(process: psutil.Process) -> list[str]:
    """Where the process's file descriptors point (stdout and stderr included, which psutil.open_files omits when
    they are pipes or terminals; log files count)."""
    root = f"/proc/{process.pid}/fd"
    paths = []
    try:
        names = os.listdir(root)
    except OSError:
        return paths
    for name in names:
        try:
            paths.append(os.readlink(f"{root}/{name}"))
        except OSError:
            continue
    return paths


def node_daemons(pid_files: Collection[Path]) -> set[int]:
    """The Ray processes of the live nodes that ``ray_start_npu.sh`` recorded (``ray start --block`` and its raylet,
    GCS, agents, log monitor): what a run's end leaves running by design. Their Ray workers, and what those forked,
    are not among them: they belong to a run."""
    daemons: set[int] = set()
    for pid_file in pid_files:
        try:
            root = psutil.Process(int(pid_file.read_text().strip()))
            tree = [root, *root.children(recursive=True)]
        except (OSError, ValueError, psutil.NoSuchProcess):
            continue
        workers: set[int] = set()
        for process in tree:
            try:
                if _is_worker(process):
                    workers |= {process.pid, *(c.pid for c in process.children(recursive=True))}
            except psutil.NoSuchProcess:
                continue
        daemons |= {p.pid for p in tree} - workers
    return daemons


def _is_worker(process: psutil.Process) -> bool:
    """A Ray worker: titled ``ray::...``, or still starting (``python .../default_worker.py ...``; the raylet's own
    command line names that script too, as an option, not as what it runs)."""
    command = process.cmdline()
    return bool(command) and (
        command[0].startswith(RAY_WORKER_TITLE) or any(arg.endswith("default_worker.py") for arg in command[1:3])
    )
