"""``r1-ascend rehearse --fault NAME`` and ``--resume``: the process faults and ``corrupt-latest`` planted in the real
run (2 or 3 steps), and the fast checks of every fault's plan and verdicts. The two faults during a save run in
``test_rehearse_save_faults.py``, a worker killed from outside a plain rehearsal in ``test_rehearse_external_kill.py``
(both in the second lane).

Every test checks the fault's own verdicts (the rehearsal fails otherwise), the measured time to stop against its
bound, and that nothing the run started is left. With ``R1_ASCEND_DISABLE=verl_checkpoint_integrity`` each
checkpoint fault fails (docs/rehearsal.md, Faults). That only the watchdog stops the hang is the fast test below (its
bound leaves room for the watchdog alone) and the watchdog's own tests; no test runs the hang with it off, since a
test that a fault goes unstopped would pass as the product got weaker.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from r1_ascend.rehearse.config import WATCHDOG, Plan, with_overrides
from r1_ascend.rehearse.faults import (
    RELAUNCH_BOUND_S,
    STOP_BOUND_S,
    FaultError,
    check_kept,
    check_refusal,
    plan_for,
)
from r1_ascend.rehearse.process_faults import HANG_STOP_BOUND_S, PROCESS_FAULTS
from r1_ascend.rehearse.progress import RehearsalError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "patches"))
import checkpoint_fakes as fakes

pytestmark = pytest.mark.machine

# --- fast: the fault plans and verdicts ----------------------------------------------------------------------------


def test_fault_plans_are_short_and_keep_what_the_671b_config_keeps() -> None:
    for name in ("kill-during-save", "disk-full"):
        plan = plan_for(name, Plan())
        assert (plan.total_steps, plan.save_freq, plan.max_ckpt_to_keep, plan.min_reward_rise) == (2, 1, 1, None)
    plan = plan_for("corrupt-latest", Plan())
    assert (plan.total_steps, plan.save_freq, plan.max_ckpt_to_keep) == (3, 1, 2)


def test_only_the_watchdog_can_stop_a_hang_so_its_bound_follows_the_silence_limit() -> None:
    """The hang's bound leaves the watchdog its silence limit, a poll, a probe and the stop, and is tighter than the
    other faults' (a watchdog that waited twice its limit would fail it); the control waits that long."""
    silence = WATCHDOG["silence_s"]
    assert silence + WATCHDOG["poll_s"] + 5 < HANG_STOP_BOUND_S < 2 * silence + 30 <= STOP_BOUND_S
    assert PROCESS_FAULTS["hang"].bound_s == HANG_STOP_BOUND_S
    others = {name: fault.bound_s for name, fault in PROCESS_FAULTS.items() if name != "hang"}
    assert set(others.values()) == {STOP_BOUND_S}


def test_resume_overrides_replace_the_launch_scripts_own() -> None:
    command = ["python", "-m", "x", "--config-name", "c", "trainer.resume_mode=auto", "a=1"]
    assert with_overrides(command, ["trainer.resume_mode=resume_path", "b=2"]) == [
        "python",
        "-m",
        "x",
        "--config-name",
        "c",
        "a=1",
        "trainer.resume_mode=resume_path",
        "b=2",
    ]


def test_only_the_kept_complete_checkpoints_may_be_left(tmp_path: Path) -> None:
    plan = plan_for("kill-during-save", Plan())
    root = tmp_path / "checkpoints"
    fakes.write_step(root, 2)
    assert check_kept(tmp_path, plan).startswith("global_step_2 kept")
    fakes.write_step(root, 1, track=False)
    with pytest.raises(FaultError, match=r"steps \[1, 2\], expected the newest kept ones \[2\]"):
        check_kept(tmp_path, plan)
    shutil.rmtree(root / "global_step_1")
    fakes.truncate(fakes.shard(root / "global_step_2"))
    with pytest.raises(FaultError, match="truncated"):
        check_kept(tmp_path, plan)


def test_resume_expects_the_step_the_override_names_else_the_tracked_one(tmp_path: Path) -> None:
    from r1_ascend.rehearse.resume import expected_step

    root = tmp_path / "checkpoints"
    assert expected_step(tmp_path, []) == 0  # stopped before its first checkpoint: the relaunch starts afresh
    fakes.write_step(root, 3, track=False)
    with pytest.raises(RehearsalError, match="nothing to resume"):
        expected_step(tmp_path, [])
    fakes.write_step(root, 3)
    assert expected_step(tmp_path, []) == 3
    assert expected_step(tmp_path, [f"trainer.resume_from_path={root / 'global_step_1'}"]) == 1


# --- slow: each fault in the real run -------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [1, 60, 200])
def test_the_refusal_keeps_the_whole_error_however_long_its_paths(tmp_path: Path, depth: int) -> None:
    """The printed fix ends with the resume path; a summary that cut the error cut the path the user copies."""
    out = tmp_path.joinpath(*(["deep"] * depth), "out")
    (out / "lifecycle").mkdir(parents=True)
    good, shard = out / "checkpoints" / "global_step_1", out / "checkpoints" / "global_step_2" / "__0_0.distcp"
    error = (
        f"CheckpointResumeError: patch verl_checkpoint_integrity: cannot resume: the tracker names step 2, but {shard}"
        f" is truncated. Fix: resume from global_step_1: trainer.resume_mode=resume_path "
        f"trainer.resume_from_path={good}"
    )
    log = tmp_path / "run2.log"
    log.write_text(f"Traceback (most recent call last):\nr1_ascend.patches._errors.{error}\n", encoding="utf-8")
    driver = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    cut = {"truncated": str(shard), "bytes": "2 -> 1", "newest": 2}
    outcome = check_refusal(driver, out, log, cut, time.monotonic(), set())
    assert outcome.seen["error"] == error
    assert (outcome.step, outcome.resume_from) == (2, 1)


@pytest.mark.slow
def test_corrupt_latest_is_refused_and_resume_from_the_printed_checkpoint_finishes(
    tmp_path: Path, fault_run, rehearse, nothing_left
) -> None:
    out = tmp_path / "out"
    summary = fault_run(out, "corrupt-latest")
    fault = summary["fault"]
    assert fault["time_to_stop_s"] < RELAUNCH_BOUND_S
    assert "names step 2" in fault["error"]
    fix = re.search(r"trainer\.resume_mode=resume_path trainer\.resume_from_path=(\S+)", fault["error"])
    assert fix, fault["error"]
    assert fix.group(1) == str(out / "checkpoints" / "global_step_1")
    broken = out / "checkpoints" / "global_step_2"
    shutil.move(broken, broken.with_name("global_step_2.broken"))  # the fix's first half: move it aside
    began = time.time()
    done = rehearse("--resume", "--output-dir", str(out), fix.group(0).split()[0], fix.group(0).split()[1])
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    resumed = json.loads((out / "summary-resume.json").read_text())
    assert resumed["resumed_from_step"] == 1
    assert resumed["steps_run"] == {"run 3 (resumed)": [2, 3]}
    nothing_left(resumed, began)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "stage", "names"),
    [
        ("kill-actor-worker", "update_actor", "pid"),
        ("kill-rollout", "generate_sequences", "pid"),
        ("hang", "update_actor", "watchdog"),
        ("node-loss", "update_actor", "node 127.0.0.3 was lost"),
    ],
)
def test_a_lost_or_stuck_worker_stops_the_run_clearly_and_it_resumes(
    tmp_path: Path, fault_run, name: str, stage: str, names: str
) -> None:
    summary = fault_run(tmp_path / "out", name)
    fault = summary["fault"]
    assert fault["time_to_stop_s"] < PROCESS_FAULTS[name].bound_s
    assert fault["error"].startswith(f"WorkerLostError: the run stopped in training step 2, stage {stage}")
    assert stage in fault["signalled"]
    assert names in fault["error"]
    assert "resumes from global_step_1" in fault["error"]
    assert fault["processes_left"] == 0
    if name == "node-loss":  # the node is named as lost, and the user is not sent to the OOM killer
        assert "OOM" not in fault["error"]
    assert summary["resumed_from_step"] == 1
    assert summary["steps_run"]["run 2 (resumed)"] == [2]
