"""A worker of a plain rehearsal SIGKILLed from outside at a random moment (the rehearsal does not choose it): the
rehearsal must stop clearly, leave nothing, and ``rehearse --resume`` must finish from the last complete checkpoint.

It judges only its own run (its tree of processes, its Ray temp dir) and plants no ``--fault``, so it runs in the
second lane beside the process faults (conftest.SECOND_LANE_MODULES).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from r1_ascend.patches.rules.checkpoints import read_tracker
from r1_ascend.rehearse.faults import STOP_BOUND_S, wait_until
from r1_ascend.rehearse.lifecycle import read_lifecycle
from r1_ascend.rehearse.process_faults import stage_entered, with_descendants

pytestmark = pytest.mark.machine


@pytest.mark.slow
def test_a_worker_killed_from_outside_stops_the_rehearsal_clearly_and_resume_finishes(
    tmp_path: Path, weights: Path, rehearse, nothing_left, announced_temp_dir
) -> None:
    """SIGKILL a random rollout worker at a random moment of a plain rehearsal (the rehearsal does not choose it)."""
    out = tmp_path / "out"
    # 4 steps: the rehearsal's own kill comes in step 3, its resume runs steps 3-4 (what is judged needs no learning)
    cmd = [sys.executable, "-m", "r1_ascend.cli", "rehearse", "--output-dir", str(out), "--weights", str(weights)]
    cmd += ["--steps", "4"]
    began = time.time()
    rehearsal = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    chooser = random.Random()
    # A random moment of step 1 or 2, before the rehearsal's own kill in step 3: inside a stage every step runs,
    # entered in one of those steps (a delay in seconds after step 1 began reached step 3 once steps became fast).
    step, stage = chooser.choice([1, 2]), chooser.choice(["generate_sequences", "update_actor"])
    delay = chooser.uniform(0.0, 0.5)
    try:
        entered = wait_until(
            lambda: stage_entered(out, stage, step, 0.0) or rehearsal.poll() is not None,
            f"a worker entering {stage} in step {step}",
            600,
            0.2,
        )
        assert isinstance(entered, dict), f"the rehearsal exited with {rehearsal.returncode} before training"
        time.sleep(delay)
        workers = sorted({int(e["pid"]) for e in read_lifecycle(out / "lifecycle") if e["event"] == "release"})
        victim = chooser.choice(workers)
        tree = with_descendants(set(workers))
        tracked = read_tracker(out / "checkpoints")
        os.kill(victim, signal.SIGKILL)
        killed_at, killed_wall = time.monotonic(), time.time()
        stdout, stderr = rehearsal.communicate(timeout=600)
    finally:
        if rehearsal.poll() is None:
            rehearsal.kill()
    later = [e for e in read_lifecycle(out / "lifecycle") if e["event"] == "stage" and (e.get("step") or 0) > 2]
    assert all(e["t"] > killed_wall for e in later), f"the kill ({stage} of step {step} + {delay:.2f} s) came late"
    assert rehearsal.returncode == 1, (stdout + stderr)[-3000:]
    took = time.monotonic() - killed_at
    assert "WorkerLostError: the run stopped" in stderr, stderr[-3000:]
    assert f"pid {victim}" in stderr
    assert f"rehearse --resume --output-dir {out}" in stderr
    assert took < STOP_BOUND_S + 120, f"the rehearsal took {took:.0f} s to stop (stopping the nodes included)"
    left = [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert left == [], f"processes of the killed run left: {left}"
    nothing_left({"ray_temp_dir": announced_temp_dir(stdout), "netns": None}, began)
    began = time.time()
    done = rehearse("--resume", "--output-dir", str(out))
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    resumed = json.loads((out / "summary-resume.json").read_text())
    expected = tracked if isinstance(tracked, int) else 0
    assert resumed["resumed_from_step"] == expected, (entered, stage, step, delay, tracked)
    nothing_left(resumed, began)
