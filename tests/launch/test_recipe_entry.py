"""The recipe entry point refuses to run when the driver cannot reach its cluster, before Ray starts locally.

Here rather than with the driver check's unit tests (tests/recipe) because it needs the smoke inputs of
tests/launch/conftest.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from r1_ascend.ports import unused_local_port

pytestmark = pytest.mark.machine


def test_recipe_entry_point_fails_before_ray_init(smoke_inputs, tmp_path) -> None:
    """The real entry point, with an unreachable RAY_ADDRESS: the error names it; no local Ray is started."""
    address = f"127.0.0.1:{unused_local_port()}"
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
