"""Load one training run from its logs into a per-step metric table, applying the resume rule.

Inputs are console logs, TensorBoard event files and generation dumps, given as files or found under a run
directory. Rules (documented in docs/report.md):

- **Last occurrence wins, per metric.** A step logged again (a run resumed from an earlier checkpoint re-runs
  steps; verl also logs validation at the restored step) overwrites only the metrics the later line carries.
- **Resume points** are where a step number goes back to (or repeats) one already seen, or where a new trainer
  process starts (verl's "Setting global step to N", "Training from scratch", "Total training steps" printed again,
  the progress bar restarting); each process lifetime is an attempt (:mod:`r1_ascend.report.attempts`).
- **Console before TensorBoard.** Console values are exact; TensorBoard stores float32. TensorBoard only fills
  metrics (or steps) the console logs lack, e.g. after a truncated log.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from r1_ascend.report.attempts import Attempt, AttemptTracker, Planned, conclude
from r1_ascend.report.console import ConsoleLog, ParseProblem, parse_console_file
from r1_ascend.report.generations import (
    GenerationSample,
    find_dump_files,
    read_dump_directory,
    samples_from_tensorboard_text,
)
from r1_ascend.report.lifecycle import LifecycleEvent
from r1_ascend.report.metric_names import TRAINING_STEP_MARKERS
from r1_ascend.report.run_config import find_run_configs, planned_from_configs
from r1_ascend.report.tensorboard_events import (
    EVENT_FILE_GLOB,
    TensorboardUnavailableError,
    find_event_files,
    read_event_files,
)

logger = logging.getLogger(__name__)

LOG_SUFFIXES = (".log", ".txt", ".out", ".err")


class RunInputError(ValueError):
    """The given paths hold no readable verl metrics (or do not exist)."""


@dataclass(frozen=True)
class ResumePoint:
    """Where the metric stream restarts: ``restart_step`` follows a highest-seen step ``previous_max``."""

    restart_step: int
    previous_max: int
    source: str
    line_no: int | None
    reason: str


@dataclass
class RunData:
    name: str
    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    resume_points: list[ResumePoint] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    console_files: list[Path] = field(default_factory=list)
    event_files: list[Path] = field(default_factory=list)
    dump_dirs: list[Path] = field(default_factory=list)
    overwritten_values: int = 0
    filled_from_tensorboard: int = 0
    reward_components: dict[str, dict[int, float]] = field(default_factory=dict)
    samples: list[GenerationSample] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    config_planned: Planned | None = None
    # Highest step since the last resume point; a step at or below it starts a new segment.
    segment_max_step: int | None = None

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Steps and finite values of one metric, in step order."""
        steps, values = [], []
        for step in sorted(self.steps):
            value = self.steps[step].get(key)
            if value is not None and math.isfinite(value):
                steps.append(step)
                values.append(value)
        return steps, values

    def keys(self) -> set[str]:
        return {key for metrics in self.steps.values() for key in metrics}

    def training_steps(self) -> list[int]:
        """Steps that describe a training iteration (not a validation-only line such as step 0)."""
        return sorted(s for s, m in self.steps.items() if any(k in m for k in TRAINING_STEP_MARKERS))


#: Sample generations shown per dump directory, and the characters kept of each prompt and response.
DEFAULT_SAMPLES = 3
DEFAULT_SAMPLE_CHARS = 600


class _Sources(NamedTuple):
    """The inputs found under the given paths, by kind."""

    console: list[Path]
    events: list[Path]
    dump_roots: list[Path]
    configs: list[Path]


def load_run(
    paths: list[Path],
    name: str | None = None,
    samples_wanted: int = DEFAULT_SAMPLES,
    sample_chars: int = DEFAULT_SAMPLE_CHARS,
    read_dumps: bool = True,
    config_paths: list[Path] | None = None,
) -> RunData:
    """Read a run from log files and/or run directories (given in chronological order for multi-part logs)."""
    sources = _discover(paths)
    run = RunData(name=name or _default_name(paths))
    run.console_files = sources.console
    run.event_files = sources.events
    run.config_planned = planned_from_configs([*(config_paths or []), *sources.configs])

    tracker = AttemptTracker()
    for path in sources.console:
        log = parse_console_file(path)
        run.problems.extend(str(p) for p in log.problems)
        _merge_console(run, log, tracker)
    console_seen = bool(run.steps)

    if sources.events:
        try:
            _merge_tensorboard(run, sources.events, samples_wanted, sample_chars, record_resumes=not console_seen)
        except TensorboardUnavailableError as exc:
            if not console_seen:
                raise
            run.problems.append(f"TensorBoard files skipped: {exc}")

    if read_dumps:
        _merge_dumps(run, sources.dump_roots, samples_wanted, sample_chars)

    if not run.steps:
        looked_at = ", ".join(str(p) for p in paths)
        msg = (
            f"no verl metrics found in {looked_at}: expected console lines like 'step:1 - timing_s/step:12.3' "
            f"(files ending in {', '.join(LOG_SUFFIXES)} inside a directory, or any file given directly) or "
            f"TensorBoard files '{EVENT_FILE_GLOB}'; point the command at the job's log or TENSORBOARD_DIR"
        )
        raise RunInputError(msg)
    run.steps = dict(sorted(run.steps.items()))
    run.attempts = tracker.attempts
    if not run.attempts:  # TensorBoard only: one attempt spanning the training steps, no lifecycle lines
        training = run.training_steps()
        if training:
            run.attempts = [Attempt(1, str(run.event_files[0]) if run.event_files else run.name, 0, "log start")]
            run.attempts[0].first_step, run.attempts[0].last_step = training[0], training[-1]
    conclude(run.attempts, run.config_planned)
    return run


def _default_name(paths: list[Path]) -> str:
    first = paths[0]
    return first.name if first.is_dir() else first.stem


def _discover(paths: list[Path]) -> _Sources:
    sources = _Sources([], [], [], [])
    for path in paths:
        if not path.exists():
            msg = f"{path} does not exist; pass a verl job log, a TensorBoard directory or a run directory"
            raise RunInputError(msg)
        if path.is_dir():
            logs = [p for p in path.rglob("*") if p.is_file() and p.suffix in LOG_SUFFIXES]
            # Within a directory, older logs first (a resumed job usually writes a new log file).
            sources.console.extend(sorted(logs, key=lambda p: (p.stat().st_mtime, str(p))))
            sources.events.extend(find_event_files(path))
            sources.dump_roots.append(path)
            sources.configs.extend(find_run_configs(path))
        elif path.name.startswith("events.out.tfevents."):
            sources.events.append(path)
        else:
            sources.console.append(path)
    return sources


def _merge_console(run: RunData, log: ConsoleLog, tracker: AttemptTracker) -> None:
    items = sorted(
        [(e.order, 0, e) for e in log.events] + [(r.order, 1, r) for r in log.records], key=lambda e: (e[0], e[1])
    )
    new_attempt = False
    before: int | None = run.segment_max_step
    for _, _, item in items:
        if isinstance(item, LifecycleEvent):
            count = len(tracker.attempts)
            tracker.event(item)
            if len(tracker.attempts) != count:
                new_attempt, before = True, run.segment_max_step
                run.segment_max_step = None
            continue
        segment_max = run.segment_max_step
        repeats = segment_max is not None and item.step <= segment_max
        is_training = any(k in item.metrics for k in TRAINING_STEP_MARKERS)
        if tracker.record(item.step, is_training, item.source, item.line_no, repeats):
            new_attempt, before = True, segment_max
        attempt = tracker.current
        if new_attempt and attempt is not None:
            _add_resume_point(run, attempt, item.step, before, item.source, item.line_no)
            run.segment_max_step = item.step
        else:
            run.segment_max_step = item.step if segment_max is None else max(segment_max, item.step)
        new_attempt = False
        _store(run, item.step, item.metrics)


def _add_resume_point(
    run: RunData, attempt: Attempt, step: int, previous_max: int | None, source: str, line_no: int
) -> None:
    """A resume point at the first metrics line of an attempt that did not start the run."""
    if attempt.index == 1 and attempt.resumed_from is None:
        return
    previous = -1 if previous_max is None else previous_max
    if attempt.start == "checkpoint restore" and attempt.resumed_from is not None:
        reason = f"checkpoint restore announced (verl: 'Setting global step to {attempt.resumed_from}')"
        if attempt.checkpoint_path:
            reason += f" from `{attempt.checkpoint_path}`"
        restart = attempt.resumed_from
    elif attempt.start.startswith("fresh start"):
        reason, restart = "restarted from scratch (verl: 'Training from scratch', no checkpoint found)", step
    elif attempt.start == "step counter restart" and attempt.resumed_from is not None:
        reason = f"the 'Training Progress' bar restarted at step {attempt.resumed_from}"
        restart = attempt.resumed_from
    elif previous_max is not None and step <= previous_max:
        reason, restart = f"step {step} logged again after step {previous_max}", step
    else:
        reason, restart = f"a new trainer process started ({attempt.start})", step
    run.resume_points.append(ResumePoint(restart, previous, source, line_no, reason))


def _store(run: RunData, step: int, metrics: dict[str, float]) -> None:
    target = run.steps.setdefault(step, {})
    for key, value in metrics.items():
        if key in target:
            run.overwritten_values += 1
        target[key] = value


def _merge_tensorboard(
    run: RunData, paths: list[Path], samples_wanted: int, sample_chars: int, record_resumes: bool
) -> None:
    files = read_event_files(paths)
    tb_steps: dict[int, dict[str, float]] = {}
    texts: dict[int, str] = {}
    max_step: int | None = None
    for data in files:
        if data.problem:
            run.problems.append(data.problem)
        file_first = True
        for event in data.scalars:
            if record_resumes and file_first and max_step is not None and event.step <= max_step:
                reason = f"new event file restarts at step {event.step} after step {max_step}"
                run.resume_points.append(ResumePoint(event.step, max_step, str(data.path), None, reason))
            file_first = False
            tb_steps.setdefault(event.step, {})[event.key] = event.value
            max_step = event.step if max_step is None else max(max_step, event.step)
        texts.update(data.texts)
    for step, metrics in tb_steps.items():
        target = run.steps.setdefault(step, {})
        for key, value in metrics.items():
            if key not in target:
                target[key] = value
                run.filled_from_tensorboard += 1
    if texts and not run.samples:
        last = max(texts)
        run.samples.extend(samples_from_tensorboard_text(texts[last], last, samples_wanted, sample_chars))


def _merge_dumps(run: RunData, roots: list[Path], samples_wanted: int, sample_chars: int) -> None:
    dump_samples: list[GenerationSample] = []
    for root in roots:
        for directory, files in find_dump_files(root).items():
            label = directory.name if directory != root else root.name
            dump = read_dump_directory(directory, files, label, samples_wanted, sample_chars)
            run.dump_dirs.append(directory)
            run.problems.extend(str(p) for p in dump.problems)
            for key, by_step in dump.component_means.items():
                run.reward_components[f"{label}/{key}"] = by_step
            dump_samples.extend(dump.samples)
    if dump_samples:
        # Dumps hold the full text and ground truth; prefer them over TensorBoard's Markdown.
        run.samples = dump_samples


def problems_summary(problems: list[ParseProblem | str], limit: int = 20) -> list[str]:
    lines = [str(p) for p in problems[:limit]]
    if len(problems) > limit:
        lines.append(f"… and {len(problems) - limit} more")
    return lines
