"""Node IP and DP master port for vLLM's data-parallel rendezvous, without guessing.

IP: the IPv4 address of the NIC the job is configured to use (``HCCL_SOCKET_IFNAME``, else
``GLOO_SOCKET_IFNAME``), read with the ``SIOCGIFADDR`` ioctl. No UDP "connect" towards a public address (it may
pick another NIC and fails on air-gapped clusters) and no ``ifconfig`` shell-out. Without a configured NIC only
rank 0 may use ``MASTER_ADDR`` (verl sets it to rank 0's node address), or every rank when ``MASTER_ADDR`` is a
loopback address (then the job rendezvoused over loopback, so all ranks share one host).

Port: picked by the kernel (bind to port 0, so it is free at that moment), re-drawn while it falls into a port
range the job already uses (``MASTER_PORT``, Ray's fixed ports and worker-port range, HCCL's base-port block and
socket port ranges), and held bound until every DP master has picked, so two DP masters on one host can never
draw the same port.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import socket
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from r1_ascend import envs

from .._errors import NodeIpError, PortSelectionError

logger = logging.getLogger(__name__)

NIC_VARIABLES = ("HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
_SIOCGIFADDR = 0x8915  # <linux/sockios.h>: get the interface's protocol (IPv4) address
_IFNAMSIZ = 16

#: Ray's fixed defaults: GCS 6379, dashboard 8265, client server 10001, worker ports 10002-19999, dashboard
#: agent 52365 (ports Ray picks at random are already bound, so the bind test skips them).
RAY_DEFAULT_PORTS = (range(6379, 6380), range(8265, 8266), range(10001, 20000), range(52365, 52366))
#: HCCL's host base port when ``HCCL_IF_BASE_PORT`` is unset.
HCCL_DEFAULT_BASE_PORT = 60000
#: Ports reserved from the HCCL base port. HCCL counts ports up from the base, more with more devices per node;
#: 1024 stays clear of them for any A3 node.
HCCL_BASE_PORT_SPAN = 1024
#: vLLM 0.9.1's ``get_open_port`` avoids ``[VLLM_DP_MASTER_PORT, +10)`` for its own sockets; keep that whole
#: window clear of the job's ports too.
VLLM_DP_PORT_WINDOW = 10


def interface_ipv4(ifname: str) -> str:
    """The IPv4 address of network interface ``ifname`` (``NodeIpError`` if absent or without IPv4)."""
    if not ifname or len(ifname.encode()) >= _IFNAMSIZ:
        msg = f"invalid network interface name {ifname!r}"
        raise NodeIpError(msg)
    request = struct.pack("256s", ifname.encode())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            reply = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
        except OSError as exc:
            names = ", ".join(interface_names()) or "none"
            msg = f"network interface {ifname!r} has no IPv4 address ({exc.strerror}); interfaces here: {names}"
            raise NodeIpError(msg) from exc
    return socket.inet_ntoa(reply[20:24])


def interface_names() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


def match_interfaces(spec: str, available: Sequence[str]) -> list[str]:
    """Interfaces selected by an ``*_SOCKET_IFNAME`` value, in the order they should be tried.

    Comma-separated entries; ``=name`` means exactly ``name``; a bare entry is the interface of that name, else
    every interface starting with it (HCCL's prefix rule). Exclusion lists (``^docker``) cannot pick one
    address and are rejected.
    """
    chosen: list[str] = []
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        if entry.startswith("^"):
            msg = (
                f"socket interface setting {spec!r} is an exclusion list; it cannot name the NIC whose address the "
                f"DP rendezvous should use. Name the cluster NIC explicitly, e.g. HCCL_SOCKET_IFNAME=eth0."
            )
            raise NodeIpError(msg)
        if entry.startswith("="):
            matches = [entry[1:]] if entry[1:] in available else []
        elif entry in available:
            matches = [entry]
        else:
            matches = sorted(name for name in available if name.startswith(entry))
        chosen.extend(name for name in matches if name not in chosen)
    return chosen


def discover_node_ip(env: Mapping[str, str], rank: int) -> str:
    """This node's IPv4 address for the DP rendezvous (rules in the module docstring); ``NodeIpError`` if unknown."""
    for variable in NIC_VARIABLES:
        spec = env.get(variable, "").strip()
        if not spec:
            continue
        available = interface_names()
        candidates = match_interfaces(spec, available)
        if not candidates:
            msg = f"{variable}={spec!r} matches no network interface on this node (interfaces: {', '.join(available)})"
            raise NodeIpError(msg)
        errors = []
        for name in candidates:
            try:
                return interface_ipv4(name)
            except NodeIpError as exc:
                errors.append(str(exc))
        msg = f"{variable}={spec!r}: no matching interface has an IPv4 address: {'; '.join(errors)}"
        raise NodeIpError(msg)
    master = env.get("MASTER_ADDR", "").strip()
    if master:
        address = _resolve_ipv4(master)
        if rank == 0 or ipaddress.ip_address(address).is_loopback:
            return address
    msg = (
        f"rank {rank}: cannot tell which network interface carries this node's address: neither "
        f"{' nor '.join(NIC_VARIABLES)} is set"
        + (f" and MASTER_ADDR={master!r} belongs to rank 0's node" if master else " and MASTER_ADDR is unset")
        + ". Export HCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) naming the cluster NIC, e.g. eth0, on every node "
        "before `ray start`."
    )
    raise NodeIpError(msg)


def _resolve_ipv4(host: str) -> str:
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        msg = f"MASTER_ADDR={host!r} does not resolve to an IPv4 address ({exc})"
        raise NodeIpError(msg) from exc


def reserved_port_ranges(env: Mapping[str, str]) -> list[range]:
    """Port ranges the job's other components use or may bind later (never chosen as the DP master port)."""
    ranges: list[range] = list(RAY_DEFAULT_PORTS)
    master_port = _int_or_none(env.get("MASTER_PORT"))
    if master_port is not None:
        ranges.append(range(master_port, master_port + 1))
    ray_address = envs.ray_address(env)
    if ":" in ray_address:
        port = _int_or_none(ray_address.rsplit(":", 1)[1])
        if port is not None:
            ranges.append(range(port, port + 1))
    base = _int_or_none(env.get("HCCL_IF_BASE_PORT"))
    base = HCCL_DEFAULT_BASE_PORT if base is None else base
    ranges.append(range(base, base + HCCL_BASE_PORT_SPAN))
    for variable in ("HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE"):
        ranges.extend(_parse_port_ranges(env.get(variable, "")))
    return ranges


def _parse_port_ranges(value: str) -> list[range]:
    """``"60000-60050,61000"`` -> ranges; ``auto`` or empty -> none."""
    found: list[range] = []
    for part in value.split(","):
        part = part.strip()
        if not part or part.lower() == "auto":
            continue
        low, _, high = part.partition("-")
        start, stop = _int_or_none(low), _int_or_none(high or low)
        if start is not None and stop is not None and start <= stop:
            found.append(range(start, stop + 1))
    return found


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


@dataclass
class HeldPort:
    """A free port kept bound until ``release()``, so no other picker on this host can draw it meanwhile."""

    port: int
    sock: socket.socket

    def release(self) -> None:
        self.sock.close()


def pick_free_port(excluded: Iterable[range], *, attempts: int = 256) -> HeldPort:
    """A kernel-chosen free TCP port whose vLLM DP window ``[port, port+10)`` avoids every ``excluded`` range."""
    excluded = list(excluded)
    rejected: list[socket.socket] = []
    try:
        for _ in range(attempts):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("", 0))
            port = sock.getsockname()[1]
            window = range(port, port + VLLM_DP_PORT_WINDOW)
            if not any(_overlaps(window, r) for r in excluded):
                return HeldPort(port, sock)
            rejected.append(sock)  # keep it bound so the kernel offers a different port next time
    finally:
        for sock in rejected:
            sock.close()
    msg = (
        f"no free TCP port outside the job's reserved ranges after {attempts} attempts "
        f"(reserved: {_describe(excluded)}); check net.ipv4.ip_local_port_range and the HCCL/Ray port settings"
    )
    raise PortSelectionError(msg)


def _overlaps(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


def _describe(ranges: Sequence[range]) -> str:
    return ", ".join(f"{r.start}" if len(r) == 1 else f"{r.start}-{r.stop - 1}" for r in ranges)
