"""Doctor's view of an installed MindSpeed checkout: its commit (read from .git) and the torch.compile registration."""

from __future__ import annotations

from pathlib import Path

import pytest

from r1_ascend import doctor
from r1_ascend.mindspeed_source import COMPILE_REGISTRATION_FILE, find_mindspeed, git_commit
from r1_ascend.stack import pins

PINNED = pins()["sources"]["mindspeed"]["commit"]
OTHER = "0123456789abcdef0123456789abcdef01234567"


def _checkout(root: Path, *, commit: str, packed: bool, registers: bool) -> Path:
    """A MindSpeed-shaped git work tree: HEAD on a branch whose commit is loose or in packed-refs."""
    git = root / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/master\n")
    if packed:
        (git / "packed-refs").write_text(f"# pack-refs with: peeled\n{commit} refs/heads/master\n")
    else:
        (git / "refs" / "heads" / "master").write_text(f"{commit}\n")
    package = root / "mindspeed"
    registration = package / COMPILE_REGISTRATION_FILE
    registration.parent.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    body = "        pm.register_patch('torch.compile', dummy_compile)\n" if registers else "pass\n"
    registration.write_text(body)
    return package


@pytest.mark.parametrize("packed", [False, True])
def test_commit_is_read_from_the_checkout(tmp_path: Path, packed: bool) -> None:
    package = _checkout(tmp_path, commit=PINNED, packed=packed, registers=True)
    assert git_commit(package) == PINNED


def test_detached_head_and_no_checkout(tmp_path: Path) -> None:
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / ".git" / "HEAD").write_text(f"{OTHER}\n")
    assert git_commit(tmp_path / "repo" / "mindspeed") == OTHER
    assert git_commit(Path("/")) is None


@pytest.mark.parametrize(
    ("commit", "registers", "verdict", "text"),
    [
        (PINNED, True, "ok", PINNED[:8]),
        (OTHER, True, "FAIL", f"checkout at {OTHER[:8]}"),
        (PINNED, False, "FAIL", "no torch.compile registration"),
    ],
)
def test_doctor_row_for_an_installed_mindspeed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, commit: str, registers: bool, verdict: str, text: str
) -> None:
    _checkout(tmp_path, commit=commit, packed=False, registers=registers)
    monkeypatch.syspath_prepend(str(tmp_path))
    source = find_mindspeed()
    assert source is not None
    assert source.package_dir == tmp_path / "mindspeed"
    row = doctor.mindspeed_row(npu_present=True)
    assert (row.verdict, text in row.found) == (verdict, True), row


def test_missing_mindspeed_fails_only_on_an_npu_machine() -> None:
    assert doctor.mindspeed_row(npu_present=False).verdict == "note"
    assert doctor.mindspeed_row(npu_present=True).verdict == "FAIL"
