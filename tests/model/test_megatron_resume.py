"""Exact resume on the real model: the step after verl's MegatronCheckpointManager loads a dist checkpoint (model,
DistributedOptimizer state, LR scheduler, RNG) equals the same step of the uninterrupted run, bit for bit on the CPU
(one thread): loss, grad norm and every parameter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("megatron_resume.py")


def run(weights: Path, checkpoint: Path, mode: str, out: Path) -> dict:
    from r1_ascend.rehearse.cluster import with_site

    env = with_site(os.environ)
    cmd = [sys.executable, str(SCRIPT), str(weights), str(checkpoint), mode, str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return json.loads(out.read_text(encoding="utf-8"))


def test_the_step_after_a_resume_equals_the_uninterrupted_step(converted: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "global_step_1" / "actor"
    uninterrupted = run(converted, checkpoint, "save", tmp_path / "uninterrupted.json")
    assert (checkpoint / "dist_ckpt" / "metadata.json").is_file()
    resumed = run(converted, checkpoint, "resume", tmp_path / "resumed.json")
    assert resumed["loss"] == uninterrupted["loss"]
    assert resumed["grad_norm"] == uninterrupted["grad_norm"]
    assert resumed["lr"] == uninterrupted["lr"]
    differing = [name for name, value in uninterrupted["params"].items() if resumed["params"][name] != value]
    assert differing == [], f"parameters differ after the resumed step: {differing[:5]}"
    assert resumed["params_sha256"] == uninterrupted["params_sha256"]

    # without the replacement that gives every Adam state its own step, the resumed update differs
    shared = run(converted, checkpoint, "resume-shared-step", tmp_path / "shared.json")
    assert shared["loss"] == uninterrupted["loss"]
    assert shared["params_sha256"] != uninterrupted["params_sha256"]
