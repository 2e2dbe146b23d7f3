"""The driver refuses to run when it cannot reach the cluster, naming the address, instead of starting a local Ray."""

from __future__ import annotations

import socket
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from r1_ascend.ports import unused_local_port
from r1_ascend.recipe.driver_address import ClusterUnreachableError, check_driver_can_join, split_address


def test_unreachable_address_is_named() -> None:
    address = f"127.0.0.1:{unused_local_port()}"
    start = time.monotonic()
    with pytest.raises(ClusterUnreachableError) as err:
        check_driver_can_join({"RAY_ADDRESS": address, "NNODES": "2"}, timeout=1.0)
    assert f"RAY_ADDRESS={address}" in str(err.value)
    assert "Refusing to start a local one-node Ray" in str(err.value)
    assert time.monotonic() - start < 30


def test_listening_address_passes() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        assert check_driver_can_join({"RAY_ADDRESS": address}, timeout=1.0) == address


def test_multi_node_without_address_is_refused() -> None:
    with pytest.raises(ClusterUnreachableError, match="NNODES=2 but RAY_ADDRESS is not set"):
        check_driver_can_join({"NNODES": "2"})


@pytest.mark.parametrize("env", [{}, {"NNODES": "1"}, {"RAY_ADDRESS": "local", "NNODES": "4"}])
def test_single_node_runs_locally(env: dict[str, str]) -> None:
    assert check_driver_can_join(env) is None


@given(st.text(max_size=30))
def test_split_address_accepts_only_host_port(text: str) -> None:
    host, sep, port = text.strip().rpartition(":")
    if sep and host.strip("[]") and port.isdigit():
        assert split_address(text) == (host.strip("[]"), int(port))
    else:
        with pytest.raises(ValueError, match="is not HOST:PORT"):
            split_address(text)
