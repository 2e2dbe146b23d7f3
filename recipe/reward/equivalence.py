"""Is a predicted answer equivalent to the ground truth? Fast stages in-process, symbolic stage on request.

``judge`` runs (1) normalised string equality, (2) the parser + exact/numeric comparison, and reports
``NEEDS_SYMBOLIC`` when neither can decide; the caller then runs the bounded subprocess stage
(``symbolic.SymbolicWorker``) on the original strings. ``is_equivalent`` chains both for one pair.
"""

from __future__ import annotations

import enum
import re
import time

from r1_ascend.recipe.reward.compare import Comparator, DeadlineExceeded, Malformed, TooLarge, Undecided
from r1_ascend.recipe.reward.normalize import compact, normalize_answer
from r1_ascend.recipe.reward.parse import MAX_ANSWER_CHARS, ParseError, parse_answer
from r1_ascend.recipe.reward.symbolic import SymbolicTimeout, SymbolicWorker

MAX_SYMBOLIC_CHARS = 400
# Inputs the symbolic stage is never given: towers of exponents, large factorials, very long integers.
_EXPLOSIVE_RE = re.compile(r"\^\s*\{[^{}]*\^|\^\s*\d+\s*\^|\d{3,}\s*!|\d{60,}|\\underbrace|\\overbrace")
_WORDS_RE = re.compile(r"[A-Za-z][A-Za-z ]*")


class Verdict(enum.Enum):
    EQUAL = "equal"
    DIFFERENT = "different"
    NEEDS_SYMBOLIC = "needs_symbolic"
    UNPARSABLE = "unparsable"  # too long / too deep / explosive: neither stage may try
    TIMEOUT = "timeout"


def judge(gold: str, pred: str, deadline: float) -> Verdict:
    """Decide with the in-process stages; never blocks beyond ``deadline`` by more than one evaluation step."""
    if compact(gold) == compact(pred):
        return Verdict.EQUAL
    gold_norm, pred_norm = normalize_answer(gold), normalize_answer(pred)
    if compact(gold_norm) == compact(pred_norm):
        return Verdict.EQUAL if gold_norm else Verdict.DIFFERENT
    if _WORDS_RE.fullmatch(gold_norm) and _WORDS_RE.fullmatch(pred_norm) and (len(gold_norm) > 1 or len(pred_norm) > 1):
        return Verdict.EQUAL if gold_norm.lower() == pred_norm.lower() else Verdict.DIFFERENT
    try:
        gold_tree, pred_tree = parse_answer(gold_norm), parse_answer(pred_norm)
    except (ParseError, ValueError, ZeroDivisionError):
        return _symbolic_or_unparsable(gold, pred)
    except RecursionError:
        return Verdict.UNPARSABLE
    try:
        return Verdict.EQUAL if Comparator(deadline).equal(gold_tree, pred_tree) else Verdict.DIFFERENT
    except DeadlineExceeded:
        return Verdict.TIMEOUT
    except Malformed:
        return Verdict.DIFFERENT
    except TooLarge:
        return Verdict.UNPARSABLE
    except (Undecided, RecursionError, KeyError, TypeError, ValueError, ArithmeticError):
        return _symbolic_or_unparsable(gold, pred)


def _symbolic_or_unparsable(gold: str, pred: str) -> Verdict:
    if max(len(gold), len(pred)) > MAX_SYMBOLIC_CHARS or len(gold) + len(pred) > MAX_ANSWER_CHARS:
        return Verdict.UNPARSABLE
    if _EXPLOSIVE_RE.search(gold) or _EXPLOSIVE_RE.search(pred) or "\x00" in gold + pred:
        return Verdict.UNPARSABLE
    return Verdict.NEEDS_SYMBOLIC


def resolve_symbolic(worker: SymbolicWorker | None, gold: str, pred: str, deadline: float) -> Verdict:
    """Run the bounded symbolic stage for a pair that ``judge`` could not decide."""
    if worker is None:
        return Verdict.UNPARSABLE
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return Verdict.TIMEOUT
    try:
        return Verdict.EQUAL if worker.compare(gold, pred, remaining) else Verdict.DIFFERENT
    except SymbolicTimeout:
        return Verdict.TIMEOUT


def is_equivalent(gold: str, pred: str, *, timeout_s: float = 1.0, worker: SymbolicWorker | None = None) -> Verdict:
    """Both stages for one pair (``worker=None`` disables the symbolic stage)."""
    deadline = time.monotonic() + timeout_s
    verdict = judge(gold, pred, deadline)
    if verdict is Verdict.NEEDS_SYMBOLIC:
        verdict = resolve_symbolic(worker, gold, pred, deadline)
    return verdict
