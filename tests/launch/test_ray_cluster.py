"""r1_ascend.launch.ray_cluster without Ray: what is missing, the head that nobody serves, the watched start that died.

The cluster itself (Ray's nodes joining) is in test_ray_start.py; these are the decisions around it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from r1_ascend.launch import ray_cluster
from r1_ascend.launch.ray_cluster import ClusterState, gcs_unreachable, readiness, state_from_nodes
from r1_ascend.ports import unused_local_port


def _args(address: str, **overrides: object) -> list[str]:
    argv = ["wait", "--address", address, "--node-ip", "127.0.0.1", "--nodes", "2", "--timeout", "3"]
    argv += ["--report-every", "1"]
    for key, value in overrides.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


def test_a_head_nobody_serves_times_out_on_time_naming_the_address(capsys: pytest.CaptureFixture[str]) -> None:
    address = f"127.0.0.1:{unused_local_port()}"
    start = time.monotonic()
    assert ray_cluster.main(_args(address)) == 1
    assert time.monotonic() - start < 3 + ray_cluster.CONNECT_SECONDS + ray_cluster.POLL_SECONDS + 1
    err = capsys.readouterr().err
    assert "timeout after 3 s: the cluster is incomplete" in err
    assert f"nothing accepts connections at {address}" in err


def test_a_watched_ray_start_that_exited_is_reported_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    address = f"127.0.0.1:{unused_local_port()}"
    start = time.monotonic()
    assert ray_cluster.main(_args(address, watch_pid=gone.pid, log="ray-head.log", timeout=60)) == 2
    assert time.monotonic() - start < 5
    assert f"the ray start process {gone.pid} exited; see its log (ray-head.log)" in capsys.readouterr().err


def test_node_ips_that_disagree_with_the_node_count_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert ray_cluster.main(_args("127.0.0.1:1", expected_ips="10.0.0.1,10.0.0.2,10.0.0.3")) == 3
    assert "NODE_IPS lists 3 addresses but NNODES is 2" in capsys.readouterr().err


def test_a_listening_port_is_reachable_and_a_closed_one_is_not() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert gcs_unreachable(f"127.0.0.1:{server.getsockname()[1]}") is None
    closed = unused_local_port()
    assert "ConnectionRefusedError" in (gcs_unreachable(f"127.0.0.1:{closed}") or "")
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        gcs_unreachable("10.0.0.1")


def test_dead_nodes_and_nodes_without_npus_do_not_count() -> None:
    state = state_from_nodes(
        [
            {"Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"NPU": 16.0}},
            {"Alive": False, "NodeManagerAddress": "10.0.0.2", "Resources": {"NPU": 16.0}},
            {"Alive": True, "NodeManagerAddress": "10.0.0.3", "Resources": {}},
        ]
    )
    assert state == ClusterState({"10.0.0.1": 16.0, "10.0.0.3": 0.0})
    problem = readiness(state, 3, 16, ["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    assert problem is not None
    assert "2 of 3 nodes missing or without 16 NPUs: 10.0.0.2, 10.0.0.3" in problem
    assert "16 of 48 NPUs joined" in (readiness(state, 3, 16, []) or "")


@given(
    npus=st.lists(st.sampled_from([0.0, 8.0, 16.0]), min_size=1, max_size=6),
    nodes=st.integers(1, 6),
    name_them=st.booleans(),
)
def test_ready_exactly_when_every_npu_is_there(npus: list[float], nodes: int, name_them: bool) -> None:
    ips = [f"10.0.0.{i}" for i in range(len(npus))]
    state = ClusterState(dict(zip(ips, npus, strict=True)))
    expected = ips[:nodes] if name_them and nodes <= len(ips) else []
    ready = readiness(state, nodes, 16, expected) is None
    enough = sum(npus) >= nodes * 16 and all(state.npus_by_ip[ip] >= 16 for ip in expected)
    assert ready == enough
