"""Whether a process still reads its children's exit statuses (a test-suite guard, conftest.py)."""

from __future__ import annotations

import signal


def sigchld_ignored(status_path: str = "/proc/self/status") -> bool:
    """Whether this process ignores SIGCHLD at the kernel (``SigIgn`` in /proc/self/status), whoever set it: a C
    library's ``sigaction`` is invisible to :func:`signal.getsignal`. Ignored, the kernel reaps every child at once and
    ``subprocess`` reads an exit status of 0 for a child that failed or was killed."""
    with open(status_path, encoding="ascii") as status:
        ignored = next(line for line in status if line.startswith("SigIgn:")).split()[1]
    return bool(int(ignored, 16) >> (signal.SIGCHLD - 1) & 1)
