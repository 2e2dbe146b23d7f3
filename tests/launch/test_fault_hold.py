"""The process faults' hold (R1_ASCEND_REHEARSE_HOLD): the workers wait on entering the planted stage of the planted
step until the rehearsal has sent its signal, so the fault lands inside the stage however short the stage is."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from r1_ascend import envs
from r1_ascend.rehearse import fault_hold, faults, process_faults
from r1_ascend.rehearse.cluster import SITE
from r1_ascend.rehearse.config import Plan, overrides
from r1_ascend.rehearse.fault_hold import HOLD_RELEASED
from r1_ascend.rehearse.inputs import Inputs
from r1_ascend.rehearse.lifecycle import read_lifecycle


@given(st.sampled_from(["update_actor", "generate_sequences", "save_checkpoint"]), st.integers(1, 10**6))
def test_a_planted_stage_reads_back(stage: str, step: int) -> None:
    assert envs.rehearse_hold({envs.R1_ASCEND_REHEARSE_HOLD: f"{stage}@{step}"}) == (stage, step)


@pytest.mark.parametrize(
    "raw",
    [
        "update_actor",
        "update_actor@",
        "@2",
        "update_actor@0",
        "update_actor@-1",
        "update actor@2",
        "update_actor@2.5",
        "update_actor@two",
    ],
)
def test_a_malformed_hold_is_refused_with_the_expected_form(raw: str) -> None:
    with pytest.raises(ValueError, match="expected STAGE@STEP"):
        envs.rehearse_hold({envs.R1_ASCEND_REHEARSE_HOLD: raw})


def test_unset_means_no_hold() -> None:
    assert envs.rehearse_hold({}) is None
    assert envs.rehearse_hold({envs.R1_ASCEND_REHEARSE_HOLD: ""}) is None


@pytest.fixture
def held_at_update_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(envs.R1_ASCEND_REHEARSE_HOLD, "update_actor@2")
    monkeypatch.setenv(envs.R1_ASCEND_REHEARSE_DIR, str(tmp_path))
    return tmp_path


def test_the_worker_waits_in_the_planted_stage_until_the_fault_is_planted(held_at_update_2: Path) -> None:
    release = threading.Timer(0.3, (held_at_update_2 / HOLD_RELEASED).touch)
    release.start()
    began = time.monotonic()
    waited = fault_hold.hold_for_the_fault("update_actor", 2)
    assert 0.25 <= waited <= time.monotonic() - began < 5
    assert fault_hold.hold_for_the_fault("update_actor", 2) < 0.05  # released: later entries (run 2) go on


@pytest.mark.parametrize(
    ("stage", "step"), [("update_actor", 1), ("update_actor", 3), ("generate_sequences", 2), ("update_actor", None)]
)
def test_other_stages_and_steps_are_not_held(held_at_update_2: Path, stage: str, step: int | None) -> None:
    assert fault_hold.hold_for_the_fault(stage, step) == 0.0


def test_a_hold_never_released_ends_at_its_limit(held_at_update_2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rehearsal that died before its signal must not leave the run stuck."""
    monkeypatch.setattr(fault_hold, "HOLD_LIMIT_S", 0.2)
    assert 0.2 <= fault_hold.hold_for_the_fault("update_actor", 2) < 2


#: A worker's process in miniature: the rehearsal's worker module installed (on import, as verl imports it in each
#: worker), a stage entered through the watchdog patch, and a planter thread that waits for the entry's record.
WORKER = """
import sys, threading, time
from pathlib import Path
from r1_ascend.rehearse import worker_hooks  # noqa: F401 - installs the records and the stage listener
from r1_ascend.patches import verl_worker_watchdog
from r1_ascend.rehearse.fault_hold import HOLD_RELEASED
from r1_ascend.rehearse.lifecycle import read_lifecycle

records = Path(sys.argv[1])

def plant():
    while not [e for e in read_lifecycle(records) if e.get("phase") == "enter"]:
        time.sleep(0.01)
    time.sleep(0.2)
    print("planted", time.time(), flush=True)
    (records / HOLD_RELEASED).touch()

threading.Thread(target=plant, daemon=True).start()
with verl_worker_watchdog.in_stage("update_actor", 2):
    print("ran", time.time(), flush=True)
"""


def test_a_worker_entering_the_stage_is_held_after_its_entry_is_recorded(tmp_path: Path) -> None:
    """The wiring in a worker (in a process of its own: the worker module installs itself on import): the entry is
    recorded first (what the rehearsal waits for before its signal), then the stage waits until the release."""
    env = {**os.environ, envs.R1_ASCEND_REHEARSE_HOLD: "update_actor@2", envs.R1_ASCEND_REHEARSE_DIR: str(tmp_path)}
    env["PYTHONPATH"] = str(SITE)  # the device stand-ins, as in every process of the rehearsal
    done = subprocess.run(
        [sys.executable, "-c", WORKER, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = dict(line.split() for line in done.stdout.splitlines() if line.split()[:1] in (["planted"], ["ran"]))
    assert float(said["ran"]) >= float(said["planted"])
    (entry,) = [e for e in read_lifecycle(tmp_path) if e.get("event") == "stage" and e.get("phase") == "enter"]
    assert (entry["stage"], entry["step"]) == ("update_actor", 2)
    assert entry["t"] + 0.2 <= float(said["ran"])


@pytest.mark.parametrize("name", process_faults.PROCESS_FAULTS)
def test_every_process_fault_run_holds_its_stage_of_its_step(name: str, tmp_path: Path) -> None:
    plan = process_faults.plan_for(name, Plan())
    assert plan.hold_at == f"{process_faults.PROCESS_FAULTS[name].stage}@{process_faults.STEP}"
    assert dataclasses.replace(plan, hold_at=None) == faults.plan_for(name, Plan())  # otherwise the same plan
    inputs = Inputs(tmp_path / "model", tmp_path / "mcore", tmp_path / "data")
    env = f"+ray_kwargs.ray_init.runtime_env.env_vars.{envs.R1_ASCEND_REHEARSE_HOLD}='{plan.hold_at}'"
    assert env in overrides(plan, inputs, tmp_path)


@pytest.mark.parametrize("name", faults.FAULTS)
def test_checkpoint_fault_runs_hold_nothing(name: str, tmp_path: Path) -> None:
    plan = faults.plan_for(name, Plan())
    assert plan.hold_at is None
    inputs = Inputs(tmp_path / "model", tmp_path / "mcore", tmp_path / "data")
    assert not [o for o in overrides(plan, inputs, tmp_path) if envs.R1_ASCEND_REHEARSE_HOLD in o]


def test_releasing_lets_every_later_entry_go_on_even_without_records_yet(
    held_at_update_2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rehearsal releases in a ``finally``: also when run 1 ended before writing any record (no lifecycle
    directory yet), and twice without harm; a relaunch or ``--resume`` entering the stage again is not held."""
    out = held_at_update_2 / "out"
    monkeypatch.setenv(envs.R1_ASCEND_REHEARSE_DIR, str(out / "lifecycle"))
    fault_hold.release_held_workers(out)
    fault_hold.release_held_workers(out)
    assert (out / "lifecycle" / HOLD_RELEASED).is_file()
    assert fault_hold.hold_for_the_fault("update_actor", 2) < 0.05
