"""A TCP port to hand to a server that binds it later (torch.distributed's store, Ray's servers)."""

from __future__ import annotations

import socket


def unused_local_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` nothing listens on right now: the kernel picks it, and it is released again on return.

    Another process can take it before the caller's server binds it; callers that start many servers at once on one
    host should hold their sockets instead (``patches/impl/dp_net.py`` does).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
