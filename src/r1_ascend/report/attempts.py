"""Attempts of one run (one trainer process lifetime each) and how each one ended.

A run that dies and is resumed leaves several attempts in its logs. A new attempt starts where verl prints a
start-of-process line a second time (``Total training steps``, ``Setting global step to N``, ``Training from
scratch``, a tqdm bar restarting at 00:00) or where a step number goes back to one already seen. An attempt ended
early when a later attempt follows it, or when it is the last one and its last step is below the planned last step;
the error that ended it is looked for after its last metrics line (see :func:`lifecycle.root_cause`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from r1_ascend.report.lifecycle import (
    CHECKPOINT_PATH,
    ERROR,
    FRESH_START,
    LOOP_START,
    PLANNED,
    PROGRESS,
    RESUME,
    START_KINDS,
    LifecycleEvent,
    root_cause,
)

COMPLETED = "completed"
DIED = "died"
ENDED = "ended"  # last attempt, planned last step unknown, no error: cannot tell


@dataclass
class Planned:
    total: int
    origin: str


@dataclass
class Attempt:
    index: int
    source: str
    line_no: int
    start: str  # what opened it: "log start", "checkpoint restore", "fresh start", "step counter restart"
    resumed_from: int | None = None
    checkpoint_path: str | None = None
    planned: Planned | None = None
    first_step: int | None = None
    last_step: int | None = None
    last_record_where: str | None = None
    kinds_seen: set[str] = field(default_factory=set)
    records: int = 0
    errors_after_last_step: list[LifecycleEvent] = field(default_factory=list)
    outcome: str = ENDED
    error: LifecycleEvent | None = None
    error_wrapper: LifecycleEvent | None = None

    @property
    def died_during(self) -> int:
        """The step that was running when the attempt ended early."""
        if self.last_step is not None:
            return self.last_step + 1
        return (self.resumed_from or 0) + 1


@dataclass
class AttemptTracker:
    """Fed with records and lifecycle events in log order; opens attempts and tracks each one's steps and errors."""

    attempts: list[Attempt] = field(default_factory=list)

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def _open(self, source: str, line_no: int, start: str) -> Attempt:
        attempt = Attempt(len(self.attempts) + 1, source, line_no, start)
        self.attempts.append(attempt)
        return attempt

    def event(self, event: LifecycleEvent) -> None:
        attempt = self.current
        if event.kind in START_KINDS:
            # validation before training logs a record before the loop starts; only training steps close an attempt.
            # A progress bar is redrawn (and Ray may echo it without its prefix), so a bar seen twice before any
            # step is the same process; the once-per-process lines seen twice are a new one.
            redrawn_bar = event.kind in (LOOP_START, PROGRESS)
            fresh = (
                attempt is None
                or attempt.last_step is not None
                or bool(attempt.errors_after_last_step)
                or (event.kind in attempt.kinds_seen and not redrawn_bar)
            )
            if fresh:
                attempt = self._open(event.source, event.line_no, "log start" if attempt is None else "process start")
            assert attempt is not None
            attempt.kinds_seen.add(event.kind)
        if attempt is None:
            if event.kind == ERROR:
                attempt = self._open(event.source, event.line_no, "log start")
            else:
                return
        if event.kind == PLANNED and event.total is not None:
            attempt.planned = Planned(event.total, f"verl: 'Total training steps: {event.total}' ({event.where})")
        elif event.kind in (LOOP_START, PROGRESS) and event.total is not None and attempt.planned is None:
            attempt.planned = Planned(event.total, f"the 'Training Progress' bar's total ({event.where})")
        if event.kind == RESUME:
            attempt.resumed_from = event.step
            attempt.start = "checkpoint restore"
        elif event.kind == CHECKPOINT_PATH and attempt.checkpoint_path is None:
            attempt.checkpoint_path = event.text
        elif event.kind == FRESH_START:
            attempt.start = "fresh start (no checkpoint found)"
        elif event.kind == LOOP_START and attempt.resumed_from is None and event.step:
            attempt.resumed_from = event.step
            attempt.start = "step counter restart"
        elif event.kind == ERROR:
            attempt.errors_after_last_step.append(event)

    def record(self, step: int, is_training: bool, source: str, line_no: int, repeats: bool) -> bool:
        """Account for a metrics line; True when it opened a new attempt (a step counter going back)."""
        attempt = self.current
        opened = False
        if attempt is None or (repeats and attempt.records):
            attempt = self._open(source, line_no, "log start" if attempt is None else "step counter restart")
            opened = repeats
        attempt.records += 1
        attempt.errors_after_last_step.clear()  # errors the run survived are not what ended it
        if is_training:
            attempt.first_step = step if attempt.first_step is None else min(attempt.first_step, step)
            attempt.last_step = step if attempt.last_step is None else max(attempt.last_step, step)
            attempt.last_record_where = f"{source}:{line_no}"
        return opened


def conclude(attempts: list[Attempt], config_planned: Planned | None) -> None:
    """Decide each attempt's outcome and the error line that explains an early end."""
    for position, attempt in enumerate(attempts):
        if attempt.planned is None and config_planned is not None:
            attempt.planned = config_planned
        final = position == len(attempts) - 1
        planned = attempt.planned.total if attempt.planned else None
        reached = attempt.last_step is not None and planned is not None and attempt.last_step >= planned
        if reached:
            attempt.outcome = COMPLETED
        elif not final or (planned is not None) or attempt.errors_after_last_step:
            attempt.outcome = DIED
        else:
            attempt.outcome = ENDED
        if attempt.outcome == DIED:
            attempt.error, attempt.error_wrapper = root_cause(attempt.errors_after_last_step)
