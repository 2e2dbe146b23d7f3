"""r1_ascend.ports: the port it returns is free to bind on the host asked for."""

from __future__ import annotations

import socket

import pytest

from r1_ascend.ports import unused_local_port


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2"])
def test_the_port_can_be_listened_on_at_once(host):
    port = unused_local_port(host)
    assert 1024 <= port <= 65535
    with socket.socket() as server:
        server.bind((host, port))
        server.listen()


def test_a_port_someone_listens_on_is_not_returned():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        assert all(unused_local_port() != taken for _ in range(50))
