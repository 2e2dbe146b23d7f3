"""Throughput and ETA lines on stderr, at most about once a second, so long conversions show they are alive."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class Progress:
    """Counts processed bytes against a known total."""

    def __init__(self, label: str, total_bytes: int, *, stream: TextIO | None = None, enabled: bool = True):
        self.label = label
        self.total = max(total_bytes, 1)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self._start = time.monotonic()
        self._last = 0.0

    def skip(self, nbytes: int) -> None:
        """Bytes already done by an earlier run: excluded from the rate."""
        self.total = max(self.total - nbytes, 1)

    def add(self, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if now - self._last >= 1.0:
            self._last = now
            self._print(now)

    def rate(self) -> float:
        return self.done / max(time.monotonic() - self._start, 1e-9)

    def _print(self, now: float, final: bool = False) -> None:
        if not self.enabled:
            return
        elapsed = now - self._start
        rate = self.done / max(elapsed, 1e-9)
        pct = 100.0 * self.done / self.total
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        tail = f"done in {_duration(elapsed)}" if final else f"ETA {_duration(eta) if eta != float('inf') else '?'}"
        print(
            f"[{self.label}] {_human(self.done)}/{_human(self.total)} ({pct:5.1f}%) {_human(rate)}/s {tail}",
            file=self.stream,
            flush=True,
        )

    def finish(self) -> None:
        self._print(time.monotonic(), final=True)
