"""verl_checkpoint_integrity: old checkpoints go only after the new one is complete; resume only from a complete one.

The checkpoints are written in the real formats (torch's DCP writer, ``torch.save``, megatron-core's
``metadata.json``: ``checkpoint_fakes``). The save and load paths run verl 0.6.1's own
``MegatronCheckpointManager.save_checkpoint``, ``RayPPOTrainer._save_checkpoint`` and ``_load_checkpoint`` on
trainer objects whose worker groups write or read those directories.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from r1_ascend.patches import CheckpointResumeError, CheckpointSaveError, apply_one, patched_by, spec_by_name
from r1_ascend.patches.rules.checkpoints import inspect_step, resume_decision, stale_steps

sys.path.insert(0, str(Path(__file__).parent))
import checkpoint_fakes as fakes

SPEC = spec_by_name("verl_checkpoint_integrity")


# --- the rule ----------------------------------------------------------------------------------------------------


def test_a_complete_step_has_no_problem(tmp_path: Path) -> None:
    assert inspect_step(fakes.write_step(tmp_path, 3)).problems == ()


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: fakes.truncate(fakes.shard(p)), "truncated"),
        (lambda p: fakes.truncate(p / "data.pt"), "data.pt is not a readable"),
        (lambda p: fakes.truncate(p / "actor" / "dist_ckpt" / "common.pt"), "common.pt is not a readable"),
        (lambda p: fakes.truncate(p / "actor" / "dist_ckpt" / ".metadata"), ".metadata cannot be read"),
        (lambda p: (p / "actor" / "dist_ckpt" / "metadata.json").unlink(), "no metadata.json"),
        (lambda p: (p / "data.pt").unlink(), "missing data.pt"),
        (lambda p: fakes.shard(p).unlink(), "missing shard"),
    ],
    ids=["shard", "data.pt", "common.pt", ".metadata", "metadata.json", "no-data.pt", "no-shard"],
)
def test_every_cut_off_file_is_found(tmp_path: Path, damage: Any, expected: str) -> None:
    step = fakes.write_step(tmp_path, 3)
    damage(step)
    problems = inspect_step(step).problems
    assert any(expected in p for p in problems), problems


def test_resume_takes_the_tracked_complete_step(tmp_path: Path) -> None:
    fakes.write_step(tmp_path, 2)
    fakes.write_step(tmp_path, 4)
    assert resume_decision(tmp_path).step == 4
    assert resume_decision(tmp_path / "nothing-here").step == 0


def test_a_broken_tracked_step_is_refused_with_the_way_back(tmp_path: Path) -> None:
    fakes.write_step(tmp_path, 2)
    latest = fakes.write_step(tmp_path, 4)
    fakes.truncate(fakes.shard(latest))
    decision = resume_decision(tmp_path)
    assert not decision.ok
    assert f"names step 4, but {latest}" in decision.message
    assert "truncated" in decision.message
    assert f"mv {latest} {latest}.broken" in decision.message
    assert f"trainer.resume_from_path={tmp_path / 'global_step_2'}" in decision.message


@pytest.mark.parametrize("tracker", [None, "", "4x"], ids=["no-tracker", "empty", "garbage"])
def test_checkpoints_without_a_readable_tracker_never_mean_step_0(tmp_path: Path, tracker: str | None) -> None:
    fakes.write_step(tmp_path, 2, track=False)
    if tracker is not None:
        (tmp_path / fakes.TRACKER).write_text(tracker)
    decision = resume_decision(tmp_path)
    assert not decision.ok, decision.message
    assert f"trainer.resume_from_path={tmp_path / 'global_step_2'}" in decision.message


def test_a_tracker_naming_a_missing_step_is_refused(tmp_path: Path) -> None:
    fakes.write_step(tmp_path, 2)
    (tmp_path / fakes.TRACKER).write_text("4")
    decision = resume_decision(tmp_path)
    assert not decision.ok
    assert f"{tmp_path / 'global_step_4'}: does not exist" in decision.message


def test_retention_keeps_the_newest_complete_and_drops_partials(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        fakes.write_step(tmp_path, step)
    fakes.truncate(fakes.shard(tmp_path / "global_step_3"))
    later = fakes.write_step(tmp_path, 5, track=False)
    assert stale_steps(tmp_path, 4, keep=1) == [tmp_path / f"global_step_{s}" for s in (1, 2, 3)]
    assert stale_steps(tmp_path, 4, keep=2) == [tmp_path / f"global_step_{s}" for s in (1, 3)]
    assert stale_steps(tmp_path, 4, keep=0) == []
    assert later not in stale_steps(tmp_path, 4, keep=1)


# --- the worker's checkpoint manager (verl's own save_checkpoint) -------------------------------------------------


class _SaveStarted(Exception):
    """Raised where verl's save starts writing: what was deleted by then is lost if the save never finishes."""


def _manager(previous: list[Path]) -> Any:
    from verl.utils.checkpoint.megatron_checkpoint_manager import MegatronCheckpointManager

    manager = object.__new__(MegatronCheckpointManager)
    manager.previous_saved_paths = [str(p) for p in previous]
    manager.checkpoint_save_contents = ["model", "optimizer", "extra"]
    manager.use_dist_checkpointing = True

    def generate_state_dict(*_: Any, **__: Any) -> None:
        raise _SaveStarted

    manager.generate_state_dict = generate_state_dict
    return manager


def _save_with_keep_one(tmp_path: Path) -> Path:
    old = fakes.write_step(tmp_path, 2) / "actor"
    with pytest.raises(_SaveStarted):
        _manager([old]).save_checkpoint(str(tmp_path / "global_step_4" / "actor"), None, 4, max_ckpt_to_keep=1)
    return old


def test_stock_verl_deletes_the_only_checkpoint_before_writing_the_next(tmp_path: Path) -> None:
    """The defect: with max_ckpt_to_keep=1 the previous actor/ is gone before a byte of the new one is written."""
    assert not _save_with_keep_one(tmp_path).exists()


def test_patched_manager_keeps_the_previous_checkpoint_while_saving(tmp_path: Path) -> None:
    apply_one(SPEC)
    from verl.utils.checkpoint.megatron_checkpoint_manager import MegatronCheckpointManager

    assert patched_by(MegatronCheckpointManager.save_checkpoint) == SPEC.name
    old = _save_with_keep_one(tmp_path)
    assert inspect_step(old.parent).complete


# --- the driver: verl's own _save_checkpoint and _load_checkpoint ----------------------------------------------------


class _WorkerGroup:
    """Writes (or reads) the actor's dist checkpoint where verl's trainer tells it to."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail
        self.loaded: list[str | None] = []

    def save_checkpoint(self, local_path: str, *_: Any, **__: Any) -> None:
        if self.fail is not None:
            (Path(local_path) / "dist_ckpt").mkdir(parents=True)
            raise self.fail
        fakes.write_dist_ckpt(Path(local_path) / "dist_ckpt")

    def load_checkpoint(self, local_path: str | None, **_: Any) -> None:
        self.loaded.append(local_path)


class _Loader:
    def state_dict(self) -> dict[str, int]:
        return {"batches_seen": 1}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.state = state


def _trainer(root: Path, step: int, *, keep: int | None = 1, fail: Exception | None = None) -> Any:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    trainer = object.__new__(RayPPOTrainer)
    trainer.config = OmegaConf.create(
        {
            "trainer": {
                "default_local_dir": str(root),
                "default_hdfs_dir": None,
                "max_actor_ckpt_to_keep": keep,
                "max_critic_ckpt_to_keep": None,
                "resume_mode": "auto",
                "resume_from_path": None,
                "del_local_ckpt_after_load": False,
            }
        }
    )
    trainer.global_steps = step
    trainer.use_critic = False
    trainer.actor_rollout_wg = _WorkerGroup(fail)
    trainer.train_dataloader = _Loader()
    return trainer


def test_patched_trainer_deletes_the_old_checkpoint_once_the_new_one_is_tracked(tmp_path: Path) -> None:
    apply_one(SPEC)
    fakes.write_step(tmp_path, 2)
    _trainer(tmp_path, 4)._save_checkpoint()
    assert (tmp_path / fakes.TRACKER).read_text() == "4"
    assert inspect_step(tmp_path / "global_step_4").complete
    assert not (tmp_path / "global_step_2").exists()


def test_patched_trainer_keeps_all_without_a_limit(tmp_path: Path) -> None:
    apply_one(SPEC)
    fakes.write_step(tmp_path, 2)
    _trainer(tmp_path, 4, keep=None)._save_checkpoint()
    assert (tmp_path / "global_step_2").exists()


def test_a_failed_save_names_the_intact_checkpoint_and_deletes_nothing(tmp_path: Path) -> None:
    apply_one(SPEC)
    fakes.write_step(tmp_path, 2)
    trainer = _trainer(tmp_path, 4, fail=OSError(27, "File too large"))
    with pytest.raises(CheckpointSaveError) as info:
        trainer._save_checkpoint()
    message = str(info.value)
    assert "saving checkpoint global_step_4" in message
    assert "File too large" in message
    assert "the last complete checkpoint is global_step_2" in message
    assert (tmp_path / fakes.TRACKER).read_text() == "2"
    assert inspect_step(tmp_path / "global_step_2").complete


def test_a_failed_save_in_a_ray_worker_names_the_workers_error_not_the_traceback(tmp_path: Path) -> None:
    """What a full disk does to torch.save inside the worker, as the driver receives it from Ray."""
    from ray.exceptions import RayTaskError

    apply_one(SPEC)
    fakes.write_step(tmp_path, 2)
    cause = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    wrapped = RayTaskError("WorkerDict.save_checkpoint", "Traceback (most recent call last):\n  ...\n", cause)
    with pytest.raises(CheckpointSaveError) as info:
        _trainer(tmp_path, 4, fail=wrapped.as_instanceof_cause())._save_checkpoint()
    message = str(info.value)
    assert "failed: RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598." in message
    assert "Traceback" not in message
    assert "GiB free on its file system" in message


def test_patched_resume_refuses_a_truncated_latest_before_any_worker_loads(tmp_path: Path) -> None:
    apply_one(SPEC)
    fakes.write_step(tmp_path, 2)
    fakes.truncate(fakes.shard(fakes.write_step(tmp_path, 4)))
    trainer = _trainer(tmp_path, 0)
    with pytest.raises(CheckpointResumeError, match="names step 4"):
        trainer._load_checkpoint()
    assert trainer.actor_rollout_wg.loaded == []


def test_patched_resume_loads_a_complete_latest(tmp_path: Path) -> None:
    apply_one(SPEC)
    fakes.write_step(tmp_path, 4)
    trainer = _trainer(tmp_path, 0)
    trainer._load_checkpoint()
    assert trainer.global_steps == 4
    assert trainer.actor_rollout_wg.loaded == [str(tmp_path / "global_step_4" / "actor")]


def test_stock_resume_starts_from_step_0_beside_untracked_checkpoints(tmp_path: Path) -> None:
    """The defect the resume check closes: verl ignores checkpoints when the tracker is missing."""
    fakes.write_step(tmp_path, 4, track=False)
    trainer = _trainer(tmp_path, 0)
    assert trainer._load_checkpoint() == 0
    assert trainer.actor_rollout_wg.loaded == [None]
    apply_one(SPEC)
    with pytest.raises(CheckpointResumeError, match=r"no latest_checkpointed_iteration\.txt"):
        _trainer(tmp_path, 0)._load_checkpoint()
