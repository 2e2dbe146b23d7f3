"""scripts/ray_start_npu.sh on a real local Ray cluster: two "nodes" on loopback addresses with fake NPU resources.

Ray rewrites 127.0.0.1 to the host's network address, so the nodes use 127.0.0.2 (head) and 127.0.0.3 (worker),
given to the script through NODE_IP (which skips the NIC lookup). Ports are chosen free, every test has its own Ray
temp dir, and everything is stopped through the script's own `stop` (the PIDs it recorded) - never `ray stop`,
which would stop every Ray on the machine.

Ray 2.46 binds its servers to the wildcard address whatever it is told (fixed upstream in ray-project/ray#55484).
So the cluster runs in a network namespace of its own whose only interface is loopback: there, a wildcard bind
listens on 127.0.0.0/8 and nothing else, which the test checks. (Where namespaces cannot be created, the test
checks what it can on the host: no bind to a specific non-loopback address and no connection leaving loopback.)
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "ray_start_npu.sh"
VENV_BIN = Path(sys.executable).parent
HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"

#: The launched "training": the driver check of the recipe entry point, then ray.init() exactly as verl 0.6.1's
#: run_ppo calls it (no address; kwargs from verl's own config defaults and runtime env), then what it sees.
DRIVER = """
import json, os
import ray
from verl.trainer.constants_ppo import get_ppo_ray_runtime_env
from r1_ascend.recipe.driver_address import check_driver_can_join

check_driver_can_join()
ray.init(num_cpus=None, runtime_env=get_ppo_ray_runtime_env())
alive = [n for n in ray.nodes() if n["Alive"]]
seen = {{
    "nodes": sorted(n["NodeManagerAddress"] for n in alive),
    "npus": ray.cluster_resources().get("NPU", 0.0),
    "dp": os.environ.get("VLLM_DP_SIZE"),
    "master": os.environ.get("MASTER_ADDR"),
}}
ray.shutdown()
with open({marker!r}, "w") as f:
    json.dump(seen, f)
"""

pytestmark = [pytest.mark.slow, pytest.mark.machine]


def _namespace_addresses(prefix: list[str]) -> list[str]:
    """Every IP address configured in the namespace the prefix runs in."""
    out = subprocess.run([*prefix, "ip", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


@pytest.fixture
def cluster_env(tmp_path, free_port):
    tag = uuid.uuid4().hex[:8]
    temp_dirs = {"head": f"/tmp/r1rt-{tag}", "worker": f"/tmp/r1rt-{tag}"}  # workers use the head's temp dir
    marker = tmp_path / "launched.txt"
    launch = tmp_path / "launch.sh"
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(marker=str(marker)))
    launch.write_text(f'#!/usr/bin/env bash\nset -euo pipefail\n"{VENV_BIN / "python"}" {driver}\n')
    base = {
        **os.environ,
        "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
        "PYTHON": str(VENV_BIN / "python"),
        "RAY": str(VENV_BIN / "ray"),
        "NNODES": "2",
        "NPUS_PER_NODE": "16",
        "MASTER_ADDR": HEAD_IP,
        "RAY_PORT": str(free_port()),
        "RAY_NUM_CPUS": "1",
        "R1_ASCEND_RUN_DIR": str(tmp_path / "run"),
        "OUTPUT_DIR": str(tmp_path / "outputs"),  # both "nodes" are this host: they see one directory
        "R1_ASCEND_PREFLIGHT_CMD": "",
        "R1_ASCEND_LAUNCH_CMD": f"bash {launch}",
        "RAY_REPORT_EVERY": "2",
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONPATH": str(REPO / "tests" / "sitecustomize_npu"),  # the driver imports verl: torch_npu stub
    }
    base.pop("VLLM_DP_SIZE", None)
    envs = {
        "head": {
            **base,
            "NODE_IP": HEAD_IP,
            "RAY_TEMP_DIR": temp_dirs["head"],
            "RAY_START_EXTRA_ARGS": f"--ray-client-server-port={free_port()} "
            f"--dashboard-agent-listen-port={free_port()}",
        },
        "worker": {
            **base,
            "NODE_IP": WORKER_IP,
            "RAY_TEMP_DIR": temp_dirs["worker"],
            "RAY_START_EXTRA_ARGS": f"--dashboard-agent-listen-port={free_port()}",
        },
    }
    yield envs, marker, temp_dirs
    subprocess.run(["bash", str(SCRIPT), "stop"], env=envs["head"], check=False, capture_output=True, timeout=90)
    for temp in temp_dirs.values():
        left = _pids_under(temp)
        for pid in left:  # only processes under this test's private temp dirs
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        subprocess.run(["rm", "-rf", temp], check=False)


def _wait_for_text(path: Path, text: str, process: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and text in path.read_text(errors="replace"):
            return
        assert process.poll() is None, f"head exited early: {process.stdout.read() if process.stdout else ''}"
        time.sleep(0.5)
    pytest.fail(f"{text!r} not in {path} after {timeout} s")


def _pids_under(temp_dir: str) -> list[int]:
    out = subprocess.run(["pgrep", "-u", str(os.getuid()), "-f", f"{temp_dir}/"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _decode(hex_addr: str) -> str:
    host, _ = hex_addr.split(":")
    if len(host) == 8:
        return str(ipaddress.IPv4Address(bytes.fromhex(host)[::-1]))
    raw = bytes.fromhex(host)
    return str(ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))))


def _tcp_sockets(inodes: set[str], pid: int) -> list[tuple[str, str, str]]:
    """(state, local address, remote address) of the TCP sockets with these inodes, in ``pid``'s network namespace."""
    found = []
    for table in (f"/proc/{pid}/net/tcp", f"/proc/{pid}/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[9] in inodes:
                found.append((cols[3], _decode(cols[1]), _decode(cols[2])))
    return found


def _is_loopback_or_wildcard(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def test_head_waits_for_all_npus_then_launches(cluster_env, netns):
    envs, marker, temp_dirs = cluster_env
    head = subprocess.Popen(
        [*netns, "bash", str(SCRIPT)], env=envs["head"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    # Both "nodes" share this host and Ray's session directory: let the head finish starting before the worker joins
    # (on a real cluster the nodes are separate hosts and may start in any order; the worker retries).
    _wait_for_text(Path(envs["head"]["R1_ASCEND_RUN_DIR"]) / f"ray-head-{HEAD_IP}.log", "Ray runtime started", head)
    worker = subprocess.run(
        [*netns, "bash", str(SCRIPT)], env=envs["worker"], capture_output=True, text=True, timeout=120
    )
    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert "joined the Ray cluster" in worker.stdout
    out, _ = head.communicate(timeout=120)
    text = out.decode()
    assert head.returncode == 0, text
    assert "role head" in text
    assert "role worker" in worker.stdout
    assert f"{HEAD_IP} (16 NPU), {WORKER_IP} (16 NPU)" in text  # both nodes seen through ray.nodes()
    seen = json.loads(marker.read_text())
    # The launched driver's bare ray.init() joined the assembled cluster: both nodes, all their NPUs.
    assert seen["nodes"] == [HEAD_IP, WORKER_IP], seen
    assert seen["npus"] == 32.0, seen
    # VLLM_DP_SIZE is not exported: the rollout's DP/EP patch derives it in each worker
    assert (seen["dp"], seen["master"]) == (None, HEAD_IP)

    pids = [p for temp in temp_dirs.values() for p in _pids_under(temp)]
    assert pids, "no Ray processes found under the test's temp dirs"
    sockets = _tcp_sockets(set().union(*(_socket_inodes(p) for p in pids)), pids[0])
    listening = [local for state, local, _ in sockets if state == "0A"]
    assert listening
    # No bind to a specific non-loopback address, and no connection leaving loopback.
    assert all(_is_loopback_or_wildcard(addr) for addr in listening), listening
    connected = [(local, remote) for state, local, remote in sockets if state == "01"]
    assert all(_is_loopback_or_wildcard(remote) for _, remote in connected), connected
    if netns:
        # Ray's wildcard binds are inside a namespace whose only addresses are loopback: nothing listens outside
        # 127.0.0.0/8 (or ::1).
        addresses = _namespace_addresses(netns)
        assert addresses, "the namespace has no address at all"
        assert all(ipaddress.ip_address(a).is_loopback for a in addresses), addresses

    stop = subprocess.run(
        [*netns, "bash", str(SCRIPT), "stop"], env=envs["head"], capture_output=True, text=True, timeout=90
    )
    assert stop.returncode == 0, stop.stderr
    for temp in temp_dirs.values():
        assert _pids_under(temp) == [], f"Ray processes left under {temp}"
    assert not list(Path(envs["head"]["R1_ASCEND_RUN_DIR"]).glob("*.pid"))


def test_head_times_out_naming_the_missing_node(cluster_env, netns):
    envs, marker, temp_dirs = cluster_env
    env = {**envs["head"], "NODE_IPS": f"{HEAD_IP},{WORKER_IP}", "RAY_WAIT_TIMEOUT": "6"}
    head = subprocess.run([*netns, "bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert head.returncode == 1
    assert "timeout after 6 s" in head.stderr
    assert f"1 of 2 nodes missing or without 16 NPUs: {WORKER_IP}" in head.stderr
    assert not marker.exists()
    subprocess.run([*netns, "bash", str(SCRIPT), "stop"], env=envs["head"], check=True, capture_output=True, timeout=90)
    assert _pids_under(temp_dirs["head"]) == []
