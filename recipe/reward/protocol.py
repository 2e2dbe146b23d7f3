"""The response protocol: which part of a response is graded and which ``\\boxed{}`` is the answer.

Decisions (tested in ``tests/reward/test_protocol.py``, argued in ``docs/reward.md``):

* Exactly one ``</think>``. Text before it never counts. ``<think>`` may be absent (prompts that already opened
  it), but if present it must come once and before ``</think>``.
* Only ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed 5`` after ``</think>`` count. Identical repeats collapse;
  several different boxes form one multi-part answer (a list), which matches only a multi-part ground truth —
  so hedging (``\\boxed{1} or \\boxed{2}``) never earns reward.
* ``<answer> ... </answer>`` around the box is what the instruction asks for; it feeds the ``format`` component
  but is not required for accuracy.
"""

from __future__ import annotations

import dataclasses
import re

try:  # the prompt template owns the marker strings; fall back to literals if it is not importable
    from r1_ascend.data.template import ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE, THINK_OPEN
except ImportError:  # pragma: no cover - only when the data package is absent
    THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"

PROTOCOL_THINK_BOXED = "think_boxed"
PROTOCOL_BOXED = "boxed"
PROTOCOLS = (PROTOCOL_THINK_BOXED, PROTOCOL_BOXED)

MAX_BOX_CHARS = 2000
MAX_BOXES = 64  # only the last 64 boxes of a response are read (the answer is the last one)
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_BRACE_RE = re.compile(r"\\[{}]|[{}]")  # an escaped brace is consumed whole, so it never counts as a group

# fail_reason values (the empty string means the answer was extracted; see score.py for the grading ones)
NO_THINK_CLOSE = "no_think_close"
MULTIPLE_THINK_CLOSE = "multiple_think_close"
BAD_THINK_OPEN = "bad_think_open"
NO_BOX = "no_box"
EMPTY_BOX = "empty_box"
UNBALANCED_BOX = "unbalanced_box"
BOX_TOO_LONG = "box_too_long"  # a box whose content exceeds MAX_BOX_CHARS (never a plausible final answer)


@dataclasses.dataclass(frozen=True)
class Extraction:
    """The boxed answers found in the graded segment, or why there are none."""

    answers: tuple[str, ...] = ()
    fail_reason: str = ""
    answer_tags_ok: bool = False

    @property
    def ok(self) -> bool:
        return not self.fail_reason


def find_boxes(text: str) -> tuple[list[str], str]:
    """All top-level box contents in ``text`` in order, and a failure reason if a box is empty or unbalanced."""
    answers: list[str] = []
    problem = ""
    position = _scan_start(text)
    while True:
        match = _BOX_RE.search(text, position)
        if match is None:
            break
        index = match.end()
        while index < len(text) and text[index] in " \t":
            index += 1
        if index < len(text) and text[index] == "{":
            close = _matching_brace(text, index)
            if close < 0:
                problem = problem or (BOX_TOO_LONG if close == _TOO_LONG else UNBALANCED_BOX)
                break
            content = text[index + 1 : close].strip()
            position = close + 1
        else:  # "\boxed 5": one token up to whitespace or a dollar sign
            end = index
            while end < len(text) and text[end] not in " \t\n$":
                end += 1
            content = text[index:end].strip() if index > match.end() else ""
            position = max(end, match.end())
        if content:
            answers.append(content)
        else:
            problem = problem or EMPTY_BOX
    return answers, problem


def _scan_start(text: str) -> int:
    """Where the last ``MAX_BOXES`` boxes begin: only they are read, so thousands of boxes cost no more than 64.

    One backward cursor per spelling, each moving only backwards: linear in the text length overall.
    """
    cursors = {needle: text.rfind(needle) for needle in ("\\boxed", "\\fbox")}
    position = len(text)
    for _ in range(MAX_BOXES):
        needle = max(cursors, key=cursors.__getitem__)
        position = cursors[needle]
        if position < 0:
            return 0
        cursors[needle] = text.rfind(needle, 0, position)
    return position


_UNBALANCED = -1
_TOO_LONG = -2


def _matching_brace(text: str, open_index: int) -> int:
    """Index of the brace closing ``text[open_index]`` (bounded by MAX_BOX_CHARS, C-speed between braces).

    ``_UNBALANCED`` when the text ends first, ``_TOO_LONG`` when the content would exceed MAX_BOX_CHARS.
    ``\\{`` and ``\\}`` are set braces, not groups; a ``\\}`` without its ``\\{`` is a stray backslash
    followed by a closing brace (``\\boxed{7\\}``).
    """
    depth = set_depth = 0
    limit = min(len(text), open_index + MAX_BOX_CHARS + 2)
    for match in _BRACE_RE.finditer(text, open_index, limit):
        brace = match.group()
        if brace == "\\{":
            set_depth += 1
        elif brace == "\\}" and set_depth:
            set_depth -= 1
        elif brace == "{":
            depth += 1
        elif brace in ("}", "\\}"):  # an unmatched "\}" is a stray backslash before a closing brace
            depth -= 1
            if depth == 0:
                return match.end() - 1
    return _TOO_LONG if limit < len(text) else _UNBALANCED


def _distinct(answers: list[str]) -> tuple[str, ...]:
    """Distinct answers ordered by their last occurrence: a final answer that repeats an earlier box stays last."""
    seen: dict[str, str] = {}
    for answer in reversed(answers):
        seen.setdefault("".join(answer.split()), answer)
    return tuple(reversed(seen.values()))


def extract_answer(response: str, protocol: str = PROTOCOL_THINK_BOXED) -> Extraction:
    """Apply the protocol to one decoded response."""
    if protocol not in PROTOCOLS:
        msg = f"unknown reward protocol {protocol!r}; expected one of {PROTOCOLS}"
        raise ValueError(msg)
    tail = response
    if protocol == PROTOCOL_THINK_BOXED:
        closes = response.count(THINK_CLOSE)
        if closes == 0:
            return Extraction(fail_reason=NO_THINK_CLOSE)
        if closes > 1:
            return Extraction(fail_reason=MULTIPLE_THINK_CLOSE)
        close_at = response.index(THINK_CLOSE)
        opens = response.count(THINK_OPEN)
        if opens > 1 or (opens == 1 and response.index(THINK_OPEN) > close_at):
            return Extraction(fail_reason=BAD_THINK_OPEN)
        tail = response[close_at + len(THINK_CLOSE) :]
    answers, problem = find_boxes(tail)
    if not answers:
        return Extraction(fail_reason=problem or NO_BOX)
    if problem:
        return Extraction(fail_reason=problem)
    return Extraction(answers=_distinct(answers), answer_tags_ok=_answer_tags_ok(tail))


def _answer_tags_ok(tail: str) -> bool:
    """One ``<answer>`` block after the reasoning, containing the last box, and nothing but whitespace after it."""
    if tail.count(ANSWER_OPEN) != 1 or tail.count(ANSWER_CLOSE) != 1:
        return False
    start, end = tail.index(ANSWER_OPEN), tail.index(ANSWER_CLOSE)
    if end < start or tail[end + len(ANSWER_CLOSE) :].strip():
        return False
    block = tail[start:end]
    return _BOX_RE.search(block) is not None and not _BOX_RE.search(tail[end:])


_BOX_LIST_GLUE_RE = re.compile(r"(?:[\s,;$]|\\[(\[\])]|\band\b)*")


def unbox_ground_truth(ground_truth: str) -> str:
    """Ground truths are plain answers; a boxed one (``\\boxed{24}``) is unwrapped.

    Several boxes joined only by commas, spaces, ``$`` or "and" are one list answer (``\\boxed{2}, \\boxed{3}``);
    boxes with other words between them are a solution text whose last box is the answer.
    """
    if _BOX_RE.search(ground_truth):
        answers, _ = find_boxes(ground_truth)
        if len(answers) == 1:
            return answers[0]
        if answers:
            rest = ground_truth
            for answer in answers:
                rest = re.sub(r"\\(?:boxed|fbox)\s*\{\s*" + re.escape(answer) + r"\s*\}", " ", rest, count=1)
            return ", ".join(answers) if _BOX_LIST_GLUE_RE.fullmatch(rest) else answers[-1]
    return ground_truth
