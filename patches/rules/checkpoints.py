"""Which verl ``global_step_N`` checkpoints are complete, which one a resume takes, and which ones may be deleted.

One definition for the patch ``verl_checkpoint_integrity`` (at resume and after each save), ``r1-ascend preflight``
(its ``checkpoint`` line) and the rehearsal's fault checks. It reads only what verl and megatron-core write, without
importing torch:

- ``latest_checkpointed_iteration.txt`` in the checkpoint root: the step verl wrote last, after the step's files;
- ``global_step_N/data.pt``: the data loader's position (``torch.save``, a zip archive: a truncated one has no
  central directory);
- ``global_step_N/<role>/dist_ckpt``: megatron-core's dist checkpoint, whose ``metadata.json`` megatron-core writes
  after every shard, ``common.pt`` (a zip) and ``.metadata`` (torch's pickled checkpoint metadata), which records
  the file, offset and length of every saved item: a ``*.distcp`` shorter than that is truncated.
"""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

__all__ = [
    "TRACKER",
    "ResumeDecision",
    "StepState",
    "dist_ckpt_problems",
    "inspect_step",
    "read_tracker",
    "resume_decision",
    "stale_steps",
    "step_dirs",
]

TRACKER = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"global_step_(\d+)")
#: verl's Megatron roles that save a dist checkpoint under global_step_N (the actor always; a critic when used).
_ROLES = ("actor", "critic")
#: Largest ``.metadata`` read (a 671B checkpoint's is tens of MB).
_MAX_METADATA = 1024 * 1024 * 1024


@dataclass(frozen=True)
class StepState:
    """One ``global_step_N`` directory and what makes it unusable (empty: complete)."""

    step: int
    path: Path
    problems: tuple[str, ...]

    @property
    def complete(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        return f"{self.path} complete" if self.complete else f"{self.path}: {'; '.join(self.problems)}"


@dataclass(frozen=True)
class ResumeDecision:
    """What ``resume_mode=auto`` does with a checkpoint root: resume from ``step`` (0: a fresh start), or refuse."""

    step: int | None
    message: str

    @property
    def ok(self) -> bool:
        return self.step is not None


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """The ``global_step_N`` directories under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.fullmatch(p.name)) and p.is_dir()]
    return sorted(found)


def read_tracker(root: Path) -> int | str | None:
    """The step named by verl's tracker file; None when there is none; a description when it is unreadable."""
    path = root / TRACKER
    if not path.exists():
        return None
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        return f"{path} cannot be read ({exc})"
    if not text.isdigit():
        return f"{path} holds {text[:40]!r}, not a step number (cut off while verl wrote it?)"
    return int(text)


def tracker_written_at(root: Path) -> float:
    """When verl last wrote its tracker file (seconds since the epoch): when the step it names became the latest
    complete checkpoint, which a poll that reads the tracker sees only later."""
    return (root / TRACKER).stat().st_mtime


def inspect_step(path: Path) -> StepState:
    """Check a ``global_step_N`` directory against what verl and megatron-core write for a finished save."""
    match = _STEP_DIR.fullmatch(path.name)
    step = int(match.group(1)) if match else -1
    problems: list[str] = []
    if not path.is_dir():
        return StepState(step, path, ("does not exist",))
    problems += _zip_problems(path / "data.pt", "data.pt (the data loader's position, written after the model)")
    roles = [role for role in _ROLES if (path / role).is_dir()]
    if "actor" not in roles:
        problems.append("no actor/ directory")
    for role in roles:
        problems += [f"{role}/dist_ckpt: {p}" for p in dist_ckpt_problems(path / role / "dist_ckpt")]
    return StepState(step, path, tuple(problems))


def _zip_problems(path: Path, what: str) -> list[str]:
    if not path.is_file():
        return [f"missing {what}"]
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        return [f"{path.name} is not a readable torch.save archive ({exc}): truncated?"]
    return []


def dist_ckpt_problems(dist: Path) -> list[str]:
    """What makes a Megatron dist checkpoint directory incomplete (empty: complete)."""
    if not dist.is_dir():
        return ["missing (the save never started writing shards)"]
    meta = dist / "metadata.json"
    if not meta.is_file():
        return ["no metadata.json (megatron-core writes it after every shard: the save did not finish)"]
    problems = []
    try:
        backend = json.loads(meta.read_text(encoding="utf-8")).get("sharded_backend")
    except (ValueError, OSError, AttributeError) as exc:
        problems.append(f"metadata.json is not readable JSON ({exc})")
    else:
        if backend != "torch_dist":
            problems.append(f"metadata.json names sharded_backend {backend!r}, expected 'torch_dist'")
    problems += _zip_problems(dist / "common.pt", "common.pt")
    problems += _shard_problems(dist)
    return problems


def _shard_problems(dist: Path) -> list[str]:
    """Every ``*.distcp`` file ``.metadata`` names exists and is at least as long as the items it records."""
    index = dist / ".metadata"
    if not index.is_file():
        return ["missing .metadata (torch's index of the shard files)"]
    try:
        if index.stat().st_size > _MAX_METADATA:
            return []
        needed = _required_sizes(index.read_bytes())
    except Exception as exc:  # any unreadable index is reported, whatever the unpickler met
        return [f".metadata cannot be read ({type(exc).__name__}: {exc}): truncated?"]
    if not needed:
        return [".metadata records no shard file"]
    problems = []
    for name, size in sorted(needed.items()):
        shard = dist / name
        if not shard.is_file():
            problems.append(f"missing shard {name}")
        elif (found := shard.stat().st_size) < size:
            problems.append(f"shard {name} is {found} bytes, .metadata records items up to byte {size}: truncated")
    return problems


class _Record:
    """Stands in for any class named in the pickled metadata: keeps its state, runs no upstream code."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Record:
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        parts = state if isinstance(state, tuple) else (state,)
        for part in parts:
            if isinstance(part, dict):
                self.__dict__.update(part)


class _MetadataUnpickler(pickle.Unpickler):
    """Reads torch's checkpoint ``Metadata`` without torch and without running what the pickle names."""

    _SAFE: ClassVar[frozenset[tuple[str, str]]] = frozenset(
        {("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice")}
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._SAFE:
            return super().find_class(module, name)
        return type(name, (_Record,), {})


def _required_sizes(data: bytes) -> dict[str, int]:
    """Per shard file, the end of the last item ``.metadata`` places in it."""
    import io

    metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(storage, dict):
        msg = f"no storage_data mapping in the pickled metadata (found {type(storage).__name__})"
        raise ValueError(msg)
    needed: dict[str, int] = {}
    for info in storage.values():
        name, offset, length = (getattr(info, key, None) for key in ("relative_path", "offset", "length"))
        if isinstance(name, str) and isinstance(offset, int) and isinstance(length, int):
            needed[name] = max(needed.get(name, 0), offset + length)
    return needed


def _resume_hint(root: Path, states: Iterable[StepState], broken: Path | None) -> str:
    complete = [s for s in states if s.complete]
    aside = f"move {broken} aside (e.g. mv {broken} {broken}.broken) and " if broken is not None else ""
    if complete:
        best = complete[-1]
        return (
            f"Fix: {aside}resume from the newest complete checkpoint, global_step_{best.step}: "
            f"trainer.resume_mode=resume_path trainer.resume_from_path={best.path} (or write {best.step} to "
            f"{root / TRACKER}). To start again from step 0 on purpose, move the global_step_* directories aside or "
            "set trainer.resume_mode=disable."
        )
    return (
        "Fix: no complete checkpoint is left under it; to start again from step 0 on purpose, move the "
        "global_step_* directories and the tracker aside (or set trainer.resume_mode=disable)."
    )


def resume_decision(root: Path, *, resume_from: Path | None = None) -> ResumeDecision:
    """Where ``resume_mode=auto`` (or ``resume_path`` with ``resume_from``) may resume from ``root``, or why not.

    verl alone resumes from whatever the tracker names, crashes inside the worker on a partial one, and starts from
    step 0 without a word when the tracker or its directory is missing. Here a resume is accepted only from a
    complete checkpoint, and step 0 only when no checkpoint directory exists at all.
    """
    states = [inspect_step(path) for _, path in step_dirs(root)]
    if resume_from is not None:
        state = inspect_step(resume_from)
        if state.complete:
            return ResumeDecision(state.step, f"resumes from {state.path} (complete)")
        msg = f"trainer.resume_from_path={resume_from} is not a complete checkpoint: {'; '.join(state.problems)}. "
        return ResumeDecision(None, msg + _resume_hint(root, states, None))
    tracked = read_tracker(root)
    if tracked is None:
        if not states:
            return ResumeDecision(0, f"no checkpoint under {root}: starts from step 0")
        listed = "; ".join(s.describe() for s in states)
        msg = (
            f"checkpoint directories exist under {root} but no {TRACKER}: verl would start again from step 0 and "
            f"ignore them ({listed}). "
        )
        return ResumeDecision(None, msg + _resume_hint(root, states, None))
    if isinstance(tracked, str):
        return ResumeDecision(None, f"{tracked}. " + _resume_hint(root, states, root / TRACKER))
    state = next((s for s in states if s.step == tracked), None) or inspect_step(root / f"global_step_{tracked}")
    if state.complete:
        return ResumeDecision(tracked, f"resumes from {state.path} (complete)")
    others = [s for s in states if s.step != tracked]
    msg = f"{TRACKER} names step {tracked}, but {state.describe()}. "
    broken = state.path if state.path.exists() else None
    return ResumeDecision(None, msg + _resume_hint(root, others, broken))


def stale_steps(root: Path, newest: int, keep: int) -> list[Path]:
    """Directories to delete once ``global_step_<newest>`` is complete and tracked, keeping ``keep`` checkpoints.

    The newest ``keep`` complete checkpoints up to ``newest`` stay (``newest`` included); every older directory
    goes, partial ones too (a save cut off earlier, which no resume can use). Later steps are never touched.
    """
    if keep < 1:
        return []
    older = [inspect_step(path) for step, path in step_dirs(root) if step < newest]
    kept = [s for s in older if s.complete][-(keep - 1) :] if keep > 1 else []
    return [s.path for s in older if s not in kept]
