"""The per-step timing table in the columns of the recipe's published figures, and window averages.

Every cell comes from one named verl metric (or, for reshard and per-card throughput, a documented formula);
a metric the run did not log leaves the cell empty and is listed, never estimated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from r1_ascend.report import metric_names as mn
from r1_ascend.report.run import RunData

#: NPU dies per card (Atlas A3: 2), for per-card throughput; the report's --dies-per-card default.
DIES_PER_CARD = 2

RESHARD_FROM_TIMER = "timer"
RESHARD_DERIVED = "derived"


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    source: str
    digits: int
    compute: Callable[[dict[str, float], int], float | None]


def _metric(name: str) -> Callable[[dict[str, float], int], float | None]:
    return lambda metrics, _dies: metrics.get(name)


def _per_card(metrics: dict[str, float], dies_per_card: int) -> float | None:
    per_die = metrics.get(mn.THROUGHPUT_PER_DIE)
    return None if per_die is None else per_die * dies_per_card


def reshard_seconds(metrics: dict[str, float]) -> tuple[float | None, str | None]:
    """A dedicated reshard timer if logged; else gen minus the rollout's own generate_sequences time; else none."""
    if mn.RESHARD_TIME in metrics:
        return metrics[mn.RESHARD_TIME], RESHARD_FROM_TIMER
    gen, generate = metrics.get(mn.GEN_TIME), metrics.get(mn.GENERATE_SEQUENCES_TIME)
    if gen is not None and generate is not None:
        return gen - generate, RESHARD_DERIVED
    return None, None


COLUMNS: tuple[Column, ...] = (
    Column("prompt_len", "prompt len (mean)", mn.PROMPT_LENGTH_MEAN, 1, _metric(mn.PROMPT_LENGTH_MEAN)),
    Column("response_len", "response len (mean)", mn.RESPONSE_LENGTH_MEAN, 1, _metric(mn.RESPONSE_LENGTH_MEAN)),
    Column("step_s", "step (s)", mn.STEP_TIME, 1, _metric(mn.STEP_TIME)),
    Column("tps_card", "tokens/s per A3 card", f"dies per card x {mn.THROUGHPUT_PER_DIE}", 1, _per_card),
    Column("tps_die", "tokens/s per die", mn.THROUGHPUT_PER_DIE, 1, _metric(mn.THROUGHPUT_PER_DIE)),
    Column("gen_s", "gen (s)", mn.GEN_TIME, 1, _metric(mn.GEN_TIME)),
    Column(
        "reshard_s",
        "reshard (s)",
        f"{mn.RESHARD_TIME}, else {mn.GEN_TIME} - {mn.GENERATE_SEQUENCES_TIME}",
        1,
        lambda metrics, _dies: reshard_seconds(metrics)[0],
    ),
    Column("reward_s", "reward (s)", mn.REWARD_TIME, 1, _metric(mn.REWARD_TIME)),
    Column("old_log_prob_s", "old log-prob (s)", mn.OLD_LOG_PROB_TIME, 1, _metric(mn.OLD_LOG_PROB_TIME)),
    Column("ref_s", "ref (s)", mn.REF_TIME, 1, _metric(mn.REF_TIME)),
    Column("update_s", "update (s)", mn.UPDATE_ACTOR_TIME, 1, _metric(mn.UPDATE_ACTOR_TIME)),
)


@dataclass
class Window:
    """Inclusive step range; either end may be open."""

    first: int | None = None
    last: int | None = None

    def contains(self, step: int) -> bool:
        return (self.first is None or step >= self.first) and (self.last is None or step <= self.last)

    def describe(self) -> str:
        first = "first" if self.first is None else str(self.first)
        last = "last" if self.last is None else str(self.last)
        return f"{first}–{last}"


@dataclass
class WindowMean:
    value: float | None
    count: int


@dataclass
class TimingTable:
    rows: dict[int, dict[str, float | None]]
    window: Window
    window_steps: list[int]
    means: dict[str, WindowMean]
    reshard_sources: dict[str, int] = field(default_factory=dict)
    missing: dict[str, list[int]] = field(default_factory=dict)


def parse_window(text: str) -> Window:
    """``A:B`` (inclusive), ``A:``, ``:B`` or ``A``; raises ValueError with the expected form."""
    try:
        if ":" not in text:
            step = int(text)
            return Window(step, step)
        first_text, last_text = text.split(":", 1)
        window = Window(int(first_text) if first_text.strip() else None, int(last_text) if last_text.strip() else None)
    except ValueError:
        msg = f"bad step window {text!r}: expected FIRST:LAST (inclusive), FIRST:, :LAST or a single step, e.g. 5:14"
        raise ValueError(msg) from None
    if window.first is not None and window.last is not None and window.first > window.last:
        msg = f"bad step window {text!r}: the first step is after the last"
        raise ValueError(msg)
    return window


def finite_mean(values: list[float | None]) -> WindowMean:
    usable = [v for v in values if v is not None and math.isfinite(v)]
    return WindowMean(sum(usable) / len(usable) if usable else None, len(usable))


def build_timing_table(run: RunData, window: Window, dies_per_card: int = DIES_PER_CARD) -> TimingTable:
    rows: dict[int, dict[str, float | None]] = {}
    reshard_sources: dict[str, int] = {}
    missing: dict[str, list[int]] = {}
    for step in run.training_steps():
        metrics = run.steps[step]
        row = {column.key: column.compute(metrics, dies_per_card) for column in COLUMNS}
        rows[step] = row
        _, reshard_source = reshard_seconds(metrics)
        if reshard_source:
            reshard_sources[reshard_source] = reshard_sources.get(reshard_source, 0) + 1
        for column in COLUMNS:
            if row[column.key] is None:
                missing.setdefault(column.key, []).append(step)
    window_steps = [s for s in rows if window.contains(s)]
    means = {c.key: finite_mean([rows[s][c.key] for s in window_steps]) for c in COLUMNS}
    return TimingTable(rows, window, window_steps, means, reshard_sources, missing)
