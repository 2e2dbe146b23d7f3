"""The rehearsal's toy task: "lead with a number", a reward a randomly initialised tiny model earns sometimes.

The rehearsal trains a tiny random model for a handful of steps. It never solves a deepscaler problem, so the math
reward (``r1_ascend.recipe.reward``) is 0 for every sample, every GRPO advantage is 0 and nothing is learnt. This
task keeps the real run's shape (a prompt, a ground truth, a rule-based reward through verl's
``custom_reward_function``) with a success criterion that random text meets at a measurable base rate and that the
policy controls with its first few tokens, so a few policy-gradient steps visibly raise it.

Task: one-digit additions ("What is 3 + 4?") under an instruction to put the answer first. Reward
(:func:`compute_score`): 1 when an ASCII digit occurs in the first :data:`LEAD_CHARS` characters of the decoded
response, else 0. Whether that leading number is the right sum is reported (``exact``) but not rewarded: a random
model would need hundreds of steps to learn arithmetic, and the rehearsal needs a signal in ten. Random text earns
the reward only when a digit token happens to be sampled among its first two or three tokens (about 1 token in 20
of the tiny tokenizer's vocabulary is one), which keeps the base rate well below 1 and away from 0
(docs/launch.md "Toy task").

verl imports this file by path (``custom_reward_function.path``, as module ``custom_module``); it reaches the
project only through absolute imports of the installed package, so that works in any process. The reward itself is
plain Python and looks at a bounded prefix of the response, so its cost does not grow with the response.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from r1_ascend.data.rows import Problem, to_verl_row
from r1_ascend.data.schema import write_parquet

DATA_SOURCE = "toy_lead_number"
INSTRUCTION = "Answer with the number first: the reply starts with the answer, written in digits."
#: The reward looks only at this many leading characters of the response: "first" means the first few tokens.
LEAD_CHARS = 8
#: Longest leading number reported in ``pred`` (a response may be thousands of digits long).
PRED_MAX_CHARS = 32
#: Keys of every :func:`compute_score` result (verl turns each into a per-sample ``reward_extra_info`` list).
SCORE_KEYS = ("score", "acc", "exact", "pred", "fail_reason")
#: Problem counts of the two files :func:`write_data` writes.
TRAIN_ROWS = 100
VAL_ROWS = 32
SEED = 20250601

_DIGITS = re.compile(r"[0-9]+")


def _text(solution_str: Any) -> str:
    """The response as text: bytes are decoded with replacement, anything else that is not a string is empty."""
    if isinstance(solution_str, bytes | bytearray):
        return bytes(solution_str).decode("utf-8", errors="replace")
    return solution_str if isinstance(solution_str, str) else ""


def compute_score(
    data_source: Any = None, solution_str: Any = "", ground_truth: Any = None, extra_info: Any = None, **kwargs: Any
) -> dict[str, Any]:
    """verl ``custom_reward_function`` entry point (naive reward manager), same signature as the math reward.

    ``score`` and ``acc`` (verl's validation reports ``acc`` as its core metric) are 1.0 when a digit occurs in the
    response's first :data:`LEAD_CHARS` characters; ``pred`` is the number starting at that digit (at most
    :data:`PRED_MAX_CHARS` digits); ``exact`` is 1.0 when it equals ``ground_truth`` as an integer;
    ``fail_reason`` is ``""``, ``"empty_response"`` or ``"no_leading_number"``. Keyword arguments are refused,
    so a ``reward_kwargs`` meant for the math reward fails at the first step instead of being ignored.
    """
    if kwargs:
        msg = f"the toy task's reward takes no options, got {sorted(kwargs)}"
        raise TypeError(msg)
    text = _text(solution_str)
    match = _DIGITS.search(text, 0, LEAD_CHARS) if text else None
    if match is None:
        reason = "no_leading_number" if text else "empty_response"
        return {"score": 0.0, "acc": 0.0, "exact": 0.0, "pred": "", "fail_reason": reason}
    number = _DIGITS.match(text, match.start(), match.start() + PRED_MAX_CHARS + 1)
    digits = number.group() if number is not None else match.group()
    truth = str(ground_truth).strip() if ground_truth is not None else ""
    # compared as digit strings without leading zeros: no int() of an unbounded string, and a number cut at the
    # bound is never exact
    exact = len(digits) <= PRED_MAX_CHARS and truth.isascii() and truth.isdigit() and _same_integer(digits, truth)
    return {"score": 1.0, "acc": 1.0, "exact": float(exact), "pred": digits[:PRED_MAX_CHARS], "fail_reason": ""}


def _same_integer(a: str, b: str) -> bool:
    return (a.lstrip("0") or "0") == (b.lstrip("0") or "0")


def problems(split: str) -> list[tuple[int, int]]:
    """The (a, b) pairs of a split, in file order: train = every one-digit pair, val = two-digit pairs."""
    rng = random.Random(f"{SEED}:{split}")
    if split == "train":
        pairs = [(a, b) for a in range(10) for b in range(10)]
        rng.shuffle(pairs)
        return pairs[:TRAIN_ROWS]
    if split == "val":
        return [(rng.randrange(10, 100), rng.randrange(10, 100)) for _ in range(VAL_ROWS)]
    msg = f"unknown split {split!r}; the toy task has 'train' and 'val'"
    raise ValueError(msg)


def rows(split: str) -> list[dict[str, Any]]:
    """verl parquet rows (the layout ``r1-ascend prepare-data`` writes, r1_ascend.data.schema) for ``split``."""
    out = []
    for index, (a, b) in enumerate(problems(split)):
        item = Problem(
            problem=f"What is {a} + {b}?",
            answer=str(a + b),
            solution=None,
            extra_fields=json.dumps({"a": a, "b": b}, sort_keys=True),
        )
        out.append(
            to_verl_row(
                item,
                data_source=DATA_SOURCE,
                split=split,
                index=index,
                input_file=DATA_SOURCE,
                input_row=index,
                instruction=INSTRUCTION,
            )
        )
    return out


def write_data(out: Path) -> Path:
    """``train.parquet`` and ``val.parquet`` of the toy task in ``out`` (same bytes on every call); returns ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        write_parquet(out / f"{split}.parquet", rows(split))
    return out
