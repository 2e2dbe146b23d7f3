"""What a figure's panel holds (series, logged levels, axis), shared by the figure specs and the drawing rules."""

from __future__ import annotations

from dataclasses import dataclass, field

Series = dict[str, tuple[list[int], list[float]]]


@dataclass(frozen=True)
class Reference:
    """A logged level drawn as a step line (warn dotted, stop dashed, a calibrated baseline dash-dotted), in the
    colour of the series it applies to."""

    label: str
    steps: list[int]
    values: list[float]
    of: str | None = None  # the series it applies to; None: black
    style: str = "warn"  # "warn", "stop" or "baseline"


@dataclass
class Panel:
    ylabel: str
    series: Series
    references: list[Reference] = field(default_factory=list)
    # differences spanning decades (1e-7 healthy next to nats broken) are read on a log axis
    log_scale: bool = False
