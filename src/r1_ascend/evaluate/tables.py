"""The outputs: ``evaluation.json`` (per set and per problem), ``evaluation.md`` (rendered from the JSON) and one JSON
line per sample.

The Markdown is rendered from the JSON document, so ``r1-ascend report`` (which only reads the JSON) shows the same
table. Nothing is dropped: a malformed row, an empty response and a truncated one are counted wrong and listed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from r1_ascend.evaluate.metrics import mean_pass_at_k, pass_at_1
from r1_ascend.evaluate.problems import Problem
from r1_ascend.evaluate.scoring import EMPTY_RESPONSE, MALFORMED_ROW, TRUNCATED, SampleResult

FORMAT = "r1-ascend-evaluation"
VERSION = 1
JSON_NAME = "evaluation.json"
MARKDOWN_NAME = "evaluation.md"
SAMPLES_NAME = "samples.jsonl"
NOT_AVAILABLE = "n/a"


@dataclass
class ProblemRun:
    problem: Problem
    samples: list[SampleResult]

    @property
    def correct(self) -> int:
        return sum(s.correct for s in self.samples)


@dataclass
class SetRun:
    name: str
    problems: list[ProblemRun] = field(default_factory=list)


def set_document(run: SetRun, n: int, ks: Sequence[int]) -> dict[str, Any]:
    """One set's summary, its per-problem scores and the samples that were not scored answers."""
    correct = [p.correct for p in run.problems]
    samples = [s for p in run.problems for s in p.samples]
    counted_wrong = []
    for p in run.problems:
        if p.problem.malformed is not None:
            counted_wrong.append(_listed(p, f"{MALFORMED_ROW}: {p.problem.malformed}", range(n)))
            continue
        for reason in (EMPTY_RESPONSE, TRUNCATED):
            chosen = [s.sample for s in p.samples if s.reason == reason]
            if chosen:
                counted_wrong.append(_listed(p, reason, chosen))
    return {
        "name": run.name,
        "problems": len(run.problems),
        "samples": n,
        "pass@1": pass_at_1(n, correct),
        "pass@k": {str(k): mean_pass_at_k(n, correct, k) for k in ks},
        "correct_samples": sum(correct),
        "total_samples": len(samples),
        "empty_samples": sum(s.reason == EMPTY_RESPONSE for s in samples),
        "truncated_samples": sum(s.reason == TRUNCATED for s in samples),
        "malformed_rows": sum(p.problem.malformed is not None for p in run.problems),
        "counted_wrong": counted_wrong,
        "per_problem": [
            {
                "problem": p.problem.index,
                "source": p.problem.source,
                "index": p.problem.extra_info.get("index"),
                "correct": p.correct,
                "scores": [1.0 if s.correct else 0.0 for s in p.samples],
                "malformed": p.problem.malformed,
            }
            for p in run.problems
        ],
    }


def _listed(p: ProblemRun, what: str, samples: Sequence[int]) -> dict[str, Any]:
    return {"problem": p.problem.index, "source": p.problem.source, "what": what, "samples": list(samples)}


def document(runs: Sequence[SetRun], *, n: int, ks: Sequence[int], meta: dict[str, Any]) -> dict[str, Any]:
    """The whole ``evaluation.json``: what was evaluated how (``meta``), then one entry per set."""
    return {"format": FORMAT, "version": VERSION, **meta, "sets": [set_document(run, n, ks) for run in runs]}


def sample_record(set_name: str, problem: Problem, result: SampleResult) -> dict[str, Any]:
    """One line of ``samples.jsonl``."""
    return {
        "set": set_name,
        "problem": problem.index,
        "sample": result.sample,
        "source": problem.source,
        "ground_truth": problem.ground_truth,
        "response": result.response,
        "score": 1.0 if result.correct else 0.0,
        "correct": result.correct,
        "reason": result.reason,
        "finish_reason": result.finish_reason,
        "tokens": result.tokens,
        "reward": result.reward,
    }


def _fmt(value: float | None) -> str:
    return NOT_AVAILABLE if value is None else f"{value:.4f}"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def pass_columns(doc: dict[str, Any]) -> list[str]:
    """The pass@k values the document holds, in the order they were asked for."""
    return list(dict.fromkeys(k for s in doc.get("sets", []) for k in s.get("pass@k", {})))


def summary_table(doc: dict[str, Any]) -> str:
    """The per-set table: problems, samples per problem, pass@1, pass@k, and what was counted wrong unscored."""
    ks = [k for k in pass_columns(doc) if k != "1"]  # pass@1 has its own column (the same value)
    header = ["set", "problems", "samples per problem", "pass@1", *(f"pass@{k}" for k in ks)]
    header += ["correct samples", "empty", "truncated", "malformed rows"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for s in doc.get("sets", []):
        cells = [f"`{_escape(s['name'])}`", str(s["problems"]), str(s["samples"]), _fmt(s["pass@1"])]
        cells += [_fmt(s["pass@k"].get(k)) for k in ks]
        cells += [f"{s['correct_samples']}/{s['total_samples']}", str(s["empty_samples"])]
        cells += [str(s["truncated_samples"]), str(s["malformed_rows"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def settings_line(doc: dict[str, Any]) -> str:
    s = doc.get("settings", {})
    limit = s.get("limit")
    rows = "every row" if limit is None else f"the first {limit} rows"
    return (
        f"{s.get('samples')} samples per problem at temperature {s.get('temperature')}, top-p {s.get('top_p')}, at "
        f"most {s.get('max_new_tokens')} new tokens, seed {s.get('seed')}, {rows} of each set; backend "
        f"{doc.get('backend')}; reward `{doc.get('reward')}`. pass@1 = mean over problems of correct / n; pass@k = "
        "the unbiased estimator of Chen et al. 2021 (k = n: any sample correct)."
    )


def counted_wrong_lines(doc: dict[str, Any]) -> list[str]:
    """Every malformed row, empty response and truncated response, per set and problem (all counted wrong)."""
    lines = []
    for s in doc.get("sets", []):
        for item in s.get("counted_wrong", []):
            samples = item["samples"]
            which = "all samples" if len(samples) == s["samples"] else "samples " + ", ".join(map(str, samples))
            lines.append(
                f"- `{_escape(s['name'])}` problem {item['problem']} (`{_escape(item['source'])}`): "
                f"{_escape(item['what'])} ({which})"
            )
    return lines


def markdown(doc: dict[str, Any]) -> str:
    """``evaluation.md``."""
    out = [f"# Evaluation: `{_escape(str(doc.get('model')))}`", "", summary_table(doc), "", settings_line(doc), ""]
    out += ["## Counted wrong whatever the reward said: malformed rows, empty and truncated responses", ""]
    listed = counted_wrong_lines(doc)
    out += listed or ["None: every row was well formed and every sample was generated and complete."]
    return "\n".join(out).rstrip() + "\n"


def is_evaluation(doc: Any) -> bool:
    """Whether a parsed JSON value is an ``evaluation.json`` this module wrote."""
    return isinstance(doc, dict) and doc.get("format") == FORMAT and isinstance(doc.get("sets"), list)


def read_document(text: str, where: str) -> dict[str, Any]:
    """Parse an ``evaluation.json``; a clear error if it is not one."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        msg = f"{where} is not valid JSON ({exc}); rerun r1-ascend evaluate to write it again"
        raise ValueError(msg) from None
    if not is_evaluation(doc):
        msg = f"{where} is not an r1-ascend evaluate result (no format {FORMAT!r} with a list of sets)"
        raise ValueError(msg)
    return doc
