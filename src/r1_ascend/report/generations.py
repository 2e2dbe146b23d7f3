"""Sample answers and per-step reward components from verl's generation dumps.

With ``trainer.rollout_data_dir`` (training) or ``trainer.validation_data_dir`` set, verl 0.6.1 writes
``<dir>/<global_step>.jsonl``: one JSON object per sample with ``input``, ``output``, ``gts``, ``score``, ``step``
and every per-sample list of the reward's extra info (e.g. ``acc``, ``format``). The numeric extra fields give
the per-component reward curves that the training metrics do not contain.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from r1_ascend.report.console import ParseProblem
from r1_ascend.report.metric_names import DUMP_BASE_FIELDS

_DUMP_NAME = re.compile(r"^(\d+)\.jsonl$")


@dataclass
class GenerationSample:
    step: int
    origin: str
    prompt: str
    response: str
    ground_truth: str | None = None
    score: float | None = None
    extras: dict[str, object] = field(default_factory=dict)


@dataclass
class DumpDirectory:
    """One dump directory: per-step means of every numeric field and a few samples of its latest step."""

    path: Path
    label: str
    component_means: dict[str, dict[int, float]] = field(default_factory=dict)
    samples: list[GenerationSample] = field(default_factory=list)
    problems: list[ParseProblem] = field(default_factory=list)


def find_dump_files(directory: Path) -> dict[Path, list[tuple[int, Path]]]:
    """Group ``<step>.jsonl`` files by their directory."""
    groups: dict[Path, list[tuple[int, Path]]] = {}
    for path in directory.rglob("*.jsonl"):
        match = _DUMP_NAME.match(path.name)
        if match and path.is_file():
            groups.setdefault(path.parent, []).append((int(match.group(1)), path))
    return {parent: sorted(files) for parent, files in sorted(groups.items())}


def read_dump_directory(
    path: Path, files: list[tuple[int, Path]], label: str, samples_wanted: int, max_chars: int
) -> DumpDirectory:
    result = DumpDirectory(path=path, label=label)
    latest_step = files[-1][0] if files else None
    for step, file in files:
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        take = samples_wanted if step == latest_step else 0
        with file.open(encoding="utf-8", errors="replace") as handle:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    result.problems.append(ParseProblem(str(file), line_no, "not a complete JSON object; skipped"))
                    continue
                if not isinstance(entry, dict):
                    result.problems.append(ParseProblem(str(file), line_no, "not a JSON object; skipped"))
                    continue
                _accumulate(entry, sums, counts)
                if take > 0:
                    result.samples.append(_sample(entry, step, label, max_chars))
                    take -= 1
        for key, total in sums.items():
            result.component_means.setdefault(key, {})[step] = total / counts[key]
    return result


def _accumulate(entry: dict[str, object], sums: dict[str, float], counts: dict[str, int]) -> None:
    for key, value in entry.items():
        if key in DUMP_BASE_FIELDS and key != "score":
            continue
        if isinstance(value, bool):
            value = float(value)
        if isinstance(value, int | float) and math.isfinite(value):
            sums[key] = sums.get(key, 0.0) + float(value)
            counts[key] = counts.get(key, 0) + 1


def _clip(text: object, max_chars: int) -> str:
    value = "" if text is None else str(text)
    if len(value) <= max_chars:
        return value
    return f"{value[:max_chars]}… [{len(value) - max_chars} more characters]"


def _sample(entry: dict[str, object], step: int, label: str, max_chars: int) -> GenerationSample:
    score = entry.get("score")
    extras = {k: v for k, v in entry.items() if k not in DUMP_BASE_FIELDS and isinstance(v, int | float | str)}
    gts = entry.get("gts")
    return GenerationSample(
        step=step,
        origin=label,
        prompt=_clip(entry.get("input"), max_chars),
        response=_clip(entry.get("output"), max_chars),
        ground_truth=None if gts is None else _clip(gts, max_chars),
        score=float(score) if isinstance(score, int | float) else None,
        extras=extras,
    )


_TB_SAMPLE = re.compile(
    r"\*\*Input:\*\* (?P<input>.*?)\n\n\*\*Output:\*\* (?P<output>.*?)\n\n\*\*Score:\*\* (?P<score>[^\n]*)", re.S
)


def samples_from_tensorboard_text(text: str, step: int, samples_wanted: int, max_chars: int) -> list[GenerationSample]:
    """Split verl's ``val/generations`` Markdown (Input / Output / Score per sample) back into samples."""
    samples = []
    for match in _TB_SAMPLE.finditer(text):
        if len(samples) >= samples_wanted:
            break
        try:
            score: float | None = float(match.group("score"))
        except ValueError:
            score = None
        samples.append(
            GenerationSample(
                step=step,
                origin="tensorboard val/generations",
                prompt=_clip(match.group("input"), max_chars),
                response=_clip(match.group("output"), max_chars),
                score=score,
            )
        )
    return samples
