"""An output shard written by a background thread, so disk work overlaps the conversion that feeds it.

The converting thread fills staging buffers (dequantised bands land in them directly, copied tensors are read into
them) and hands each full buffer to this file's writer thread, which writes it, starts its write-back and gives the
buffer back. ``finish`` queues the closing ``fsync`` and the rename of the temp file into place on the same thread,
so the caller can start the next shard while this one reaches the disk. The final name appears only after the
fsync succeeded, and only if exactly the promised number of bytes was written: a crash at any point leaves at most
a temp file, which a rerun removes and redoes. ``write`` and ``fsync`` release the GIL, so the thread runs in
parallel with torch kernels and reads.

Memory: a process holds one ``BufferRing`` of ``count`` buffers (two of 32 MiB in the converter) shared by all its
shards; the caller blocks on a free buffer, so no more than that is ever staged.
"""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path

import torch

#: Start write-back (``posix_fadvise(DONTNEED)``) every this many bytes written: the disk works while the next
#: bands are computed, the closing fsync finds little left, and the output does not crowd the page cache.
WRITEBACK_BYTES = 32 << 20


class BufferRing:
    """``count`` reusable byte buffers passed between the computing thread and the writer threads."""

    def __init__(self, count: int, capacity: int) -> None:
        self.capacity = capacity
        self._free: queue.SimpleQueue[torch.Tensor] = queue.SimpleQueue()
        for _ in range(count):
            self._free.put(torch.empty(0, dtype=torch.uint8))  # allocated on first use, at the size it needs

    def take(self, nbytes: int) -> torch.Tensor:
        """A free buffer of at least ``nbytes`` (blocks until a writer gives one back)."""
        buf = self._free.get()
        if buf.numel() < nbytes:
            buf = torch.empty(max(nbytes, self.capacity), dtype=torch.uint8)
        return buf

    def give(self, buf: torch.Tensor) -> None:
        self._free.put(buf)


class ShardFile:
    """One output file: staged through ``reserve``/``commit``, written and made durable on its own thread."""

    def __init__(self, tmp: Path, final: Path, size: int, ring: BufferRing) -> None:
        self._tmp, self._final, self._size, self._ring = tmp, final, size, ring
        self._fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        self._jobs: queue.SimpleQueue[tuple[str, torch.Tensor | None, int]] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._buf: torch.Tensor | None = None
        self._fill = 0
        self._staged = 0
        self._thread = threading.Thread(target=self._run, name=f"write-{final.name}", daemon=True)
        self._thread.start()

    # --- converting thread -------------------------------------------------------------------------------------
    def reserve(self, nbytes: int, *, align: int = 1) -> torch.Tensor:
        """``nbytes`` of staging space (a uint8 tensor starting at a multiple of ``align``) for the next bytes of
        the file; fill it, then ``commit(nbytes)``."""
        self._raise_if_failed()
        buf = self._buf
        if buf is not None and (self._fill % align or self._fill + nbytes > buf.numel()):
            self._submit()
            buf = None
        if buf is None:
            buf = self._buf = self._ring.take(nbytes)
            self._fill = 0
        return buf[self._fill : self._fill + nbytes]

    def commit(self, nbytes: int) -> None:
        self._fill += nbytes
        self._staged += nbytes

    def write(self, data: bytes) -> None:
        """Stage a small piece of bytes (the header)."""
        view = self.reserve(len(data))
        memoryview(view.numpy())[:] = data
        self.commit(len(data))

    def finish(self) -> None:
        """Queue the last bytes, the fsync and the rename; ``wait`` for them (and for any write error)."""
        if self._staged != self._size:
            self.abort()
            msg = f"internal error: {self._final.name} got {self._staged} bytes, its header promises {self._size}"
            raise RuntimeError(msg)
        self._submit()
        self._jobs.put(("close", None, 0))

    def abort(self) -> None:
        """Stop writing, wait for the thread, delete the temp file. Never raises the writer's error."""
        if self._buf is not None:
            self._ring.give(self._buf)
            self._buf = None
        self._jobs.put(("abort", None, 0))
        self._thread.join()

    def wait(self) -> None:
        """Block until the file is fsynced and renamed into place; raises what went wrong on the writer thread."""
        self._thread.join()
        self._raise_if_failed()

    def _submit(self) -> None:
        if self._buf is not None:
            if self._fill:
                self._jobs.put(("write", self._buf, self._fill))
            else:
                self._ring.give(self._buf)
            self._buf = None

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    # --- writer thread -----------------------------------------------------------------------------------------
    def _run(self) -> None:
        pos = advised = 0
        while True:
            op, buf, n = self._jobs.get()
            if op == "write":
                assert buf is not None
                try:
                    if self._error is None:
                        pos += self._write_all(memoryview(buf.numpy())[:n])
                        if pos - advised >= WRITEBACK_BYTES and hasattr(os, "posix_fadvise"):
                            os.posix_fadvise(self._fd, advised, pos - advised, os.POSIX_FADV_DONTNEED)
                            advised = pos
                except BaseException as exc:  # handed to the converting thread, which re-raises it
                    self._error = exc
                finally:
                    self._ring.give(buf)  # always: the converting thread may be waiting for it
                continue
            self._close(durable=op == "close" and self._error is None)
            return

    def _write_all(self, data: memoryview) -> int:
        done = 0
        while done < len(data):
            done += os.write(self._fd, data[done:])
        return done

    def _close(self, *, durable: bool) -> None:
        try:
            if durable:
                os.fsync(self._fd)
        except BaseException as exc:
            self._error = exc
        finally:
            os.close(self._fd)
        try:
            if durable and self._error is None:
                self._tmp.replace(self._final)
        except BaseException as exc:
            self._error = exc
        if not durable or self._error is not None:
            self._tmp.unlink(missing_ok=True)
