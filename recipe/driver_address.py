"""Make the training driver join the Ray cluster that ``scripts/ray_start_npu.sh`` assembled, or fail loudly.

verl 0.6.1's ``run_ppo`` calls ``ray.init()`` without an address. Ray then connects to ``RAY_ADDRESS`` when it is set,
and otherwise only to a cluster recorded under its *default* temp dir; failing both it silently starts a fresh
one-node local cluster, whose resource pool can never hold the run's NPUs. The launch script therefore exports
``RAY_ADDRESS`` to the driver, and the recipe entry point calls :func:`check_driver_can_join` before ``run_ppo``:

- ``RAY_ADDRESS`` set: its GCS port must accept a TCP connection within a short timeout (Ray itself would retry
  for minutes, printing only warnings), else :class:`ClusterUnreachableError` names the address tried.
- ``RAY_ADDRESS`` unset while ``NNODES`` > 1: a multi-node run would start a local cluster, so it is refused.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping

from r1_ascend import envs

#: Seconds the driver keeps trying the head's GCS port before giving up.
DEFAULT_TIMEOUT = envs.RAY_CONNECT_TIMEOUT_DEFAULT_S


class ClusterUnreachableError(ConnectionError):
    """The driver cannot reach the Ray cluster it is meant to run on."""


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); IPv6 hosts in brackets. Raises ValueError naming the bad address."""
    host, sep, port = address.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"RAY_ADDRESS={address!r} is not HOST:PORT (e.g. 10.0.0.1:6766)")
    return host, int(port)


def connect_error(address: str, timeout: float) -> OSError | None:
    """Why one TCP connection to ``address`` (``HOST:PORT``) failed within ``timeout`` s; None when accepted."""
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return exc


def probe(address: str, timeout: float = DEFAULT_TIMEOUT, interval: float = 1.0) -> None:
    """Return once ``address`` accepts a TCP connection; raise :class:`ClusterUnreachableError` after ``timeout``."""
    host, port = split_address(address)
    deadline = time.monotonic() + timeout
    while True:
        last = connect_error(address, min(5.0, max(timeout, 0.1)))
        if last is None:
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    raise ClusterUnreachableError(
        f"the driver cannot reach the Ray cluster at RAY_ADDRESS={address} within {timeout:g} s "
        f"({type(last).__name__}: {last}); is the head running (bash scripts/ray_start_npu.sh on the head), "
        f"and is port {port} of {host} reachable from this host? Refusing to start a local one-node Ray instead."
    )


def check_driver_can_join(env: Mapping[str, str] | None = None, timeout: float | None = None) -> str | None:
    """The cluster address the driver will join (None: a single-node local run); raises when it cannot join."""
    address = envs.ray_address(env)
    if address and address not in ("auto", "local"):
        probe(address, envs.ray_connect_timeout(env) if timeout is None else timeout)
        return address
    nnodes = (envs.nnodes(env) or "").strip() or "1"
    if not address and nnodes.isdigit() and int(nnodes) > 1:
        raise ClusterUnreachableError(
            f"NNODES={nnodes} but RAY_ADDRESS is not set, so Ray would start a one-node local cluster instead of "
            "joining yours; start the run through scripts/ray_start_npu.sh (it exports RAY_ADDRESS) or set "
            "RAY_ADDRESS=<head ip>:<RAY_PORT>"
        )
    return None  # unset, or Ray's own 'auto' / 'local': a deliberate choice of the user
