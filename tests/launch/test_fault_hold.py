"""The process faults' hold (R1_ASCEND_REHEARSE_HOLD): the workers wait on entering the planted stage of the planted
step until the rehearsal has sent its signal, so the fault lands inside the stage however short the stage is."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from r1_ascend import envs
from r1_ascend.rehearse import faults, process_faults, worker_hooks
from r1_ascend.rehearse.config import Plan, overrides
from r1_ascend.rehearse.inputs import Inputs
from r1_ascend.rehearse.lifecycle import HOLD_RELEASED, read_lifecycle


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
    waited = worker_hooks.hold_for_the_fault("update_actor", 2)
    assert 0.25 <= waited <= time.monotonic() - began < 5
    assert worker_hooks.hold_for_the_fault("update_actor", 2) < 0.05  # released: later entries (run 2) go on


@pytest.mark.parametrize(
    ("stage", "step"), [("update_actor", 1), ("update_actor", 3), ("generate_sequences", 2), ("update_actor", None)]
)
def test_other_stages_and_steps_are_not_held(held_at_update_2: Path, stage: str, step: int | None) -> None:
    assert worker_hooks.hold_for_the_fault(stage, step) == 0.0


def test_a_hold_never_released_ends_at_its_limit(held_at_update_2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rehearsal that died before its signal must not leave the run stuck."""
    monkeypatch.setattr(worker_hooks, "HOLD_LIMIT_S", 0.2)
    assert 0.2 <= worker_hooks.hold_for_the_fault("update_actor", 2) < 2


def test_entering_the_stage_holds_after_the_entry_is_recorded(
    held_at_update_2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the watchdog patch's stage listeners, as in a worker: the entry is recorded first (what the rehearsal
    waits for before its signal), then the method waits for the release; it runs once released."""
    from r1_ascend.patches import verl_worker_watchdog

    monkeypatch.setattr(verl_worker_watchdog, "STAGE_LISTENERS", [worker_hooks.record_stage])
    ran: list[float] = []
    entered: list[dict] = []
    early: list[bool] = []

    def plant() -> None:
        while not entered:
            entered.extend(e for e in read_lifecycle(held_at_update_2) if e.get("phase") == "enter")
            time.sleep(0.01)
        time.sleep(0.2)
        early.append(bool(ran))  # the stage must not have run before the fault was planted
        (held_at_update_2 / HOLD_RELEASED).touch()

    planter = threading.Thread(target=plant)
    planter.start()
    with verl_worker_watchdog.in_stage("update_actor", 2):
        ran.append(time.time())
    planter.join(5)
    assert early == [False]
    assert (entered[0]["stage"], entered[0]["step"]) == ("update_actor", 2)
    assert ran[0] >= entered[0]["t"] + 0.2


@pytest.mark.parametrize("name", process_faults.PROCESS_FAULTS)
def test_every_process_fault_run_holds_its_stage_of_its_step(name: str, tmp_path: Path) -> None:
    plan = process_faults.plan_for(name, Plan())
    assert plan.hold_at == f"{process_faults.PROCESS_FAULTS[name].stage}@{process_faults.STEP}"
    assert dataclasses.replace(plan, hold_at=None) == faults.plan_for(name, Plan())  # otherwise the same plan
    inputs = Inputs(tmp_path / "model", tmp_path / "mcore", tmp_path / "data")
    env = f"+ray_kwargs.ray_init.runtime_env.env_vars.{envs.R1_ASCEND_REHEARSE_HOLD}='{plan.hold_at}'"
    assert env in overrides(plan, inputs, tmp_path, Path.cwd())


@pytest.mark.parametrize("name", faults.FAULTS)
def test_checkpoint_fault_runs_hold_nothing(name: str, tmp_path: Path) -> None:
    plan = faults.plan_for(name, Plan())
    assert plan.hold_at is None
    inputs = Inputs(tmp_path / "model", tmp_path / "mcore", tmp_path / "data")
    assert not [o for o in overrides(plan, inputs, tmp_path, Path.cwd()) if envs.R1_ASCEND_REHEARSE_HOLD in o]


def test_releasing_lets_every_later_entry_go_on_even_without_records_yet(
    held_at_update_2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rehearsal releases in a ``finally``: also when run 1 ended before writing any record (no lifecycle
    directory yet), and twice without harm; a relaunch or ``--resume`` entering the stage again is not held."""
    out = held_at_update_2 / "out"
    monkeypatch.setenv(envs.R1_ASCEND_REHEARSE_DIR, str(out / "lifecycle"))
    process_faults.release_held_workers(out)
    process_faults.release_held_workers(out)
    assert (out / "lifecycle" / HOLD_RELEASED).is_file()
    assert worker_hooks.hold_for_the_fault("update_actor", 2) < 0.05
