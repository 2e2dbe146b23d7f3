"""Output-directory policy shared by the converters: refuse foreign content, resume our own, overwrite on request.

A manifest written before any data records the source and the options; a rerun with the same manifest resumes,
anything else in a non-empty directory is refused unless ``overwrite`` is given.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

from r1_ascend.atomic import atomic_write_json
from r1_ascend.weights.ckpt_root import refuse_nested
from r1_ascend.weights.errors import OutputExistsError, OutputNotWritableError


def fingerprint(path: Path) -> str:
    """sha256 of a small file (an index or a config): identifies the source a run started from."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prepare_output(
    out: Path,
    manifest_name: str,
    manifest: dict[str, Any],
    *,
    overwrite: bool,
    source: Path | None = None,
    root: Path | None = None,
    shown_out: Path | None = None,
) -> bool:
    """Make ``out`` ready; returns True when resuming an earlier run with the same manifest.

    ``source`` (the input checkpoint as the user gave it; ``root`` its whole checkpoint when that is larger) must not
    be ``out``, lie inside it or contain it: ``overwrite`` would delete it. ``shown_out`` is ``out`` as given.
    """
    manifest_path = out / manifest_name
    if source is not None:
        refuse_nested(source, shown_out if shown_out is not None else out, root)
    try:
        return _prepare(out, manifest_path, manifest, overwrite=overwrite)
    except OSError as exc:
        raise not_writable(out, exc) from exc


def not_writable(out: Path, exc: OSError) -> OutputNotWritableError:
    """A clean error for a failed write under ``out``: the path, the reason and the fix."""
    where = exc.filename or out
    reason = exc.strerror or type(exc).__name__
    msg = (
        f"cannot write the output {out}: {reason} ({where}). Choose an output directory on writable storage "
        "with enough free space, or make it writable; then rerun the same command (finished files are kept)."
    )
    return OutputNotWritableError(msg)


def _prepare(out: Path, manifest_path: Path, manifest: dict[str, Any], *, overwrite: bool) -> bool:
    if out.exists() and not out.is_dir():
        msg = f"output {out} exists and is not a directory"
        raise OutputExistsError(msg)
    if overwrite and out.exists():
        shutil.rmtree(out)
    if out.exists() and any(out.iterdir()):
        if manifest_path.exists():
            previous = json.loads(manifest_path.read_text())
            if previous == manifest:
                return True
            msg = (
                f"output {out} holds an unfinished or finished conversion from a different source or with different "
                f"options ({manifest_path}). Use a new directory, or pass --overwrite to delete {out} and start again."
            )
            raise OutputExistsError(msg)
        msg = (
            f"output {out} is not empty and was not produced by this converter; nothing was changed. Use an empty "
            "or new directory, or pass --overwrite to delete its contents."
        )
        raise OutputExistsError(msg)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(manifest_path, manifest, sort_keys=True)
    return False


def copy_side_files(src: Path, dst: Path, skip: Collection[str] = ()) -> list[str]:
    """Copy config, tokenizer and code files (every visible file that is not a shard), except ``skip``."""
    copied = []
    for item in sorted(src.iterdir()):
        side = item.is_file() and item.suffix != ".safetensors" and not item.name.startswith(".")
        if side and item.name not in skip:
            shutil.copy2(item, dst / item.name)
            copied.append(item.name)
    return copied
