"""Read the scalars and generation texts verl writes to TensorBoard event files.

verl 0.6.1's ``_TensorboardAdapter`` calls ``SummaryWriter.add_scalar(key, value, step)`` for every metric and
``ValidationGenerationsLogger`` adds a ``val/generations`` text. A restarted job opens a new event file in the same
directory, so files are read one by one (oldest first) instead of through TensorBoard's accumulator, which silently
purges "out of order" steps after a restart. Only the ``tensorboard`` package is needed, not TensorFlow.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

EVENT_FILE_GLOB = "events.out.tfevents.*"
GENERATIONS_TAG = "val/generations"


@dataclass
class ScalarEvent:
    step: int
    key: str
    value: float
    wall_time: float


@dataclass
class EventFileData:
    """One event file's scalars and texts in write order; ``start_time`` orders files of a restarted run."""

    path: Path
    start_time: float
    scalars: list[ScalarEvent] = field(default_factory=list)
    texts: dict[int, str] = field(default_factory=dict)
    problem: str | None = None


class TensorboardUnavailableError(RuntimeError):
    """The tensorboard package is missing; raised only when event files were actually found."""


def read_event_file(path: Path) -> EventFileData:
    """Read every scalar and ``val/generations`` text; a truncated file yields what was readable plus a problem."""
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.util import tensor_util
    except ImportError as exc:
        msg = f"cannot read {path}: the 'tensorboard' package is not installed ({exc}); pip install tensorboard"
        raise TensorboardUnavailableError(msg) from exc

    data = EventFileData(path=path, start_time=float("inf"))
    try:
        for event in EventFileLoader(str(path)).Load():
            data.start_time = min(data.start_time, event.wall_time)
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                _add_value(data, event.step, event.wall_time, value, tensor_util)
    except Exception as exc:  # corrupt or cut-off record: keep what was read before it
        data.problem = f"{path}: stopped reading at a damaged record ({type(exc).__name__}: {exc})"
        logger.warning("%s", data.problem)
    return data


def _add_value(data: EventFileData, step: int, wall_time: float, value: Any, tensor_util: Any) -> None:
    plugin = value.metadata.plugin_data.plugin_name
    tag = value.tag
    if value.HasField("simple_value"):
        data.scalars.append(ScalarEvent(step, tag, float(value.simple_value), wall_time))
        return
    if not value.HasField("tensor"):
        return
    array = tensor_util.make_ndarray(value.tensor)
    if plugin == "text" or array.dtype.kind in ("S", "O", "U"):
        if tag.removesuffix("/text_summary") == GENERATIONS_TAG and array.size:
            item = array.reshape(-1)[0]
            data.texts[step] = item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item)
        return
    if array.size == 1 and array.dtype.kind in ("f", "i", "u", "b"):
        data.scalars.append(ScalarEvent(step, tag, float(array.reshape(-1)[0]), wall_time))


def find_event_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob(EVENT_FILE_GLOB) if p.is_file())


def read_event_files(paths: list[Path]) -> list[EventFileData]:
    """Read files and order them by their first event's time (the order the writers were started)."""
    files = [read_event_file(p) for p in paths]
    return sorted(files, key=lambda f: (f.start_time, str(f.path)))
