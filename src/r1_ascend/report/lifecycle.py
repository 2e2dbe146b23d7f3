"""Lifecycle lines of a verl job log: planned length, process starts, checkpoint restores and error lines.

verl 0.6.1 prints, on the driver's ``TaskRunner``:

- ``Total training steps: N`` once per process start (``RayPPOTrainer._create_dataloader``); the run's planned last
  step. The ``Training Progress`` tqdm bar (``total=total_training_steps``, ``initial=global_steps``) repeats it.
- ``Load from checkpoint folder: …/global_step_N``, ``Setting global step to N`` and ``Resuming from …`` when
  ``_load_checkpoint`` restores a checkpoint, ``Training from scratch`` when ``resume_mode=auto`` finds none.
- Nothing when it dies: the error reaches the log as a Python traceback, often through Ray (the driver re-raises a
  worker's exception as ``ray.exceptions.RayTaskError(RuntimeError): ray::TaskRunner.run() …`` followed by the
  worker's frames and the original ``RuntimeError: …`` line), with or without Ray's ``(TaskRunner pid=…)`` prefix.

The scanner turns such lines into ordered events; :mod:`r1_ascend.report.run` splits the log into attempts with them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PLANNED = "planned"
RESUME = "resume"
CHECKPOINT_PATH = "checkpoint path"
FRESH_START = "fresh start"
LOOP_START = "loop start"
PROGRESS = "progress"
ERROR = "error"

# Kinds printed once each time a trainer process starts; a second one means a new attempt.
START_KINDS = frozenset({PLANNED, RESUME, FRESH_START, LOOP_START})

# Error ranks, best first: the root cause of a traceback, any "SomethingError: …" line, a logger ERROR line.
RANK_TRACEBACK = 0
RANK_EXCEPTION_LINE = 1
RANK_LOGGER_ERROR = 2

_RAY_PREFIX = re.compile(r"^\((?P<process>[A-Za-z_][^()]*)\)\s?")
_PLANNED = re.compile(r"Total training steps: (\d+)")
_RESUME = re.compile(r"Setting global step to (\d+)")
_CHECKPOINT = re.compile(r"(?:Resuming from|Load from checkpoint folder:) (\S.*?)\s*$")
_FRESH = re.compile(r"\bTraining from scratch\b")
# tqdm: "Training Progress:   5%|▌         | 5/100 [00:00<?, ?it/s]"; elapsed 00:00 and no rate = a (re)start.
_PROGRESS = re.compile(r"Training Progress:\s*\d+%\|[^|]*\|\s*(\d+)/(\d+)\s*\[(?P<elapsed>[\d:]+)<(?P<rest>[^\]]*)\]")
_TRACEBACK_START = "Traceback (most recent call last):"
_CHAIN_TEXT = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# Inside a traceback: an unindented "Name: message", "module.Name(Inner): message" or a bare "Name".
_TRACEBACK_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:\([\w.]+\))?(?::\s.*|:?)$")
# Anywhere: a class name ending in Error/Exception followed by ": message".
_EXCEPTION_LINE = re.compile(r"(?<![\w.])(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)(?:\([\w.]+\))?: \S")
# Logger lines: vLLM "ERROR 11-20 08:01:02 [...]", CANN "[ERROR] RUNTIME(...)", Python logging "... - ERROR - ...".
_LOGGER_ERROR = re.compile(r"^(?:ERROR|CRITICAL)\s|\[(?:ERROR|CRITICAL)\]|\s-\s(?:ERROR|CRITICAL)\s-\s")


@dataclass(frozen=True)
class LogLine:
    """Where something was read: the log (or file) it came from and the 1-based line number."""

    source: str
    line_no: int

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line_no}"


@dataclass(frozen=True)
class LifecycleEvent(LogLine):
    """One lifecycle line; ``order`` sorts it among the metric records of the same log."""

    kind: str
    order: int
    step: int | None = None
    total: int | None = None
    text: str = ""
    rank: int = RANK_LOGGER_ERROR
    block: int | None = None


@dataclass
class _Traceback:
    block: int
    after_exception: bool = False


@dataclass
class LifecycleScanner:
    """Stateful per log: tracebacks are followed per process (Ray interleaves several processes' output)."""

    source: str
    _open: dict[str, _Traceback] = field(default_factory=dict)
    _blocks: int = 0

    def scan(self, piece: str, line_no: int, order: int) -> list[LifecycleEvent]:
        prefix = _RAY_PREFIX.match(piece)
        process = prefix.group("process") if prefix else ""
        text = piece[prefix.end() :] if prefix else piece
        events = self._traceback_line(text, process, line_no, order)
        if events is not None:
            return events

        def event(kind: str, **values: object) -> LifecycleEvent:
            return LifecycleEvent(self.source, line_no, kind, order, **values)  # type: ignore[arg-type]

        found: list[LifecycleEvent] = []
        if match := _PLANNED.search(text):
            found.append(event(PLANNED, total=int(match.group(1))))
        if match := _RESUME.search(text):
            found.append(event(RESUME, step=int(match.group(1))))
        if match := _CHECKPOINT.search(text):
            found.append(event(CHECKPOINT_PATH, text=match.group(1)))
        if _FRESH.search(text):
            found.append(event(FRESH_START))
        if match := _PROGRESS.search(text):
            step, total = int(match.group(1)), int(match.group(2))
            starting = match.group("elapsed").strip("0:") == "" and match.group("rest").startswith("?")
            found.append(event(LOOP_START if starting else PROGRESS, step=step, total=total))
        stripped = text.strip()
        if _EXCEPTION_LINE.search(text):
            found.append(event(ERROR, text=stripped, rank=RANK_EXCEPTION_LINE))
        elif _LOGGER_ERROR.search(text):
            found.append(event(ERROR, text=stripped, rank=RANK_LOGGER_ERROR))
        return found

    def _traceback_line(self, text: str, process: str, line_no: int, order: int) -> list[LifecycleEvent] | None:
        """Events of a traceback line, or None when the line is not part of a traceback."""
        if text.strip() == _TRACEBACK_START:
            self._blocks += 1
            self._open[process] = _Traceback(self._blocks)
            return []
        current = self._open.get(process)
        if current is None:
            return None
        if not text.strip() or text.strip() in _CHAIN_TEXT or text[:1].isspace():
            return []  # frames, source lines, blank lines and chaining sentences stay inside the block
        if _TRACEBACK_EXCEPTION.match(text.rstrip()):
            current.after_exception = True
            error = LifecycleEvent(
                self.source, line_no, ERROR, order, text=text.strip(), rank=RANK_TRACEBACK, block=current.block
            )
            return [error]
        del self._open[process]  # any other unindented line ends the traceback
        return None


def root_cause(errors: list[LifecycleEvent]) -> tuple[LifecycleEvent | None, LifecycleEvent | None]:
    """The error line that best explains a death, and the wrapper it was reported through (if any).

    The first traceback wins; within it, the last exception line is the innermost cause (Ray prints the wrapper
    ``RayTaskError(...)`` first and the worker's original exception last). Without a traceback, the first
    ``…Error: …`` line, else the first logger ERROR line.
    """
    tracebacks = [e for e in errors if e.rank == RANK_TRACEBACK]
    if tracebacks:
        block = tracebacks[0].block
        lines = [e for e in tracebacks if e.block == block]
        wrapper = lines[0] if len(lines) > 1 and lines[0].text != lines[-1].text else None
        return lines[-1], wrapper
    for rank in (RANK_EXCEPTION_LINE, RANK_LOGGER_ERROR):
        ranked = [e for e in errors if e.rank == rank]
        if ranked:
            return ranked[0], None
    return None, None
