"""The static check of a patch target (r1_ascend.patches.source_check) reads the installed file as it is now: a parse
is reused only while the file is unchanged on disk."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from r1_ascend.patches import Target, source_check


@pytest.fixture
def upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    package = tmp_path / "fake_upstream_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_upstream_pkg", raising=False)
    return package / "workers.py"


def _check(params: tuple[str, ...]) -> source_check.StaticResult:
    return source_check.check_static(Target("fake_upstream_pkg.workers", "Worker.step", "fake", params))


def test_a_target_changed_on_disk_is_checked_against_the_new_source(upstream: Path) -> None:
    upstream.write_text("class Worker:\n    def step(self, batch):\n        pass\n")
    assert _check(("self", "batch")).ok
    assert _check(("self", "batch")).ok, "the same file checked twice"
    upstream.write_text("class Worker:\n    def step(self, batch, *, timeout):\n        pass\n")
    stat = upstream.stat()
    os.utime(upstream, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a later modification time, always
    assert not _check(("self", "batch")).ok
    assert _check(("self", "batch", "timeout")).ok
    upstream.write_text("class Worker:\n    pass\n")
    assert not _check(("self", "batch", "timeout")).ok
