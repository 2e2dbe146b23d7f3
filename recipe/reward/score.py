"""verl-facing reward functions: ``compute_score`` (one response) and ``compute_score_batch`` (many, in parallel).

Every call returns the same keys (verl's reward managers turn each key into a per-sample list and log it):
``score`` (float), ``acc`` (0/1), ``format`` (0/1), ``timeout`` (0/1), ``pred`` (short normalised answer, used
by verl's majority-vote metrics) and ``fail_reason`` (``""`` when correct, else one of ``FAIL_REASONS``).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from r1_ascend.recipe.reward import protocol
from r1_ascend.recipe.reward.equivalence import Verdict, judge, resolve_symbolic
from r1_ascend.recipe.reward.normalize import normalize_answer
from r1_ascend.recipe.reward.symbolic import SymbolicWorker, WorkerPool, default_worker

SCORE_KEYS = ("score", "acc", "format", "timeout", "pred", "fail_reason")
WRONG_ANSWER = "wrong_answer"
CONFLICTING_BOXES = "conflicting_boxes"
TIMEOUT = "timeout"
UNPARSABLE = "unparsable"
NO_GROUND_TRUTH = "no_ground_truth"
FAIL_REASONS = (
    protocol.NO_THINK_CLOSE,
    protocol.MULTIPLE_THINK_CLOSE,
    protocol.BAD_THINK_OPEN,
    protocol.NO_BOX,
    protocol.EMPTY_BOX,
    protocol.UNBALANCED_BOX,
    protocol.BOX_TOO_LONG,
    CONFLICTING_BOXES,
    WRONG_ANSWER,
    TIMEOUT,
    UNPARSABLE,
    NO_GROUND_TRUTH,
)
PRED_MAX_CHARS = 80
MAX_GROUND_TRUTH_CHARS = 1000


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    """Knobs, passed as keyword arguments (verl: ``custom_reward_function.reward_kwargs``).

    ``score = accuracy_weight * acc + format_weight * format``. Defaults: plain accuracy (scores 0/1); the seed
    recipe's split is ``accuracy_weight=0.67, format_weight=0.33``.
    """

    protocol: str = protocol.PROTOCOL_THINK_BOXED
    accuracy_weight: float = 1.0
    format_weight: float = 0.0
    timeout_s: float = 0.8
    symbolic: bool = True
    num_workers: int = 0  # batch API: symbolic worker processes (0 = min(4, CPU count))

    def __post_init__(self) -> None:
        if self.protocol not in protocol.PROTOCOLS:
            msg = f"reward protocol {self.protocol!r} is not one of {protocol.PROTOCOLS}; set reward_kwargs.protocol"
            raise ValueError(msg)
        if not 0 < self.timeout_s <= 60:
            msg = f"timeout_s={self.timeout_s} must be in (0, 60] seconds"
            raise ValueError(msg)
        if self.accuracy_weight < 0 or self.format_weight < 0:
            msg = f"weights must be non-negative, got accuracy={self.accuracy_weight}, format={self.format_weight}"
            raise ValueError(msg)

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> RewardConfig:
        names = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            msg = f"unknown reward option(s) {unknown}; valid options are {sorted(names)}"
            raise TypeError(msg)
        return cls(**kwargs)

    @property
    def max_score(self) -> float:
        return self.accuracy_weight + self.format_weight


@dataclasses.dataclass
class _Pending:
    """One response between the fast stage and the (optional) symbolic stage."""

    extraction: protocol.Extraction
    golds: list[str]
    pred: str
    deadline: float
    verdict: Verdict = Verdict.DIFFERENT
    budget_left: float = 0.0
    symbolic: list[tuple[str, str]] = dataclasses.field(default_factory=list)


def _ground_truths(ground_truth: Any) -> list[str]:
    """verl stores a str; lists (any-match) may arrive as list/tuple/numpy arrays."""
    if ground_truth is None:
        return []
    if isinstance(ground_truth, str | int | float):
        values = [ground_truth]
    else:
        try:
            values = list(ground_truth)
        except TypeError:
            values = [ground_truth]
    golds = []
    for value in values:
        text = protocol.unbox_ground_truth(str(value).strip())[:MAX_GROUND_TRUTH_CHARS]
        if text:
            golds.append(text)
    return golds


def _as_text(solution_str: Any) -> str:
    if isinstance(solution_str, bytes):
        return solution_str.decode("utf-8", errors="replace")
    text = solution_str if isinstance(solution_str, str) else str(solution_str)
    return text.encode("utf-8", errors="replace").decode("utf-8")  # lone surrogates -> "?"


def _fast_stage(solution_str: Any, ground_truth: Any, config: RewardConfig) -> _Pending:
    start = time.monotonic()
    extraction = protocol.extract_answer(_as_text(solution_str), config.protocol)
    return _grade(extraction, ground_truth, config, start)


def _grade(
    extraction: protocol.Extraction, ground_truth: Any, config: RewardConfig, start: float | None = None
) -> _Pending:
    start = time.monotonic() if start is None else start
    pending = _Pending(extraction, _ground_truths(ground_truth), "", start + config.timeout_s)
    if not extraction.ok or not pending.golds:
        return pending
    # The last box is the answer; several different boxes may also form one multi-part answer together.
    candidates = [extraction.answers[-1]]
    if len(extraction.answers) > 1:
        candidates.append(", ".join(extraction.answers))
    pending.pred = candidates[0]
    for pred in candidates:
        for gold in pending.golds:
            if time.monotonic() > pending.deadline:  # a long list of ground truths shares one bound
                pending.verdict = Verdict.TIMEOUT
                break
            verdict = judge(gold, pred, pending.deadline)
            if verdict is Verdict.EQUAL:
                pending.verdict, pending.pred, pending.symbolic = verdict, pred, []
                return pending
            if verdict is Verdict.NEEDS_SYMBOLIC:
                pending.symbolic.append((gold, pred))
            elif verdict in (Verdict.TIMEOUT, Verdict.UNPARSABLE) and pending.verdict is Verdict.DIFFERENT:
                pending.verdict = verdict
    pending.budget_left = pending.deadline - time.monotonic()
    if not config.symbolic and pending.symbolic:
        pending.symbolic = []
        if pending.verdict is Verdict.DIFFERENT:
            pending.verdict = Verdict.UNPARSABLE
    return pending


def _symbolic_stage(pending: _Pending, worker: SymbolicWorker) -> None:
    for gold, pred in pending.symbolic:
        verdict = resolve_symbolic(worker, gold, pred, pending.deadline)
        if verdict is Verdict.EQUAL:
            pending.verdict, pending.pred = verdict, pred
            return
        if verdict is Verdict.TIMEOUT:
            pending.verdict = verdict
    pending.symbolic = []


def _result(pending: _Pending, config: RewardConfig) -> dict[str, Any]:
    extraction = pending.extraction
    correct = pending.verdict is Verdict.EQUAL
    format_ok = extraction.ok and extraction.answer_tags_ok
    if config.protocol == protocol.PROTOCOL_BOXED:
        format_ok = extraction.ok
    if not extraction.ok:
        reason = extraction.fail_reason
    elif not pending.golds:
        reason = NO_GROUND_TRUTH
    elif correct:
        reason = ""
    elif pending.verdict is Verdict.TIMEOUT:
        reason = TIMEOUT
    elif pending.verdict is Verdict.UNPARSABLE:
        reason = UNPARSABLE
    elif len(extraction.answers) > 1:
        reason = CONFLICTING_BOXES
    else:
        reason = WRONG_ANSWER
    acc = 1.0 if correct else 0.0
    form = 1.0 if format_ok else 0.0
    pred = normalize_answer(pending.pred)[:PRED_MAX_CHARS] if pending.pred else ""
    return {
        "score": float(config.accuracy_weight * acc + config.format_weight * form),
        "acc": acc,
        "format": form,
        "timeout": 1.0 if reason == TIMEOUT else 0.0,
        "pred": pred,
        "fail_reason": reason,
    }


def warm_up() -> None:
    """Start the symbolic worker and wait until it is ready (about 2 s once per process); optional."""
    default_worker(wait=True)


def start_in_background() -> None:
    """Start the symbolic template without waiting, so that it is warm long before the first reward is computed."""
    global _template_requested
    _template_requested = True
    default_worker()


def grade_answer(ground_truth: Any, answer: str, **kwargs: Any) -> bool:
    """Equivalence of a bare answer (no protocol) with a ground truth (str or list = any of), both stages."""
    config = RewardConfig.from_kwargs(kwargs)
    boxes, _ = protocol.find_boxes(answer)
    extraction = protocol.Extraction(answers=tuple(dict.fromkeys(boxes)) if boxes else (answer.strip(),))
    if not extraction.answers[-1]:
        return False
    pending = _grade(extraction, ground_truth, config)
    if pending.symbolic:
        _symbolic_stage(pending, default_worker())
    return pending.verdict is Verdict.EQUAL


def compute_score(
    data_source: Any = None, solution_str: Any = "", ground_truth: Any = None, extra_info: Any = None, **kwargs: Any
) -> dict[str, Any]:
    """verl ``custom_reward_function`` entry point for one response (naive reward manager)."""
    global _template_requested
    config = RewardConfig.from_kwargs(kwargs)
    if config.symbolic and not _template_requested:
        _template_requested = True
        default_worker()  # non-blocking: the template's imports overlap with the fast stages of the first calls
    pending = _fast_stage(solution_str, ground_truth, config)
    if pending.symbolic:
        _symbolic_stage(pending, default_worker())
    return _result(pending, config)


_template_requested = False


_pools: dict[int, WorkerPool] = {}
_pools_lock = threading.Lock()


def _pool(size: int) -> WorkerPool:
    with _pools_lock:
        if size not in _pools:
            pool = WorkerPool(size)
            pool.start()
            _pools[size] = pool
        return _pools[size]


@atexit.register
def _close_pools() -> None:
    for pool in _pools.values():
        pool.close()


def compute_score_batch(
    data_sources: Sequence[Any] | None = None,
    solution_strs: Sequence[Any] = (),
    ground_truths: Sequence[Any] = (),
    extra_infos: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """verl ``BatchRewardManager`` entry point: the fast stage in-process, undecided pairs on a worker pool.

    Each item keeps its own deadline (``timeout_s`` from the start of its fast stage), so one pathological answer
    never delays another beyond the pool's queueing.
    """
    config = RewardConfig.from_kwargs(kwargs)
    if len(solution_strs) != len(ground_truths):
        msg = f"got {len(solution_strs)} responses but {len(ground_truths)} ground truths; they must align"
        raise ValueError(msg)
    pendings = [_fast_stage(text, truth, config) for text, truth in zip(solution_strs, ground_truths, strict=True)]
    undecided = [pending for pending in pendings if pending.symbolic]
    if undecided:
        size = config.num_workers or min(4, os.cpu_count() or 1)
        pool = _pool(size)

        def run(pending: _Pending) -> None:
            worker = pool.acquire()
            try:
                pending.deadline = time.monotonic() + pending.budget_left  # queueing is not billed to the item
                _symbolic_stage(pending, worker)
            finally:
                pool.release(worker)

        with ThreadPoolExecutor(max_workers=len(pool)) as executor:
            list(executor.map(run, undecided))
    return [_result(pending, config) for pending in pendings]
