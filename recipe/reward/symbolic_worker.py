"""Child-process side of the symbolic stage: Math-Verify + sympy on one (gold, prediction) pair per request.

Run as ``python -m r1_ascend.recipe.reward.symbolic_worker``. It imports Math-Verify once, announces readiness,
then reads one JSON object per line on stdin (``{"gold": str, "pred": str, "timeout_s": float}``) and answers one
JSON object per line on stdout (``{"equal": bool}`` or ``{"error": str}``). Math-Verify's own ``signal.alarm``
timeouts are disabled: the parent enforces ``timeout_s`` by killing this process, which works from any thread of
the parent.

Both sides are wrapped in ``\\boxed{}`` so that Math-Verify parses bare LaTeX (its best configuration on the dev
cases); latex2sympy2_extended builds sympy objects from an ANTLR parse tree, never via ``eval``.
"""

from __future__ import annotations

import json
import logging
import sys

# One pair per kind of construct: the first comparison of each kind costs sympy seconds of lazy imports/caches.
_WARM_UP = (
    ("\\frac{1}{2}", "0.5"),
    ("\\sum_{k=1}^{n} a_k b_{n-k}", "\\sum_{j=1}^{n} b_{n-j} a_j"),
    ("x \\le 5", "5 \\ge x"),
    ("\\{1, 2\\}", "\\{2, 1\\}"),
    ("\\begin{pmatrix}1 & 2\\\\ 3 & 4\\end{pmatrix}", "\\begin{pmatrix}1 & 2\\\\ 3 & 4\\end{pmatrix}"),
    ("\\int_0^1 x\\,dx", "\\frac{1}{2}"),
)


def _compare(gold: str, pred: str) -> bool:
    from math_verify import parse, verify

    gold_parsed = parse(f"\\boxed{{{gold}}}", parsing_timeout=None)  # type: ignore[arg-type]
    pred_parsed = parse(f"\\boxed{{{pred}}}", parsing_timeout=None)  # type: ignore[arg-type]
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def _answer(gold: str, pred: str) -> dict[str, object]:
    try:
        return {"equal": _compare(gold, pred)}
    except Exception as error:  # any failure is an answer, never a dead worker
        return {"error": f"{type(error).__name__}: {error}"[:200]}


def main() -> int:
    logging.disable(logging.WARNING)  # Math-Verify warns once that its timeouts are off: intended here
    for gold, pred in _WARM_UP:  # load sympy, the ANTLR grammar and sympy's lazy modules before announcing readiness
        _compare(gold, pred)

    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            reply = _answer(str(request["gold"]), str(request["pred"]))
        except (ValueError, KeyError, TypeError) as error:
            reply = {"error": f"bad request: {type(error).__name__}: {error}"[:200]}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
