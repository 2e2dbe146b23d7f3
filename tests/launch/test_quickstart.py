"""`r1-ascend quickstart` end to end on the shipped sample and a tiny model (real data prep and conversion)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_quickstart_runs_end_to_end_and_prints_the_launch_command(tmp_path):
    out = tmp_path / "qs"
    cmd = [sys.executable, "-m", "r1_ascend.cli", "quickstart", "--output-dir", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for stage in ("[1/4]", "[2/4]", "[3/4]", "[4/4]"):
        assert f"{stage} " in done.stdout
    assert "preflight grpo_deepseekv3_smoke: done" in done.stdout
    assert "bash scripts/run_grpo_smoke_npu.sh" in done.stdout
    assert (out / "weights" / "mcore" / "metadata.json").is_file()
    assert (out / "data" / "train.parquet").is_file()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)  # idempotent rerun
    assert again.returncode == 0, again.stdout + again.stderr
    assert "reused" in again.stdout
