"""Atomic writes: the target appears complete or not at all, and a failed write leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from r1_ascend import atomic
from r1_ascend.atomic import (
    atomic_open,
    atomic_path,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    remove_stale_temps,
    temp_glob,
    temp_path,
)


@settings(max_examples=50, deadline=None)
@given(data=st.binary(max_size=4096))
def test_bytes_round_trip_and_replace(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    out = tmp_path_factory.mktemp("a") / "sub" / "f.bin"
    atomic_write_bytes(out, b"old")
    atomic_write_bytes(out, data)
    assert out.read_bytes() == data
    assert sorted(p.name for p in out.parent.iterdir()) == ["f.bin"]


def test_text_and_json(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "t.txt", "a\nb\u00e9\n")
    assert (tmp_path / "t.txt").read_bytes() == "a\nb\u00e9\n".encode()
    atomic_write_json(tmp_path / "m.json", {"b": 1, "a": [1, 2]}, sort_keys=True)
    text = (tmp_path / "m.json").read_text()
    assert text.endswith("\n")
    assert text.index('"a"') < text.index('"b"')
    assert json.loads(text) == {"a": [1, 2], "b": 1}


@pytest.mark.parametrize("how", ["open", "path"])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path, how: str) -> None:
    target = tmp_path / "keep.bin"
    target.write_bytes(b"old")

    def fail() -> None:
        if how == "open":
            with atomic_open(target) as f:
                f.write(b"half")
                raise RuntimeError("boom")
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail()
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.bin"]


def test_file_and_directory_are_fsynced_before_the_name_appears(tmp_path: Path, monkeypatch) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, Path.replace

    def fsync(fd: int) -> None:
        events.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        real_fsync(fd)

    def replace(self: Path, target: Path) -> Path:
        events.append("rename")
        return real_replace(self, target)

    monkeypatch.setattr(atomic.os, "fsync", fsync)
    monkeypatch.setattr(Path, "replace", replace)
    atomic_write_bytes(tmp_path / "x", b"1")
    with atomic_path(tmp_path / "y") as tmp:
        tmp.write_bytes(b"2")
    assert events == ["file", "rename", "dir"] * 2


def test_one_temp_naming_scheme(tmp_path: Path) -> None:
    a, b = temp_path(tmp_path / "model.safetensors"), temp_path(tmp_path / "model.safetensors")
    assert a != b
    assert a.parent == tmp_path
    assert a.name.startswith(f".model.safetensors.tmp-{os.getpid()}-")
    a.touch()
    assert list(tmp_path.glob(temp_glob())) == [a]
    (tmp_path / "__0_0.distcp").touch()
    temp_path(tmp_path / "__0_0.distcp").touch()
    (tmp_path / ".hidden").touch()
    assert len(list(tmp_path.glob(temp_glob("__*.distcp")))) == 1
    assert remove_stale_temps(tmp_path) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden", "__0_0.distcp"]


def test_a_killed_writer_leaves_only_a_temp_file(tmp_path: Path) -> None:
    code = (
        "import os, signal, sys; from pathlib import Path; from r1_ascend.atomic import atomic_open\n"
        "with atomic_open(Path(sys.argv[1])) as f:\n"
        "    f.write(b'partial'); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out.bin")], check=False)
    assert done.returncode == -signal.SIGKILL
    assert not (tmp_path / "out.bin").exists()
    assert len(list(tmp_path.glob(temp_glob("out.bin")))) == 1


def test_background_commit_names_the_file_only_after_wait(tmp_path: Path, monkeypatch) -> None:
    """The fsync runs on a thread; until ``wait`` returns the target may be absent, afterwards it is complete."""
    release = threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        release.wait(5)
        real_fsync(fd)

    monkeypatch.setattr(atomic.os, "fsync", slow_fsync)
    target = tmp_path / "shard.bin"
    with atomic.atomic_open_background(target) as (f, commit):
        f.write(b"payload")
    assert not target.exists(), "renamed before its fsync finished"
    release.set()
    commit.wait()
    assert target.read_bytes() == b"payload"
    assert not list(tmp_path.glob(temp_glob()))


def test_background_commit_errors_are_raised_by_wait_and_leave_no_file(tmp_path: Path, monkeypatch) -> None:
    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    target = tmp_path / "shard.bin"

    def fail_in_block() -> None:
        with atomic.atomic_open_background(target) as (f, _):
            f.write(b"x")
            raise RuntimeError("in the block")

    with pytest.raises(RuntimeError, match="in the block"):
        fail_in_block()
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(atomic.os, "fsync", failing_fsync)
    with atomic.atomic_open_background(target) as (f, commit):
        f.write(b"y")
    with pytest.raises(OSError, match="Input/output"):
        commit.wait()
    assert list(tmp_path.iterdir()) == []
