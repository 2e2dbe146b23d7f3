"""Reward benchmark: our grader vs Math-Verify vs mathruler, side by side in one process.

Usage (from the repository root)::

    .venv/bin/python benchmarks/reward_bench.py [--cases PATH] [--responses PATH] [--out-dir DIR] [--repeats 3]

Prints accuracy / false positives / false negatives on the labelled dev cases (all and the ``core`` subset),
agreement and throughput on real model responses, the latency of pathological inputs, and the throughput ratios
against the two baselines. Disagreements between graders on the real responses go to ``--out-dir``.

Adapters (same for every grader): ``answer_only`` cases compare the answer directly (ours and Math-Verify wrap
a bare answer in ``\\boxed{}``; an answer that already has boxes keeps them); ``full_response`` cases go through
each grader's own extraction, and ours applies the case's protocol (``think_boxed`` or plain ``boxed``).
A boxed ground truth is unboxed; a list ground truth means "any of".
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CASES = REPO_ROOT / ".." / "shared" / "data" / "grader" / "grader_cases_dev.jsonl"
DEFAULT_RESPONSES = REPO_ROOT / ".." / "shared" / "data" / "grader" / "qwen25math_responses_selfgraded.jsonl"

Grader = Callable[[dict[str, Any]], bool]


def _golds(case: dict[str, Any]) -> list[str]:
    from r1_ascend.recipe.reward.protocol import unbox_ground_truth

    truth = case["ground_truth"]
    return [unbox_ground_truth(str(g)) for g in (truth if isinstance(truth, list) else [truth])]


def _wrapped(text: str) -> str:
    return text if ("\\boxed" in text or "\\fbox" in text) else f"\\boxed{{{text}}}"


def ours(case: dict[str, Any], *, symbolic: bool = True) -> bool:
    from r1_ascend.recipe.reward import compute_score, grade_answer

    if case["kind"] == "answer_only":
        return grade_answer(case["ground_truth"], case["response"], symbolic=symbolic)
    chosen = "think_boxed" if case.get("protocol") == "think_boxed" else "boxed"
    result = compute_score("bench", case["response"], case["ground_truth"], protocol=chosen, symbolic=symbolic)
    return result["acc"] == 1.0


def ours_fast_only(case: dict[str, Any]) -> bool:
    """Our reward without the symbolic (Math-Verify) stage: what that stage adds in accuracy and costs in rate."""
    return ours(case, symbolic=False)


def math_verify(case: dict[str, Any]) -> bool:
    from math_verify import parse, verify

    response = _wrapped(case["response"]) if case["kind"] == "answer_only" else case["response"]
    prediction = parse(response)
    return any(verify(parse(_wrapped(gold)), prediction) for gold in _golds(case))


def mathruler(case: dict[str, Any]) -> bool:
    from mathruler.grader import extract_boxed_content, grade_answer

    response = case["response"]
    if case["kind"] == "answer_only" and "\\boxed" not in response:
        answer = response
    else:
        answer = extract_boxed_content(response)
    return any(grade_answer(answer, gold) for gold in _golds(case))


GRADERS: dict[str, Grader] = {
    "ours": ours,
    "ours_fast_only": ours_fast_only,
    "math_verify": math_verify,
    "mathruler": mathruler,
}


def _run(grader: Grader, cases: list[dict[str, Any]], repeats: int) -> tuple[list[bool], list[float], float]:
    """Verdicts, per-case latencies of the median run, and the median total seconds."""
    grader(cases[0])  # warm-up (imports, worker start) is not billed
    runs = []
    from r1_ascend.recipe.reward.normalize import normalize_answer

    for _ in range(repeats):
        normalize_answer.cache_clear()  # a repeat must not reuse the previous run's normalised answers
        verdicts, latencies = [], []
        start = time.perf_counter()
        for case in cases:
            t0 = time.perf_counter()
            verdicts.append(bool(grader(case)))
            latencies.append(time.perf_counter() - t0)
        runs.append((time.perf_counter() - start, verdicts, latencies))
    runs.sort(key=lambda run: run[0])
    total, verdicts, latencies = runs[len(runs) // 2]
    return verdicts, latencies, total


def _confusion(verdicts: list[bool], cases: list[dict[str, Any]]) -> tuple[float, int, int]:
    fp = sum(v and not c["expected"] for v, c in zip(verdicts, cases, strict=True))
    fn = sum(c["expected"] and not v for v, c in zip(verdicts, cases, strict=True))
    return (len(cases) - fp - fn) / max(len(cases), 1), fp, fn


def _p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 2 else latencies[0]


def bench_cases(path: Path, repeats: int) -> dict[str, float]:
    cases = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    subsets = {
        "all": lambda c: True,
        "core": lambda c: c["core"],
        "core A": lambda c: c["core"] and c["subset"].startswith("A"),
        "core B": lambda c: c["core"] and c["subset"].startswith("B"),
        "think_boxed": lambda c: c["protocol"] == "think_boxed",
        "core non-MV": lambda c: c["core"] and not c["source"].startswith(("huggingface/Math-Verify", "huggingface/l")),
    }
    print(f"\n## Labelled dev cases: {path.name} ({len(cases)} cases)\n")
    header = "| grader | " + " | ".join(f"{name} n={sum(map(pred, cases))}" for name, pred in subsets.items())
    print(header + " | cases/s | p99 ms | max ms |")
    print("|---" * (len(subsets) + 4) + "|")
    rates: dict[str, float] = {}
    for name, grader in GRADERS.items():
        verdicts, latencies, total = _run(grader, cases, repeats)
        cells = []
        for predicate in subsets.values():
            chosen = [(v, c) for v, c in zip(verdicts, cases, strict=True) if predicate(c)]
            acc, fp, fn = _confusion([v for v, _ in chosen], [c for _, c in chosen])
            cells.append(f"{acc:.3f} ({fp}/{fn})")
        rates[name] = len(cases) / total
        print(
            f"| {name} | " + " | ".join(cells) + f" | {rates[name]:.0f} | {_p99(latencies) * 1e3:.1f} "
            f"| {max(latencies) * 1e3:.1f} |"
        )
        if name == "ours":
            misses = [c for v, c in zip(verdicts, cases, strict=True) if v != c["expected"]]
        if name == "ours":
            by_source = _by_source(verdicts, cases)
    print("\n(accuracy (false positives / false negatives))")
    print(f"ours misses: {[(c['id'], 'core' if c['core'] else '-') for c in misses]}")
    print("\nours by source project (a project's cases are held out from the rules of every other project):\n")
    print("| source | all | core |")
    print("|---|---|---|")
    for source, (all_cells, core_cells) in by_source.items():
        print(f"| {source} | {all_cells} | {core_cells} |")
    return rates


def _by_source(verdicts: list[bool], cases: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    table = {}
    for source in sorted({c["source"].split("@")[0] for c in cases}):
        cells = []
        for core_only in (False, True):
            chosen = [
                (v, c)
                for v, c in zip(verdicts, cases, strict=True)
                if c["source"].split("@")[0] == source and (c["core"] or not core_only)
            ]
            acc, fp, fn = _confusion([v for v, _ in chosen], [c for _, c in chosen])
            cells.append(f"{acc:.3f} ({fp}/{fn}) n={len(chosen)}" if chosen else "-")
        table[source] = (cells[0], cells[1])
    return table


def bench_responses(path: Path, repeats: int, out_dir: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in rows:
        row.setdefault("kind", "full_response")
        row["kind"] = "full_response"
        row["protocol"] = "boxed"
    print(f"\n## Real responses: {path.name} ({len(rows)} responses, labels from Qwen's own grader)\n")
    print("| grader | agree with Qwen labels | accepted | responses/s | p99 ms | max ms |")
    print("|---|---|---|---|---|---|")
    rates: dict[str, float] = {}
    all_verdicts: dict[str, list[bool]] = {}
    for name, grader in GRADERS.items():
        verdicts, latencies, total = _run(grader, rows, repeats)
        all_verdicts[name] = verdicts
        agree = sum(v == r["expected"] for v, r in zip(verdicts, rows, strict=True)) / len(rows)
        rates[name] = len(rows) / total
        print(
            f"| {name} | {agree:.4f} | {sum(verdicts)} | {rates[name]:.0f} | {_p99(latencies) * 1e3:.2f} "
            f"| {max(latencies) * 1e3:.1f} |"
        )
    from r1_ascend.recipe.reward import compute_score_batch

    compute_score_batch(None, ["</think>\\boxed{4:30}"], ["4:30p.."])  # start the worker pool (not billed)
    start = time.perf_counter()
    batch = compute_score_batch(
        None, [r["response"] for r in rows], [r["ground_truth"] for r in rows], protocol="boxed"
    )
    batch_rate = len(rows) / (time.perf_counter() - start)
    same = sum((b["acc"] == 1.0) == v for b, v in zip(batch, all_verdicts["ours"], strict=True))
    print(f"\nours, compute_score_batch: {batch_rate:.0f} responses/s ({same}/{len(rows)} identical verdicts)")
    out_dir.mkdir(parents=True, exist_ok=True)
    disagreements = out_dir / "reward_disagreements.jsonl"
    count = 0
    with disagreements.open("w") as handle:
        for index, row in enumerate(rows):
            verdicts = {name: all_verdicts[name][index] for name in GRADERS} | {"qwen_label": row["expected"]}
            if len(set(verdicts.values())) > 1:
                count += 1
                extract = row["response"][-300:]
                record = {"id": row["id"], "ground_truth": row["ground_truth"], **verdicts}
                record |= {"qwen_pred": row.get("qwen_extracted_pred"), "response_tail": extract}
                handle.write(json.dumps(record) + "\n")
    print(f"{count} responses where the graders (or Qwen's label) disagree -> {disagreements}")
    return rates


#: name -> (what the final ``\\boxed{}`` holds, ground truth): inputs that must not hang or exhaust the grader.
_BOXED: dict[str, tuple[str, str | list[str]]] = {
    "100000000!": ("100000000!", "1"),
    "9^{9^{9}}": ("9^{9^{9}}", "1"),
    "2^{2^{2^{2^{2^{2}}}}}": ("2^{2^{2^{2^{2^{2}}}}}", "4"),
    "10^{100000}": ("10^{100000}", "10"),
    "100k-digit integer": ("9" * 100_000, "9"),
    "10k nested braces": ("{" * 10_000 + "1" + "}" * 10_000, "1"),
    "200-deep parentheses": ("(" * 200 + "1" + ")" * 200, "1"),
    "NUL bytes": ("1\x00\x00+1", "2"),
    "lone surrogates": ("\ud800 12 \udfff", "12"),
    "sympy-heavy sum": ("\\sum_{k=1}^{10^{9}} k^{k}", "1"),
    "nested radicals 30": ("\\sqrt{2+" * 30 + "2" + "}" * 30, "2"),
    "tower 9^{9^{9^{9}}}": ("9^{9^{9^{9}}}", "1"),
    "tower a^{b^{c^{d}}}": ("a^{b^{c^{d}}}", "a^{b^{c}}"),
    "\\sin(10^{10^{10}})": ("\\sin(10^{10^{10}})", "0"),
    "(10^{10^9})^{10^{10^9}}": ("(10^{10^{9}})^{10^{10^{9}}}", "1"),
    "\\exp(\\exp(\\exp(100)))": ("\\exp(\\exp(\\exp(100)))", "1"),
    "150 x 2000! product": ("2000!\\cdot " * 150 + "1", "2"),
    "300 \\frac without braces": ("\\frac" * 300 + "12", "1"),
    "sympy timeout (1000-term sum)": ("\\sum_{k=1}^{1000} \\frac{1}{k^{3}+\\sin(k)}", "\\frac{2}{3}"),
    "3000 ground truths": ("5^{5}", [f"{i}^{{{i}}}" for i in range(3000)]),
}
#: name -> (response, ground truth): the boxed inputs above, then responses of another shape.
PATHOLOGICAL: dict[str, tuple[str, str | list[str]]] = {
    **{name: ("</think>\\boxed{" + inner + "}", truth) for name, (inner, truth) in _BOXED.items()},
    "100k-char response": ("<think>" + "so 1+1=2, " * 10_000 + "</think>\\boxed{2}", "2"),
    "10k unclosed braces": ("</think>\\boxed{" + "{" * 10_000, "1"),
    "5000 boxes": ("</think>" + "\\boxed{1} " * 5000, "1"),
}


def bench_pathological() -> float:
    from r1_ascend.recipe.reward import compute_score

    print("\n## Pathological inputs (compute_score, default bound)\n")
    print("| input | seconds | fail_reason | score |")
    print("|---|---|---|---|")
    worst = 0.0
    for name, (response, truth) in PATHOLOGICAL.items():
        start = time.perf_counter()
        result = compute_score("bench", response, truth)
        elapsed = time.perf_counter() - start
        worst = max(worst, elapsed)
        print(f"| {name} | {elapsed:.3f} | {result['fail_reason'] or '-'} | {result['score']} |")
    print(f"\nworst case: {worst:.3f} s")
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=Path, default=DEFAULT_CASES)
    parser.add_argument("--responses", type=Path, default=DEFAULT_RESPONSES)
    parser.add_argument("--out-dir", type=Path, default=Path("/tmp/r1_ascend_reward_bench"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    for path in (args.cases, args.responses):
        if not path.exists():
            print(f"missing data file {path}; pass --cases/--responses", file=sys.stderr)
            return 2
    from r1_ascend.recipe.reward import warm_up

    warm_up()  # start-up of the symbolic worker is a one-time cost, not billed to any grader
    case_rates = bench_cases(args.cases, args.repeats)
    response_rates = bench_responses(args.responses, args.repeats, args.out_dir)
    worst = bench_pathological()
    print("\n## Ratios\n")
    print(f"dev cases: ours / Math-Verify = {case_rates['ours'] / case_rates['math_verify']:.1f}x (target >= 10x)")
    print(f"dev cases: ours / mathruler = {case_rates['ours'] / case_rates['mathruler']:.2f}x")
    print(
        f"real responses: ours / mathruler = {response_rates['ours'] / response_rates['mathruler']:.2f}x "
        "(target >= 0.5x)"
    )
    print(f"real responses: ours / Math-Verify = {response_rates['ours'] / response_rates['math_verify']:.1f}x")
    print(f"pathological worst case: {worst:.3f} s (target < 1 s)")
    fast_gain = case_rates["ours"] / case_rates["ours_fast_only"]
    print(f"dev cases: symbolic stage costs {1 / fast_gain:.2f}x of the fast-only rate (see accuracy columns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
