"""Delete old checkpoints only after the new one is complete, and resume only from a complete one.

Target:
worker — verl.utils.checkpoint.megatron_checkpoint_manager.MegatronCheckpointManager.save_checkpoint (called
without max_ckpt_to_keep, so it never deletes); driver — verl.trainer.ppo.ray_trainer.RayPPOTrainer._save_checkpoint
(deletes the checkpoints beyond the kept number once the new global_step_N is complete and tracked; a failed save
becomes a CheckpointSaveError naming the intact checkpoint) and RayPPOTrainer._load_checkpoint (refuses to resume
from an incomplete checkpoint, or to start from step 0 beside existing ones).

Upstream:
verl 0.6.1 (verl/utils/checkpoint/megatron_checkpoint_manager.py save_checkpoint; verl/trainer/ppo/ray_trainer.py
_save_checkpoint, _load_checkpoint; verl/utils/checkpoint/checkpoint_manager.py find_latest_ckpt_path),
megatron-core 0.12.1 (dist_checkpointing.save writes metadata.json after every shard).

Process:
driver (the TaskRunner that runs RayPPOTrainer) and worker (the Megatron actor's checkpoint manager).

Why:
with trainer.max_actor_ckpt_to_keep=N, verl's MegatronCheckpointManager.save_checkpoint deletes the oldest saved
actor/ directory *before* it writes the new one; the tracker latest_checkpointed_iteration.txt is written by the
driver only after every rank returned. With N=1 (the 671B config: one checkpoint is ~9.4 TB) a kill, a node loss or a
full disk during a save leaves the tracker naming a step whose actor/ is gone and a new step that is partial: no
checkpoint at all. At resume, verl takes whatever the tracker names (a truncated shard fails deep inside the
workers' load) and starts again from step 0 without an error when the tracker or its directory is missing.

How:
the worker's save_checkpoint calls the stock one with max_ckpt_to_keep=None. The driver's _save_checkpoint runs the
stock one (actor save, data.pt, tracker), then checks the new global_step_N with rules.checkpoints.inspect_step and
the tracker; only when both hold does it delete what rules.checkpoints.stale_steps lists (whole global_step_*
directories older than the newest max_actor_ckpt_to_keep complete ones, partial saves included; with
remove_previous_ckpt_in_save, 1). Otherwise (an async save still being written) it deletes nothing and logs why.
Deleting on the driver from the directories on disk also removes the checkpoint a run resumed from, which verl
keeps forever because its list of saved paths starts empty in each process. An exception from the stock save is
re-raised as CheckpointSaveError naming the step, the cause and the checkpoint still intact. Before the stock
_load_checkpoint, with resume_mode auto (or resume_path) and default_local_dir resolved as verl resolves it,
rules.checkpoints.resume_decision must accept the tracked step (or resume_from_path): every data.pt and common.pt a
readable archive, metadata.json present, and every shard as long as .metadata records; otherwise
CheckpointResumeError names the step directory, what is broken and the newest complete checkpoint to resume from.
r1-ascend preflight runs the same rule on the run's checkpoint directory.

Upstream fix:
none — verl 0.6.1 and main as of b178a3cd (2026-01-29) delete before saving in every checkpoint manager and resume
from the tracker without a check.

Remove when:
verl's MegatronCheckpointManager.save_checkpoint deletes previous checkpoints only after the new one and the tracker
are written, and RayPPOTrainer._load_checkpoint refuses an incomplete global_step_N and a missing tracker beside
existing checkpoints; then delete this module, its registry entry, rules/checkpoints.py's use here and
tests/patches/test_verl_checkpoint_integrity.py (preflight keeps the rule).

Disable:
R1_ASCEND_DISABLE=verl_checkpoint_integrity — stock verl: old checkpoints are deleted before the new one is written,
a failed save surfaces as the workers' exception, and a resume loads whatever the tracker names (or starts from step
0 when it is missing).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._errors import CheckpointResumeError, CheckpointSaveError
from ._install import install_on_import
from ._registry import PatchSpec, spec_by_module
from .rules.checkpoints import inspect_step, read_tracker, resume_decision, stale_steps

logger = logging.getLogger(__name__)

#: This patch's registry name (the R1_ASCEND_DISABLE token).
NAME = spec_by_module(__name__).name


def apply(spec: PatchSpec) -> None:
    install_on_import(spec.name, spec.target("MegatronCheckpointManager.save_checkpoint"), _build_manager_save)
    install_on_import(spec.name, spec.target("RayPPOTrainer._save_checkpoint"), _build_trainer_save)
    install_on_import(spec.name, spec.target("RayPPOTrainer._load_checkpoint"), _build_trainer_load)


# --- worker: never delete before saving ---------------------------------------------------------------------------


def _build_manager_save(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def save_checkpoint(
        self: Any, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: Any = None
    ) -> Any:
        return original(self, local_path, hdfs_path, global_step, max_ckpt_to_keep=None)

    return save_checkpoint


# --- driver: delete after the new checkpoint is complete ----------------------------------------------------------


def checkpoint_root(trainer_config: Any) -> Path:
    """``trainer.default_local_dir`` resolved as verl's ``_load_checkpoint`` resolves it (relative to the cwd)."""
    return Path(os.path.abspath(str(trainer_config.default_local_dir)))


def kept_checkpoints(trainer_config: Any) -> int:
    """How many checkpoints to keep (0: all), from the settings verl reads in ``_save_checkpoint``."""
    if trainer_config.get("remove_previous_ckpt_in_save", False):
        return 1
    keep = trainer_config.get("max_actor_ckpt_to_keep", None)
    return keep if isinstance(keep, int) and keep > 0 else 0


def _build_trainer_save(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _save_checkpoint(self: Any) -> Any:
        root = checkpoint_root(self.config.trainer)
        step = int(self.global_steps)
        before = read_tracker(root)
        try:
            result = original(self)
        except Exception as exc:
            raise CheckpointSaveError(save_failure(root, step, before, exc)) from exc
        remove_stale(root, step, kept_checkpoints(self.config.trainer))
        return result

    return _save_checkpoint


def save_failure(root: Path, step: int, tracked: int | str | None, exc: BaseException) -> str:
    """What failed (the worker's own error, not Ray's wrapper and its traceback), what is intact, what to do."""
    cause = getattr(exc, "cause", None) or exc
    lines = str(cause).strip().splitlines() or [""]
    intact = f"global_step_{tracked}" if isinstance(tracked, int) else "none (no earlier checkpoint is tracked)"
    try:
        free = f"{shutil.disk_usage(root).free / 1024**3:.1f} GiB free on its file system"
    except OSError:
        free = "free space unknown"
    return (
        f"saving checkpoint global_step_{step} under {root} ({free}) failed: {type(cause).__name__}: {lines[-1]}. "
        f"Nothing was deleted; the last complete checkpoint is {intact}. Free space or fix the file system (a full "
        "disk or a file-size limit makes torch.save fail with 'unexpected pos' or 'File too large'), then relaunch "
        f"the same command: it resumes from {intact}."
    )


def remove_stale(root: Path, step: int, keep: int) -> list[Path]:
    """Delete what ``stale_steps`` lists, once ``global_step_<step>`` is complete and tracked; return what went."""
    if keep < 1:
        return []
    state = inspect_step(root / f"global_step_{step}")
    tracked = read_tracker(root)
    if not state.complete or tracked != step:
        reason = "; ".join(state.problems) or f"the tracker names {tracked!r}"
        logger.warning("patch %s: keeping older checkpoints, global_step_%d is incomplete: %s", NAME, step, reason)
        return []
    removed = stale_steps(root, step, keep)
    for path in removed:
        logger.warning("patch %s: global_step_%d is complete; removing %s (keeping %d)", NAME, step, path, keep)
        shutil.rmtree(path, ignore_errors=True)
    return removed


# --- driver: resume only from a complete checkpoint ---------------------------------------------------------------


def _build_trainer_load(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _load_checkpoint(self: Any) -> Any:
        check_resume(self.config.trainer)
        return original(self)

    return _load_checkpoint


def check_resume(trainer_config: Any) -> None:
    """Raise ``CheckpointResumeError`` when verl's resume would load a partial checkpoint or silently start over."""
    mode = trainer_config.resume_mode
    if mode == "disable" or trainer_config.get("default_hdfs_dir") is not None:
        return  # disable: step 0 on purpose; HDFS: verl refuses it itself
    resume_from = None
    if mode == "resume_path":
        if not trainer_config.get("resume_from_path"):
            return  # verl refuses it with its own message
        resume_from = Path(os.path.abspath(str(trainer_config.resume_from_path)))
    decision = resume_decision(checkpoint_root(trainer_config), resume_from=resume_from)
    if not decision.ok:
        raise CheckpointResumeError(f"patch {NAME}: cannot resume: {decision.message}")
    logger.warning("patch %s: %s", NAME, decision.message)
