"""megatron-core's GPTModel trains on the CPU with Megatron's own DDP and DistributedOptimizer (built by verl's
functions), starting from the converted dist checkpoint; with learning rate 0 nothing moves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("megatron_train.py")


def train(weights: Path, lr: float, steps: int, tmp_path: Path) -> dict:
    from r1_ascend.rehearse.cluster import with_site

    out = tmp_path / f"train-{lr}.json"
    env = with_site(os.environ)
    cmd = [sys.executable, str(SCRIPT), str(weights), str(lr), str(steps), str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return json.loads(out.read_text(encoding="utf-8"))


def test_distributed_optimizer_steps_reduce_the_loss(converted: Path, tmp_path: Path) -> None:
    result = train(converted, 1e-3, 3, tmp_path)
    losses = [step["loss"] for step in result["steps"]]
    assert all(step["ok"] for step in result["steps"])
    assert all(step["grad_norm"] > 0 for step in result["steps"])
    assert losses[-1] < losses[0] * 0.9, losses
    assert result["max_param_change"] > 0


def test_learning_rate_zero_changes_nothing(converted: Path, tmp_path: Path) -> None:
    result = train(converted, 0.0, 2, tmp_path)
    losses = [step["loss"] for step in result["steps"]]
    assert result["max_param_change"] == 0.0
    assert losses[0] == losses[1]
