"""Finish an output file on a background thread: fsync it, close it, rename its temp name into place.

The closing fsync of a shard waits for the disk (about a tenth of fp8-to-bf16's time when done inline); on its own
thread it overlaps the conversion of the next shard (``fsync`` releases the GIL). The final name still appears
only after the fsync succeeded, so a crash at any point leaves at most a temp file, which a rerun removes and
redoes. Callers keep at most one file pending, so unsynced data stays bounded by one shard, and ``wait`` for it
before reporting the shard done.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import BinaryIO


class DurableRename:
    """fsync + close + rename of one fully written temp file, started now, finished by ``wait``."""

    def __init__(self, f: BinaryIO, tmp: Path, final: Path) -> None:
        self._f, self._tmp, self._final = f, tmp, final
        self._error: BaseException | None = None
        f.flush()
        self._thread = threading.Thread(target=self._run, name=f"fsync-{final.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            try:
                os.fsync(self._f.fileno())
            finally:
                self._f.close()
            self._tmp.replace(self._final)
        except BaseException as exc:  # re-raised by wait() on the converting thread
            self._error = exc
            self._tmp.unlink(missing_ok=True)

    def wait(self) -> None:
        """Block until the file is durable under its final name; raises what went wrong on the thread."""
        self._thread.join()
        if self._error is not None:
            raise self._error
