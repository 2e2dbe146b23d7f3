"""Parse verl's console metric lines (``step:N - key:value - ...``) out of a raw, possibly messy job log.

verl 0.6.1's console logger prints one line per ``Tracking.log`` call: ``step:<N>`` followed by `` - key:value``
for every numeric metric, values formatted with ``pprint.pformat``. In a real job log these lines carry Ray's
``(TaskRunner pid=…)`` prefix, may contain ANSI colour codes, may be interleaved with other processes' output and
the last line may be cut off. The parser keeps every value it can read with certainty and reports the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from r1_ascend.report.lifecycle import RESUME, LifecycleEvent, LifecycleScanner, LogLine

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# "step:N" at the start of the text or after whitespace, ")" or "]" (a Ray prefix), followed by " - " or the end.
_STEP = re.compile(r"(?<![^\s)\]])step:(\d+)(?= - |\s*$)")
# numpy scalars print as np.float64(1.5) under numpy >= 2; accept both spellings.
_WRAPPED_NUMBER = re.compile(r"^(?:np\.|numpy\.)?(?:float|int|uint|bool_?)\d*\((?P<inner>[^()]*)\)$")


@dataclass(frozen=True)
class ParseProblem(LogLine):
    """A piece of a log line that could not be read; reported to the user instead of guessed."""

    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class StepRecord:
    """One console metrics line: the step and the values it carried, in file order."""

    step: int
    metrics: dict[str, float]
    source: str
    line_no: int
    order: int = 0


@dataclass(frozen=True)
class ResumeMarker(LogLine):
    """A checkpoint restore announced in the log (verl's "Setting global step to N")."""

    step: int


@dataclass
class ConsoleLog:
    """Everything read from one log; records and lifecycle events interleave by their ``order``."""

    records: list[StepRecord] = field(default_factory=list)
    resume_markers: list[ResumeMarker] = field(default_factory=list)
    events: list[LifecycleEvent] = field(default_factory=list)
    problems: list[ParseProblem] = field(default_factory=list)


def parse_number(text: str) -> float | None:
    """Read a value as verl's console logger prints it; None when it is not a complete number."""
    token = text.strip()
    wrapped = _WRAPPED_NUMBER.match(token)
    if wrapped:
        token = wrapped.group("inner").strip()
    if token == "True":
        return 1.0
    if token == "False":
        return 0.0
    if not token or "_" in token:
        return None
    try:
        value = float(token)
    except ValueError:
        return None
    return value


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def parse_console_text(text: str, source: str) -> ConsoleLog:
    """Parse a whole log text; ``source`` names it in problems and resume points."""
    log = ConsoleLog()
    scanner = LifecycleScanner(source)
    physical_lines = text.splitlines(keepends=True)
    for index, raw_line in enumerate(physical_lines):
        line_no = index + 1
        is_unterminated_last = index == len(physical_lines) - 1 and not raw_line.endswith(("\n", "\r"))
        clean = strip_ansi(raw_line).rstrip("\r\n")
        # tqdm redraws with carriage returns; each piece is a separate write to the terminal.
        pieces = clean.split("\r")
        for piece_index, piece in enumerate(pieces):
            truncated = is_unterminated_last and piece_index == len(pieces) - 1
            _parse_piece(piece, source, line_no, truncated, log, scanner)
    return log


def parse_console_file(path: Path) -> ConsoleLog:
    """Parse a log file; undecodable bytes are replaced rather than failing the whole report."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    return parse_console_text(text, str(path))


def _parse_piece(
    piece: str, source: str, line_no: int, truncated: bool, log: ConsoleLog, scanner: LifecycleScanner
) -> None:
    order = len(log.records) + len(log.events)
    # verl prints one metrics line per call; only the first "step:N" of a piece starts a record.
    match = _STEP.search(piece)
    if match is None:
        for event in scanner.scan(piece, line_no, order):
            log.events.append(event)
            if event.kind == RESUME and event.step is not None:
                log.resume_markers.append(ResumeMarker(step=event.step, source=source, line_no=line_no))
        return
    metrics = _parse_pairs(piece[match.end() :], source, line_no, truncated, log)
    record = StepRecord(step=int(match.group(1)), metrics=metrics, source=source, line_no=line_no, order=order)
    log.records.append(record)


def _parse_pairs(segment: str, source: str, line_no: int, truncated: bool, log: ConsoleLog) -> dict[str, float]:
    parts = segment.split(" - ")
    # parts[0] is what sits between "step:N" and the first " - ": empty in a well-formed line.
    pairs = parts[1:]
    if truncated and pairs:
        dropped = pairs.pop()
        log.problems.append(
            ParseProblem(source, line_no, f"line ends without a newline (log cut off); dropped {dropped.strip()!r}")
        )
    metrics: dict[str, float] = {}
    for pair in pairs:
        key, sep, value_text = pair.rpartition(":")
        key = key.strip()
        value = parse_number(value_text) if sep else None
        if not key or value is None or any(ch.isspace() for ch in key):
            log.problems.append(ParseProblem(source, line_no, f"unreadable metric {pair.strip()[:80]!r}; skipped"))
            continue
        metrics[key] = value
    return metrics
