"""Every node sees the head's OUTPUT_DIR: the token, the marks, and the head's wait that names who does not.

The cluster's nodes are stood in for by ``ray_cluster``'s own connection (``_connect``), answering with a node table;
the token and the marks are real files in a temporary directory, as on a shared file system.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from r1_ascend.launch import ray_cluster, shared_dir
from r1_ascend.launch.ray_cluster import ClusterState


def test_the_head_writes_a_fresh_random_token_under_a_directory_it_creates(tmp_path):
    shared = tmp_path / "outputs" / ".r1-ascend" / "cluster"  # OUTPUT_DIR may be new
    token = shared_dir.write_token(shared)
    assert (shared / shared_dir.TOKEN).read_text() == token + "\n"
    assert len(token) == 2 * shared_dir.TOKEN_BYTES
    assert int(token, 16) >= 0
    assert shared_dir.write_token(shared) != token


def test_a_node_marks_the_current_token_and_a_fresh_token_drops_old_marks(tmp_path):
    token = shared_dir.write_token(tmp_path)
    assert shared_dir.mark(tmp_path, "10.0.0.2", timeout=1) == token
    assert shared_dir.unmarked(tmp_path, ["10.0.0.2", "10.0.0.3"]) == ["10.0.0.3"]
    again = shared_dir.write_token(tmp_path)
    assert again != token
    assert shared_dir.unmarked(tmp_path, ["10.0.0.2"]) == ["10.0.0.2"], "a mark of an earlier start does not count"
    assert not (tmp_path / shared_dir.NODES / "10.0.0.2").exists()


def test_a_mark_with_another_token_does_not_count(tmp_path):
    shared_dir.write_token(tmp_path)
    (tmp_path / shared_dir.NODES / "10.0.0.2").write_text("not-the-token\n")
    assert shared_dir.unmarked(tmp_path, ["10.0.0.2"]) == ["10.0.0.2"]


def test_without_a_token_nothing_is_marked(tmp_path):
    assert shared_dir.unmarked(tmp_path, ["10.0.0.2"]) == ["10.0.0.2"]
    assert shared_dir.unmarked(tmp_path, []) == []


def test_a_node_that_sees_no_token_says_so_in_time(tmp_path):
    start = time.monotonic()
    expected = (
        f"no token at {tmp_path / shared_dir.TOKEN} after 0.3 s: the head writes it there before it starts Ray, so "
        "this node does not see the head's OUTPUT_DIR (a local directory, or another mount)"
    )
    with pytest.raises(FileNotFoundError) as raised:
        shared_dir.mark(tmp_path, "10.0.0.2", timeout=0.3, poll=0.05)
    assert str(raised.value) == expected
    assert time.monotonic() - start < 2
    assert not (tmp_path / shared_dir.NODES).exists(), "no mark is written without the token"


def test_a_token_that_appears_late_is_waited_for(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = shared_dir.read_text

    def late(path: Path) -> str | None:
        calls["n"] += 1
        return None if calls["n"] < 3 else real(path)

    token = shared_dir.write_token(tmp_path)
    monkeypatch.setattr(shared_dir, "read_text", late)
    assert shared_dir.mark(tmp_path, "10.0.0.2", timeout=5, poll=0.01) == token


def _cluster(monkeypatch, npus: dict[str, float]) -> None:
    monkeypatch.setattr(ray_cluster, "gcs_unreachable", lambda address: None)
    monkeypatch.setattr(ray_cluster, "_connect", lambda address, node_ip: lambda: ClusterState(dict(npus)))


def _wait(shared: Path, **extra: str) -> list[str]:
    argv = ["wait", "--address", "10.0.0.1:6766", "--node-ip", "10.0.0.1", "--nodes", "2", "--npus-per-node", "16"]
    argv += ["--timeout", "30", "--shared-dir", str(shared), "--shared-timeout", "0.6"]
    for key, value in extra.items():
        argv += [f"--{key.replace('_', '-')}", value]
    return argv


def test_the_head_launches_only_when_every_other_node_marked(tmp_path, monkeypatch, capsys):
    _cluster(monkeypatch, {"10.0.0.1": 16, "10.0.0.2": 16})
    shared_dir.write_token(tmp_path)
    shared_dir.mark(tmp_path, "10.0.0.2", timeout=1)
    assert ray_cluster.main(_wait(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "ray cluster ready" in out
    assert "every node sees" in out


def test_a_node_that_never_marks_is_named_within_the_shared_timeout(tmp_path, monkeypatch, capsys):
    _cluster(monkeypatch, {"10.0.0.1": 16, "10.0.0.2": 16})
    shared_dir.write_token(tmp_path)  # the head's own mark is not needed: it wrote the token
    start = time.monotonic()
    assert ray_cluster.main(_wait(tmp_path)) == 4
    assert time.monotonic() - start < 0.6 + 2 * ray_cluster.POLL_SECONDS + 1
    err = capsys.readouterr().err
    assert "1 joined node(s) do not see the head's OUTPUT_DIR" in err
    assert "): 10.0.0.2 wrote no mark" in err  # the worker, not the head


def test_marks_are_not_asked_before_every_npu_joined(tmp_path, monkeypatch, capsys):
    """An incomplete cluster is reported as incomplete (exit 1 at the wait's timeout), not as unshared."""
    _cluster(monkeypatch, {"10.0.0.1": 16})
    shared_dir.write_token(tmp_path)
    assert ray_cluster.main([*_wait(tmp_path)[:-6], "--timeout", "0.5", "--shared-dir", str(tmp_path)]) == 1
    assert "the cluster is incomplete" in capsys.readouterr().err


def test_without_a_shared_dir_the_wait_does_not_look_for_marks(tmp_path, monkeypatch):
    _cluster(monkeypatch, {"10.0.0.1": 16, "10.0.0.2": 16})
    argv = _wait(tmp_path)
    cut = argv.index("--shared-dir")
    assert ray_cluster.main(argv[:cut] + argv[cut + 4 :]) == 0


def test_token_and_mark_commands(tmp_path, capsys):
    assert ray_cluster.main(["token", "--shared-dir", str(tmp_path)]) == 0
    assert ray_cluster.main(["mark", "--shared-dir", str(tmp_path), "--node-ip", "10.0.0.2", "--timeout", "1"]) == 0
    assert shared_dir.unmarked(tmp_path, ["10.0.0.2"]) == []
    empty = tmp_path / "elsewhere"
    assert ray_cluster.main(["mark", "--shared-dir", str(empty), "--node-ip", "10.0.0.3", "--timeout", "0.2"]) == 4
    assert "does not see the head's OUTPUT_DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ray_cluster.main(["mark", "--node-ip", "10.0.0.3"])
    with pytest.raises(SystemExit):
        ray_cluster.main(["wait", "--node-ip", "10.0.0.3"])
