"""The driver refuses to run when it cannot reach the cluster, naming the address, instead of starting a local Ray."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from r1_ascend.launch.driver_address import ClusterUnreachableError, check_driver_can_join, split_address


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


def test_unreachable_address_is_named() -> None:
    address = f"127.0.0.1:{_closed_port()}"
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


def test_recipe_entry_point_fails_before_ray_init(smoke_inputs, tmp_path) -> None:
    """The real entry point, with an unreachable RAY_ADDRESS: the error names it; no local Ray is started."""
    address = f"127.0.0.1:{_closed_port()}"
    stub_site = Path(__file__).resolve().parents[1] / "sitecustomize_npu"  # the torch_npu stub, as in every test
    env_prefix = ["env", f"RAY_ADDRESS={address}", "R1_ASCEND_RAY_CONNECT_TIMEOUT=1", f"PYTHONPATH={stub_site}"]
    cmd = [
        *env_prefix,
        sys.executable,
        "-m",
        "r1_ascend.recipe.main_grpo",
        "--config-name",
        "grpo_deepseekv3_smoke",
        *smoke_inputs.overrides(),
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0
    assert f"cannot reach the Ray cluster at RAY_ADDRESS={address}" in done.stderr, done.stderr[-3000:]
    assert "Started a local Ray instance" not in done.stdout + done.stderr
