"""Where a run writes: its checkpoint directory must be writable and must outlive the container.

The image's working directory is the checkout inside the container; a relative or unset output directory lands on the
container's own writable layer (an overlay file system mounted on ``/``), which ``docker run --rm`` deletes with the
container: days of checkpoints lost. The mount a path lives on is read from ``/proc/self/mountinfo`` (the longest
mount point that contains it), so the rule is the kernel's view, not a guess from the path. Whether every node sees the
same directory is checked by the head before the launch (:mod:`r1_ascend.launch.shared_dir`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
#: File systems a container's root is built from (Docker's overlay2, older aufs, Podman's fuse-overlayfs).
CONTAINER_ROOT_TYPES = frozenset({"overlay", "aufs", "fuse.fuse-overlayfs"})


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    source: str


_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as three-digit octal escapes (``\\040``)."""
    return _OCTAL.sub(lambda match: chr(int(match.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of ``/proc/self/mountinfo`` text: ``ID PARENT MAJOR:MINOR ROOT POINT OPTIONS [OPTIONAL...] - TYPE
    SOURCE SUPER``; a line not of that shape is skipped (the kernel writes them all so)."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        separator = fields.index("-", 6)
        if len(fields) >= separator + 3:
            mounts.append(Mount(_unescape(fields[4]), fields[separator + 1], _unescape(fields[separator + 2])))
    return mounts


def mount_of(path: Path, mounts: list[Mount]) -> Mount | None:
    """The mount ``path`` (absolute) lives on: the last-mounted of the longest mount points containing it."""
    best: Mount | None = None
    for mount in mounts:
        point = Path(mount.point)
        if (path == point or point in path.parents) and (best is None or len(mount.point) >= len(best.point)):
            best = mount
    return best


def on_container_root(mount: Mount | None) -> bool:
    return mount is not None and mount.point == "/" and mount.fstype in CONTAINER_ROOT_TYPES


def nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def unwritable(path: Path) -> str | None:
    """Why this user cannot create ``path`` (absolute), or None when it can (it exists as a writable directory, or
    its nearest existing ancestor is one)."""
    existing = nearest_existing(path)
    if not existing.is_dir():
        return f"{existing} exists and is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable by this user (uid {os.getuid()})"
    return None


def read_mounts(mountinfo: Path = MOUNTINFO) -> list[Mount]:
    try:
        return parse_mountinfo(mountinfo.read_bytes().decode(errors="replace"))
    except OSError:
        return []
