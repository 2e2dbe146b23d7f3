"""Where a checkpoint is, from the path a user types: the one reading every command shares.

Users point at a checkpoint in several ways: verl's ``global_step_N``, its ``actor/``, the ``dist_ckpt/`` inside it,
a dist checkpoint of its own (``convert-weights all``'s ``mcore``), or an HF directory; relative or absolute, through
symlinks, with or without a trailing slash. Each resolves to the same answer here: the checkpoint's *root* (the
directory an output must stay out of, and may sit beside), its dist checkpoint and the HF directory holding its
config and tokenizer. Messages name the path as the user gave it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from r1_ascend.weights.errors import CheckpointFormatError, OutputExistsError

_STEP = re.compile(r"global_step_\d+")
_METADATA = "metadata.json"

VERL_STEP, VERL_ACTOR, VERL_DIST, DIST, HF = "verl-step", "verl-actor", "verl-dist-ckpt", "dist-ckpt", "hf"


@dataclass(frozen=True)
class CheckpointRoot:
    """A checkpoint found from ``given`` (the path as typed)."""

    given: Path
    kind: str  # VERL_STEP | VERL_ACTOR | VERL_DIST | DIST | HF
    root: Path  # resolved: the whole checkpoint (verl's global_step_N when inside one)
    dist_ckpt: Path | None  # resolved dist checkpoint directory (None for an HF directory)
    hf_dir: Path | None  # resolved directory with config.json + tokenizer, when one is known


def _verl_root(actor: Path) -> Path:
    """verl's ``global_step_N`` when ``actor`` is its ``actor/`` directory, else ``actor`` itself."""
    return actor.parent if actor.name == "actor" and _STEP.fullmatch(actor.parent.name) else actor


def _manifest_hf(dist: Path) -> Path | None:
    """The HF directory a ``to-megatron`` output was converted from (its manifest), if it still has config.json."""
    from r1_ascend.weights.manifest import read_megatron_manifest

    manifest = read_megatron_manifest(dist)
    if manifest is None or not manifest.source:
        return None
    source = Path(manifest.source)
    return source if (source / "config.json").is_file() else None


def find_root(path: str | Path) -> CheckpointRoot:
    """Classify ``path`` and find the checkpoint's root, dist checkpoint and HF directory.

    Raises CheckpointFormatError naming ``path`` when it is none of the known layouts.
    """
    given = Path(path)
    here = given.expanduser().resolve()
    if (here / "actor" / "dist_ckpt" / _METADATA).is_file():
        return CheckpointRoot(given, VERL_STEP, here, here / "actor" / "dist_ckpt", here / "actor" / "huggingface")
    if (here / "dist_ckpt" / _METADATA).is_file():
        return CheckpointRoot(given, VERL_ACTOR, _verl_root(here), here / "dist_ckpt", here / "huggingface")
    if (here / _METADATA).is_file():
        parent = here.parent
        if here.name == "dist_ckpt" and (parent.name == "actor" or (parent / "huggingface").is_dir()):
            return CheckpointRoot(given, VERL_DIST, _verl_root(parent), here, parent / "huggingface")
        return CheckpointRoot(given, DIST, here, here, _manifest_hf(here))
    if (here / "config.json").is_file():
        return CheckpointRoot(given, HF, here, None, here)
    if (here / "dist_ckpt").is_dir() or (here / "actor" / "dist_ckpt").is_dir():
        msg = (
            f"{given} is an unfinished save: its dist_ckpt has no metadata.json (verl writes it last). Use an earlier "
            "global_step_N."
        )
        raise CheckpointFormatError(msg)
    msg = (
        f"{given} is not a checkpoint: expected verl's global_step_N (or its actor/ or actor/dist_ckpt/), a Megatron "
        "dist checkpoint directory (metadata.json) or an HF directory (config.json)."
    )
    raise CheckpointFormatError(msg)


def refuse_nested(source: str | Path, out: str | Path, root: Path | None = None) -> None:
    """Refuse an output that is the checkpoint, contains it or lies inside it; beside it is fine.

    ``root`` is the checkpoint's resolved root (default: ``source`` resolved); messages name both paths as given.
    """
    src = root if root is not None else Path(source).expanduser().resolve()
    dst = Path(out).expanduser().resolve()
    where = f"the source checkpoint {source}" + (f" (whole checkpoint: {src})" if root is not None else "")
    if src == dst or dst in src.parents:
        msg = (
            f"output {out} contains {where}; the converter never writes over or deletes its input. Choose an output "
            "directory outside the source, e.g. beside it."
        )
        raise OutputExistsError(msg)
    if src in dst.parents:
        msg = (
            f"output {out} lies inside {where}; its shards would be mixed with the source's files (and a later run "
            "would read them as part of the input). Choose an output directory outside the source, e.g. beside it."
        )
        raise OutputExistsError(msg)
