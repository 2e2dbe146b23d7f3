"""Where a run writes: mounts read from mountinfo, the container's own disk, writability, and preflight's line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from r1_ascend.launch import output_dir
from r1_ascend.launch.checks import ERROR, OK, WARNING, check_output_dir
from r1_ascend.launch.output_dir import Mount, mount_of, on_container_root, parse_mountinfo, unwritable

#: /proc/self/mountinfo of a container: the overlay root, a bind-mounted shared directory, a path with a space.
CONTAINER = """\
500 400 0:52 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
a line of another shape, between two mounts
501 500 0:53 / /proc rw,nosuid - proc proc rw
502 500 259:1 /export/shared /shared rw,relatime - nfs4 10.0.0.9:/export rw,vers=4.2
503 502 259:2 / /shared/fast\\040disk rw - xfs /dev/nvme1n1 rw
bad line without the separator
"""


def test_mountinfo_is_read_as_the_kernel_writes_it():
    mounts = parse_mountinfo(CONTAINER)
    assert [m.point for m in mounts] == ["/", "/proc", "/shared", "/shared/fast disk"]
    assert mounts[0] == Mount("/", "overlay", "overlay")  # after its optional field (master:1)
    assert mounts[2] == Mount("/shared", "nfs4", "10.0.0.9:/export")


@pytest.mark.parametrize(
    ("escaped", "plain"),
    [("/a\\040b", "/a b"), ("/a\\011b", "/a\tb"), ("/a\\012b", "/a\nb"), ("/a\\134b", "/a\\b"), ("/a\\0b", "/a\\0b")],
)
def test_octal_escapes_in_paths_are_read_back(escaped, plain):
    (mount,) = parse_mountinfo(f"1 0 8:1 / {escaped} rw - ext4 /dev/{escaped[1:]} rw")
    assert mount.point == plain
    assert mount.source == "/dev/" + plain[1:]


@pytest.mark.parametrize(
    "line",
    [
        "1 0 8:1 / /x rw ext4 /dev/sda rw",  # no separator
        "1 0 8:1 / - ext4 /dev/sda",  # fewer than six fields before it
        "1 0 8:1 / /x rw - ext4",  # no source after the type
        "",
    ],
)
def test_lines_not_of_the_kernels_shape_are_skipped(line):
    assert parse_mountinfo(line) == []


def test_a_line_ending_at_its_source_is_a_mount():
    assert parse_mountinfo("1 0 8:1 / /x rw - ext4 /dev/sda") == [Mount("/x", "ext4", "/dev/sda")]


def test_a_mount_point_named_like_the_separator_is_still_a_mount_point():
    (mount,) = parse_mountinfo("1 0 8:1 / /x rw,relatime - - /dev/sda rw")  # fstype "-" after the separator
    assert mount == Mount("/x", "-", "/dev/sda")


def test_read_mounts_reads_the_file_and_survives_its_absence(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_bytes(b"1 0 8:1 / /caf\xe9 rw - ext4 /dev/sda rw\n")  # not UTF-8: replaced, not fatal
    (mount,) = output_dir.read_mounts(info)
    assert mount.point.startswith("/caf")
    assert mount.fstype == "ext4"
    assert output_dir.read_mounts(tmp_path / "missing") == []


@pytest.mark.parametrize(
    ("path", "point"),
    [
        ("/opt/r1-ascend/outputs", "/"),
        ("/shared/outputs/checkpoints", "/shared"),
        ("/shared", "/shared"),
        ("/sharedx/outputs", "/"),  # a prefix of the name is not a parent
        ("/shared/fast disk/run", "/shared/fast disk"),
    ],
)
def test_the_mount_of_a_path_is_the_longest_containing_mount_point(path, point):
    found = mount_of(Path(path), parse_mountinfo(CONTAINER))
    assert found is not None
    assert found.point == point


def test_the_last_mounted_of_two_on_one_point_wins():
    mounts = [Mount("/shared", "ext4", "a"), Mount("/shared", "nfs4", "b")]
    assert mount_of(Path("/shared/x"), mounts) == mounts[1]
    assert mount_of(Path("/x"), []) is None


@pytest.mark.parametrize(
    ("mount", "expected"),
    [
        (Mount("/", "overlay", "overlay"), True),
        (Mount("/", "fuse.fuse-overlayfs", "x"), True),
        (Mount("/", "ext4", "/dev/vda"), False),  # a host or VM root
        (Mount("/shared", "overlay", "overlay"), False),  # an overlay mounted elsewhere is not the container's root
        (None, False),
    ],
)
def test_only_an_overlay_on_root_is_the_containers_own_disk(mount, expected):
    assert on_container_root(mount) is expected


def test_writability_asks_for_write_and_search_permission(monkeypatch, tmp_path):
    asked = []

    def access(path, mode):
        asked.append(mode)
        return False

    monkeypatch.setattr(output_dir.os, "access", access)
    assert "is not writable by this user" in unwritable(tmp_path / "run")
    assert asked == [os.W_OK | os.X_OK]


def test_writability_is_judged_at_the_nearest_existing_directory(tmp_path):
    assert unwritable(tmp_path / "a" / "b") is None
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert "exists and is not a directory" in unwritable(blocker / "sub")
    if os.getuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert "is not writable" in unwritable(locked / "run")


class _Run:
    def __init__(self, path: str, nnodes: int) -> None:
        from omegaconf import OmegaConf

        self.config = OmegaConf.create({"trainer": {"default_local_dir": path, "nnodes": nnodes}})


@pytest.mark.parametrize(("nnodes", "level"), [(1, WARNING), (2, ERROR)])
def test_preflight_refuses_the_containers_disk_on_a_cluster_and_warns_on_one_node(monkeypatch, tmp_path, nnodes, level):
    monkeypatch.setattr(output_dir, "read_mounts", lambda: [Mount("/", "overlay", "overlay")])
    monkeypatch.setattr("r1_ascend.launch.checks.read_mounts", lambda: [Mount("/", "overlay", "overlay")])
    (finding,) = check_output_dir(_Run(str(tmp_path / "ckpt"), nnodes))
    assert finding.level == level
    assert "container's own file system" in finding.message
    assert "OUTPUT_DIR=/shared" in finding.message


@pytest.mark.parametrize(("nnodes", "level"), [(1, WARNING), (16, ERROR)])
def test_a_relative_checkpoint_dir_is_named(nnodes, level):
    (finding,) = check_output_dir(_Run("outputs/checkpoints/x", nnodes))
    assert finding.level == level
    assert "is relative" in finding.message


def test_a_writable_shared_directory_passes_naming_its_mount(monkeypatch, tmp_path):
    monkeypatch.setattr("r1_ascend.launch.checks.read_mounts", lambda: [Mount("/", "nfs4", "server:/")])
    (finding,) = check_output_dir(_Run(str(tmp_path / "ckpt"), 16))
    assert finding.level == OK
    assert "nfs4 mounted at /" in finding.message


def test_an_uncreatable_directory_is_an_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    (finding,) = check_output_dir(_Run(str(blocker / "ckpt"), 1))
    assert finding.level == ERROR
    assert "cannot be created" in finding.message
