"""What every stage of the rehearsal shares: its error, its progress lines, and reading a log that may not exist yet."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


class RehearsalError(RuntimeError):
    """A stage of the rehearsal failed; the message says which and where its log is."""


def log_progress(message: str) -> None:
    """A progress line on stdout. Once the reader has gone (``rehearse ... | head``, a closed terminal), lines are
    dropped rather than raised: a BrokenPipeError here ended the cleanup that stops the Ray nodes."""
    try:
        print(f"[rehearse {time.strftime('%H:%M:%S')}] {message}", flush=True)
    except BrokenPipeError:
        # what Python's docs advise for SIGPIPE: point stdout at /dev/null, so no later write or the exit flush raises
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def read_log(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""
