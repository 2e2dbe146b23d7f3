"""``r1-ascend rehearse --fault NAME`` for the faults that hit the save of step 2 (r1_ascend.rehearse.faults): the
driver killed while ``global_step_2`` is half written, and a full disk under every training worker. Each must stop
clearly, keep only complete checkpoints, resume from ``global_step_1`` and leave no process on the machine.

They plant no process fault and judge only their own run, so they may run in the second machine lane
(conftest.SECOND_LANE_MODULES); ``checkpoint_integrity`` switched off makes each fail (docs/rehearsal.md, Faults).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from r1_ascend.rehearse.faults import STOP_BOUND_S

pytestmark = [pytest.mark.machine, pytest.mark.slow]


def test_kill_during_save_resumes_from_the_last_complete_checkpoint(tmp_path: Path, fault_run) -> None:
    summary = fault_run(tmp_path / "out", "kill-during-save")
    fault = summary["fault"]
    assert fault["previous_checkpoint_at_kill"] == "complete"
    assert fault["killed_while"].startswith("global_step_2")
    assert fault["time_to_stop_s"] < STOP_BOUND_S
    assert summary["resumed_from_step"] == 1
    assert summary["steps_run"]["run 2 (resumed)"] == [2]
    assert summary["checkpoints_kept"].startswith("global_step_2 kept")


def test_disk_full_stops_with_the_intact_checkpoint_named_and_resumes_from_it(tmp_path: Path, fault_run) -> None:
    summary = fault_run(tmp_path / "out", "disk-full")
    fault = summary["fault"]
    assert fault["error"].startswith("CheckpointSaveError: saving checkpoint global_step_2")
    assert "the last complete checkpoint is global_step_1" in fault["error"]
    assert fault["time_to_stop_s"] < STOP_BOUND_S
    assert summary["resumed_from_step"] == 1
    assert summary["steps_run"]["run 2 (resumed)"] == [2]
