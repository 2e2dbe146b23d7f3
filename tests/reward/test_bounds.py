"""Every response is scored within the bound, from the main thread, a worker thread and a child process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from r1_ascend.recipe.reward import SCORE_KEYS, compute_score, compute_score_batch, warm_up
from r1_ascend.recipe.reward.symbolic import SymbolicTimeout, SymbolicWorker

BOUND_S = 1.0
PATHOLOGICAL = [
    ("</think>\\boxed{100000000!}", "1"),
    ("</think>\\boxed{9^{9^{9}}}", "1"),
    ("</think>\\boxed{2^{2^{2^{2^{2^{2}}}}}}", "4"),
    ("</think>\\boxed{" + "9" * 100_000 + "}", "9"),
    ("<think>" + "1+1=2. " * 15_000 + "</think>\\boxed{2}", "2"),
    ("</think>\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}", "1"),
    ("</think>\\boxed{" + "{" * 10_000, "1"),
    ("</think>\\boxed{" + "(" * 300 + "1" + ")" * 300 + "}", "1"),
    ("</think>\\boxed{1\x00+1}", "2"),
    ("</think>\\boxed{\ud800 12 \udfff}", "12"),
    ("</think>" + "\\boxed{1} " * 5000, "1"),
    ("</think>\\boxed{\\sum_{k=1}^{10^{9}} k^{k}}", "1"),
    ("</think>\\boxed{" + "\\sqrt{2+" * 30 + "2" + "}" * 30 + "}", "2"),
    ("</think>\\boxed{\\int_0^1 e^{x^{x^{x}}} dx}", "1"),
    ("</think>\\boxed{9^{9^{9^{9}}}}", "1"),
    ("</think>\\boxed{a^{b^{c^{d}}}}", "a^{b^{c}}"),
    ("</think>\\boxed{\\sin(10^{10^{10}})}", "0"),
    ("</think>\\boxed{\\exp(\\exp(\\exp(100)))}", "1"),
    ("</think>\\boxed{" + "2000!\\cdot " * 150 + "1}", "2"),
    ("</think>\\boxed{" + "\\frac" * 600 + "12}", "1"),
]


_MATRIX = "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"  # outside the fast parser: decided by the symbolic stage
_HEAVY = "\\sum_{k=1}^{1000} \\frac{1}{k^{3}+\\sin(k)}"  # sympy works on this for seconds


@pytest.fixture(scope="module", autouse=True)
def _warm_worker() -> None:
    warm_up()  # one-off start of the symbolic worker (about 2 s) is not part of any response's bound


def _score_all() -> float:
    warm_up()
    worst = 0.0
    for response, truth in PATHOLOGICAL:
        start = time.monotonic()
        result = compute_score("math", response, truth)
        worst = max(worst, time.monotonic() - start)
        assert tuple(result) == SCORE_KEYS
    return worst


def test_pathological_inputs_main_thread() -> None:
    assert _score_all() < BOUND_S


def test_pathological_inputs_worker_thread() -> None:
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["worst"] = _score_all()
        except BaseException as error:  # surfaced below
            outcome["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["worst"] < BOUND_S


@pytest.mark.slow
def test_pathological_inputs_child_process() -> None:
    code = (
        "import json, sys\n"
        "sys.path.insert(0, 'tests/reward')\n"
        "from test_bounds import _score_all\n"
        "print(json.dumps(_score_all()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) < BOUND_S


def test_symbolic_worker_is_killed_and_replaced_on_timeout() -> None:
    """A comparison over its bound times out and its worker is replaced; the replacement's start is not billed."""
    worker = SymbolicWorker()
    try:
        worker.start()
        with pytest.raises(SymbolicTimeout):
            worker.compare("\\sum_{k=1}^{n} k", "\\frac{n(n+1)}{2}", timeout_s=1e-4)
        assert worker.restarts == 1
        # The replacement is a fork of the warm template: a short bound still gets a real verdict at once.
        start = time.monotonic()
        assert worker.compare(_MATRIX, _MATRIX.replace("&", " & "), timeout_s=0.8) is True
        assert time.monotonic() - start < BOUND_S  # the replacement's start is not waited for
    finally:
        worker.close()


def test_timeouts_never_delay_the_next_response() -> None:
    """After each timeout the next symbolic comparison still gets a verdict within the bound (no restart wait)."""
    warm_up()
    for _ in range(3):
        start = time.monotonic()
        slow = compute_score("math", f"</think>\\boxed{{{_HEAVY}}}", "\\frac{2}{3}")
        assert time.monotonic() - start < BOUND_S
        assert slow["fail_reason"] == "timeout"
        # A generous budget so that load cannot fail the verdict; the wall time shows no restart was waited for
        # (importing Math-Verify again takes about 2 s even on an idle machine).
        start = time.monotonic()
        quick = compute_score("math", f"</think>\\boxed{{{_MATRIX}}}", _MATRIX.replace("&", " & "), timeout_s=5)
        assert quick["acc"] == 1.0
        assert time.monotonic() - start < BOUND_S


def test_unresponsive_worker_is_killed_and_replaced() -> None:
    """If the worker process stops answering, the parent kills and replaces it."""
    worker = SymbolicWorker()
    try:
        worker.start()
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGSTOP)
        with pytest.raises(SymbolicTimeout):
            worker.compare("x", "x", timeout_s=0.1)
        assert worker.restarts == 1
        assert worker.compare(_MATRIX, _MATRIX.replace("&", " & "), timeout_s=0.8) is True
    finally:
        worker.close()


def test_batch_matches_single_and_respects_bound() -> None:
    responses = [response for response, _ in PATHOLOGICAL] + ["</think>\\boxed{\\sum_{k=0}^{n} F_k}"]
    truths = [truth for _, truth in PATHOLOGICAL] + ["\\sum_{k=0}^{n} F_k"]
    start = time.monotonic()
    batch = compute_score_batch(["math"] * len(responses), responses, truths, [{}] * len(responses), num_workers=2)
    assert time.monotonic() - start < 60  # includes the one-off start of two worker processes
    singles = [compute_score("math", r, t) for r, t in zip(responses, truths, strict=True)]
    assert [b["acc"] for b in batch] == [s["acc"] for s in singles]
    assert batch[-1]["acc"] == 1.0
