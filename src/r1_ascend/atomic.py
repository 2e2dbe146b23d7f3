"""Atomic file writes: a file appears under its name complete and on disk, or not at all.

Every writer in the project (datasets, checkpoints, manifests, indexes) goes through here, so there is one rule:
the data is written to a temporary sibling named ``.<name>.tmp-<pid>-<random>``, flushed and fsynced, renamed
over the target, and the directory is fsynced so that the rename itself survives a power loss. On any error the
temporary file is deleted and the target is left as it was. A process killed mid-write leaves only a temporary
file, which ``remove_stale_temps`` (or a resume) clears. Files are created with ``open`` (not ``mkstemp``), so they
get the usual permissions from the umask.

``atomic_open_background`` is the same rule with the closing fsync and rename on a thread of their own, for a
writer that produces one large file after another: the fsync waits for the disk while the next file is computed
(``fsync`` releases the GIL), and the name still appears only once the data is durable.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

#: What every temporary name carries between the target's name and the writer's pid.
TEMP_MARK = ".tmp-"


def temp_path(path: Path) -> Path:
    """The temporary sibling of ``path``: hidden, and unique per process and per call."""
    return path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


def temp_glob(name: str = "*") -> str:
    """A glob matching the temporary files of targets named ``name`` (a glob itself), for resume clean-up."""
    return f".{name}{TEMP_MARK}*"


def remove_stale_temps(directory: Path, name: str = "*") -> int:
    """Delete the temporary files a killed run left in ``directory``; returns how many."""
    count = 0
    for tmp in directory.glob(temp_glob(name)):
        if tmp.is_file():
            tmp.unlink()
            count += 1
    return count


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (a no-op where directories cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def _commit(tmp: Path, path: Path) -> None:
    tmp.replace(path)
    fsync_dir(path.parent)


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield the temporary path to write ``path`` through (for writers that want a path, e.g. parquet).

    When the block succeeds the file is fsynced and renamed to ``path``; otherwise it is deleted. The parent
    directory is created if missing.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        yield tmp
        _fsync_file(tmp)
        _commit(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_open(path: Path) -> Iterator[BinaryIO]:
    """Yield a binary file open for writing; on success it is flushed, fsynced and renamed to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        with tmp.open("wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        _commit(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class BackgroundCommit:
    """The fsync, close and rename of one fully written temp file, on a thread; ``wait`` finishes it."""

    def __init__(self, f: BinaryIO, tmp: Path, path: Path) -> None:
        self._f, self._tmp, self._path = f, tmp, path
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._f.flush()
        self._thread = threading.Thread(target=self._run, name=f"commit-{self._path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            try:
                os.fsync(self._f.fileno())
            finally:
                self._f.close()
            _commit(self._tmp, self._path)
        except BaseException as exc:  # re-raised by wait() on the writing thread
            self._error = exc
            self._tmp.unlink(missing_ok=True)

    def wait(self) -> None:
        """Block until the file is durable under its name; raises what went wrong on the thread."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error


@contextmanager
def atomic_open_background(path: Path) -> Iterator[tuple[BinaryIO, BackgroundCommit]]:
    """Like ``atomic_open``, but when the block succeeds the fsync and rename start on a thread: call the yielded
    commit's ``wait`` before treating the file as written. On an error in the block the temp file is deleted."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    f = tmp.open("wb")
    commit = BackgroundCommit(f, tmp, path)
    try:
        yield f, commit
    except BaseException:
        f.close()
        tmp.unlink(missing_ok=True)
        raise
    commit.start()


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_open(path) as f:
        f.write(data)


def atomic_write_text(path: Path, text: str) -> None:
    """UTF-8 with ``\\n`` line ends on every platform."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, value: Any, *, sort_keys: bool = False) -> None:
    """Indented JSON with a final newline (manifests, indexes, configs)."""
    atomic_write_text(path, json.dumps(value, indent=2, sort_keys=sort_keys) + "\n")
