"""Ray cluster queries for scripts/ray_start_npu.sh: wait until the expected NPU nodes have joined and see the head's
output directory.

Uses ``ray.nodes()`` / ``ray.cluster_resources()`` (never parses ``ray status`` text). Exit codes: 0 ready,
1 timed out (the message names the missing nodes), 2 the watched ``ray start`` process died, 3 bad arguments,
4 nodes joined that do not see the head's ``--shared-dir`` (:mod:`r1_ascend.launch.shared_dir`; the message names them).

    python -m r1_ascend.launch.ray_cluster wait --address 10.0.0.1:6766 --node-ip 10.0.0.1 \
        --nodes 16 --npus-per-node 16 --timeout 1800 [--expected-ips 10.0.0.1,10.0.0.2,...] [--shared-dir DIR]
    python -m r1_ascend.launch.ray_cluster joined --address 10.0.0.1:6766 --node-ip 10.0.0.2 --timeout 60
    python -m r1_ascend.launch.ray_cluster token --shared-dir DIR        (the head, before it starts Ray)
    python -m r1_ascend.launch.ray_cluster mark --shared-dir DIR --node-ip 10.0.0.2 --timeout 60   (each node)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from r1_ascend.launch import shared_dir
from r1_ascend.recipe.driver_address import connect_error

#: Seconds between looks at the cluster's nodes (a GCS query): a node's start and the launch wait for them.
POLL_SECONDS = 0.5
#: Seconds one look waits for the head's GCS port to accept a connection.
CONNECT_SECONDS = 2.0
#: Seconds the head waits, once every NPU joined, for every node's mark in the shared directory.
SHARED_SECONDS = 60.0


@dataclass(frozen=True)
class ClusterState:
    npus_by_ip: dict[str, float]  # alive node IP -> NPU resource

    @property
    def total_npus(self) -> float:
        return sum(self.npus_by_ip.values())


def state_from_nodes(nodes: Sequence[dict[str, Any]]) -> ClusterState:
    """Alive nodes and their NPU resources from ``ray.nodes()`` records."""
    npus: dict[str, float] = {}
    for node in nodes:
        if not node.get("Alive"):
            continue
        ip = str(node.get("NodeManagerAddress", "?"))
        npus[ip] = npus.get(ip, 0.0) + float(node.get("Resources", {}).get("NPU", 0.0))
    return ClusterState(npus)


def readiness(state: ClusterState, nodes: int, npus_per_node: int, expected_ips: Sequence[str]) -> str | None:
    """None when the cluster has every expected NPU, else what is missing (one sentence)."""
    want = nodes * npus_per_node
    if expected_ips:
        missing = [ip for ip in expected_ips if state.npus_by_ip.get(ip, 0.0) < npus_per_node]
        if missing:
            return (
                f"{len(missing)} of {len(expected_ips)} nodes missing or without {npus_per_node} NPUs: "
                f"{', '.join(missing)} (joined: {_joined(state)})"
            )
    if state.total_npus < want:
        return (
            f"{state.total_npus:g} of {want} NPUs joined ({len(state.npus_by_ip)} of {nodes} nodes: "
            f"{_joined(state)}); {nodes - len(state.npus_by_ip)} node(s) missing"
        )
    return None


def _joined(state: ClusterState) -> str:
    return ", ".join(f"{ip} ({npus:g} NPU)" for ip, npus in sorted(state.npus_by_ip.items())) or "none"


def gcs_unreachable(address: str, timeout: float = CONNECT_SECONDS) -> str | None:
    """Why the GCS at ``address`` does not accept a TCP connection, or None when it does.

    Checked before ``ray.init``: against an address nobody serves, Ray retries for many minutes, printing warnings,
    so the wait's own timeout and its watch on ``ray start`` would not be honoured."""
    error = connect_error(address, timeout)
    return None if error is None else f"nothing accepts connections at {address} ({type(error).__name__}: {error})"


def _connect(address: str, node_ip: str) -> Callable[[], ClusterState]:
    import ray

    ray.init(
        address=address,
        _node_ip_address=node_ip,
        logging_level="ERROR",
        log_to_driver=False,
        include_dashboard=False,
        configure_logging=False,
    )
    return lambda: state_from_nodes(ray.nodes())


def wait(args: argparse.Namespace, *, joined_only: bool) -> int:
    expected = [ip.strip() for ip in (args.expected_ips or "").split(",") if ip.strip()]
    if joined_only:
        expected, nodes = [args.node_ip], 1
    else:
        nodes = args.nodes
        if expected and len(expected) != nodes:
            print(f"NODE_IPS lists {len(expected)} addresses but NNODES is {nodes}", file=sys.stderr)
            return 3
    deadline = time.monotonic() + args.timeout
    poll: Callable[[], ClusterState] | None = None
    last_report = 0.0
    problem = "not connected to the Ray head yet"
    shared: Path | None = None if joined_only or not args.shared_dir else Path(args.shared_dir)
    marks_deadline: float | None = None
    while True:
        if args.watch_pid is not None and not psutil.pid_exists(args.watch_pid):
            print(
                f"the ray start process {args.watch_pid} exited; see its log ({args.log or 'ray logs'})",
                file=sys.stderr,
            )
            return 2
        try:
            if poll is None:
                if (unreachable := gcs_unreachable(args.address)) is not None:
                    raise ConnectionError(unreachable)
                poll = _connect(args.address, args.node_ip)
            state = poll()
            problem = readiness(state, nodes, args.npus_per_node, expected) or ""
            if not problem and shared is not None:
                others = [ip for ip in state.npus_by_ip if ip != args.node_ip]
                missing = shared_dir.unmarked(shared, others)
                if missing:
                    marks_deadline = marks_deadline or time.monotonic() + args.shared_timeout
                    problem = unshared_problem(missing, shared)
                    if time.monotonic() >= marks_deadline:
                        print(f"after {args.shared_timeout:g} s: {problem}", file=sys.stderr)
                        return 4
            if not problem:
                print(f"ray cluster ready: {_joined(state)}; NPU total {state.total_npus:g}", flush=True)
                if shared is not None:
                    print(f"every node sees {shared.parent.parent} (its mark under {shared})", flush=True)
                return 0
        except Exception as exc:
            problem = f"cannot query the Ray head at {args.address}: {type(exc).__name__}: {exc}"
        now = time.monotonic()
        if now >= deadline:
            what = "this node has not joined" if joined_only else "the cluster is incomplete"
            print(f"timeout after {args.timeout:g} s: {what}: {problem}", file=sys.stderr)
            return 1
        if now - last_report >= args.report_every:
            print(f"waiting ({deadline - now:.0f} s left): {problem}", flush=True)
            last_report = now
        time.sleep(POLL_SECONDS)


def unshared_problem(missing: list[str], shared: Path) -> str:
    return (
        f"{len(missing)} joined node(s) do not see the head's OUTPUT_DIR ({shared.parent.parent}): "
        f"{', '.join(missing)} wrote no mark under {shared / shared_dir.NODES}; mount the same shared file system at "
        "the same path on every node (each such node's console says what it saw)"
    )


def main(argv: list[str] | None = None) -> int:
    from r1_ascend.cli import plain_help

    parser = argparse.ArgumentParser(prog="python -m r1_ascend.launch.ray_cluster", description=plain_help(__doc__))
    parser.add_argument("mode", choices=("wait", "joined", "token", "mark"))
    parser.add_argument("--shared-dir", default="", help="the head's OUTPUT_DIR/.r1-ascend/cluster (token, marks)")
    parser.add_argument(
        "--shared-timeout",
        type=float,
        default=SHARED_SECONDS,
        help="seconds to wait for every node's mark once all NPUs joined",
    )
    parser.add_argument("--address", default="", help="Ray head address HOST:PORT")
    parser.add_argument("--node-ip", default="", help="this host's node IP (as passed to ray start)")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--npus-per-node", type=int, default=16)
    parser.add_argument("--expected-ips", default="", help="comma list of node IPs that must join (NODE_IPS)")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--report-every", type=float, default=30.0, help="seconds between progress lines")
    parser.add_argument("--watch-pid", type=int, help="fail fast when this ray start process exits")
    parser.add_argument("--log", default="", help="log file named in the message when --watch-pid exits")
    args = parser.parse_args(argv)
    if args.mode in ("token", "mark") and not args.shared_dir:
        parser.error(f"{args.mode} needs --shared-dir")
    if args.mode == "token":
        shared_dir.write_token(Path(args.shared_dir))
        return 0
    if not args.node_ip:
        parser.error(f"{args.mode} needs --node-ip")
    if args.mode == "mark":
        try:
            shared_dir.mark(Path(args.shared_dir), args.node_ip, args.timeout)
        except FileNotFoundError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 4
        return 0
    if not args.address:
        parser.error(f"{args.mode} needs --address")
    return wait(args, joined_only=args.mode == "joined")


if __name__ == "__main__":
    raise SystemExit(main())
