"""The rehearsal's own kill in the middle of a step (r1_ascend.rehearse.cluster.kill_mid_step), on records written
as the workers write them: the step after a checkpoint is found by what happened after the tracker was written, not
after the rehearsal's poll saw it (a step of the fault plan's batch began generating within the poll's half second,
and the kill then never came)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from r1_ascend.rehearse.cluster import kill_mid_step
from r1_ascend.rehearse.config import Plan
from r1_ascend.rehearse.progress import RehearsalError


def driver(ends_after_s: float = 3.0) -> Any:
    """A driver that runs until it is sent a signal, or ends by itself after ``ends_after_s`` (the run's end)."""
    sent: list[int] = []
    ends = time.monotonic() + ends_after_s

    def poll() -> int | None:
        return sent[-1] if sent else (0 if time.monotonic() > ends else None)

    return SimpleNamespace(
        pid=4242, sent=sent, returncode=0, poll=poll, send_signal=sent.append, wait=lambda timeout=None: 0
    )


def test_a_generation_that_began_before_the_poll_saw_the_checkpoint_is_the_next_step(
    tmp_path: Path, reaped_pid: Callable[[], int]
) -> None:
    checkpoints, records = tmp_path / "checkpoints", tmp_path / "lifecycle"
    checkpoints.mkdir()
    records.mkdir()
    tracker = checkpoints / "latest_checkpointed_iteration.txt"
    tracker.write_text("2")
    written = tracker.stat().st_mtime
    os.utime(tracker, (written - 5.0, written - 5.0))  # the checkpoint of step 2, tracked 5 s ago
    worker = reaped_pid()
    events = [
        {"t": written - 6.0, "pid": worker, "event": "generate", "validate": False},  # step 2's, before its save
        {"t": written - 4.9, "pid": worker, "event": "generate", "validate": True},  # a validation: not a step
        {"t": written - 4.8, "pid": worker, "event": "generate", "validate": False},  # step 3's, 0.2 s after it
    ]
    (records / f"lifecycle-{worker}.log").write_text("".join(json.dumps(e) + "\n" for e in events))
    killed = driver()
    step, workers = kill_mid_step(killed, tmp_path, Plan(save_freq=1), tmp_path / "run1.log", after_step=2)
    assert (step, workers) == (3, {worker})
    assert killed.sent == [9]  # SIGKILL


def test_without_a_generation_after_the_checkpoint_the_driver_is_not_killed(
    tmp_path: Path, reaped_pid: Callable[[], int]
) -> None:
    """Only the validation and the step before the checkpoint generated: waiting goes on (cut short here by the
    driver ending), and nothing is killed."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "lifecycle").mkdir()
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")
    worker = reaped_pid()
    before = {"t": 0.0, "pid": worker, "event": "generate", "validate": False}
    (tmp_path / "lifecycle" / f"lifecycle-{worker}.log").write_text(json.dumps(before) + "\n")
    ended = SimpleNamespace(pid=4242, returncode=0, poll=lambda: 0, send_signal=lambda s: None, wait=lambda t=None: 0)
    with pytest.raises(RehearsalError, match="step 3 to start generating: the process exited with 0 first"):
        kill_mid_step(ended, tmp_path, Plan(save_freq=1), tmp_path / "run1.log", after_step=2)
