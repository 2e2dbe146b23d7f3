"""What can be known about an installed MindSpeed without importing it (importing it patches Megatron and torch).

MindSpeed is installed from a git checkout (``pip install -e``), so its commit is read from that checkout's
``.git`` directory, and the registration the ``mindspeed_torch_compile`` patch relies on is checked in its source.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

#: Where MindSpeed (at the pinned commit) registers its ``torch.compile`` stand-in.
COMPILE_REGISTRATION_FILE = Path("features_manager", "megatron_basic", "requirements_basic.py")
_COMPILE_REGISTRATION = re.compile(r"register_patch\(\s*['\"]torch\.compile['\"]")


@dataclass(frozen=True)
class MindSpeedSource:
    package_dir: Path
    commit: str | None  # None when the package is not inside a git checkout
    registers_torch_compile: bool


def find_mindspeed() -> MindSpeedSource | None:
    """The installed MindSpeed package, or None when it is not importable."""
    spec = importlib.util.find_spec("mindspeed")
    if spec is None or not spec.submodule_search_locations:
        return None
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    registration = package_dir / COMPILE_REGISTRATION_FILE
    registers = registration.is_file() and bool(
        _COMPILE_REGISTRATION.search(registration.read_text(encoding="utf-8", errors="replace"))
    )
    return MindSpeedSource(package_dir, git_commit(package_dir), registers)


def git_commit(start: Path) -> str | None:
    """The commit checked out in the git work tree containing ``start`` (read from .git, no git binary needed)."""
    for directory in (start, *start.parents):
        git = directory / ".git"
        if git.is_file():  # a worktree or submodule: "gitdir: <path>"
            target = git.read_text(encoding="utf-8").strip().removeprefix("gitdir:").strip()
            git = (directory / target).resolve()
        if git.is_dir():
            return _resolve_head(git)
    return None


def _resolve_head(git_dir: Path) -> str | None:
    head = (git_dir / "HEAD").read_text(encoding="utf-8").strip()
    if not head.startswith("ref:"):
        return head or None
    ref = head.removeprefix("ref:").strip()
    loose = git_dir / ref
    if loose.is_file():
        return loose.read_text(encoding="utf-8").strip()
    packed = git_dir / "packed-refs"
    if packed.is_file():
        for line in packed.read_text(encoding="utf-8").splitlines():
            if line.endswith(f" {ref}"):
                return line.split(" ", 1)[0]
    return None
