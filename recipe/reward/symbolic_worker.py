"""Child-process side of the symbolic stage: a warm template process that forks comparison workers on demand.

Run as ``python -m r1_ascend.recipe.reward.symbolic_worker CONTROL_FD``. The template imports Math-Verify once
(about 2 s), runs one comparison of each kind so that sympy's lazy imports and caches are loaded, announces
readiness on the control socket, and then never compares anything itself. For each socket the parent passes
(``SCM_RIGHTS`` over the control socket) it forks a worker that inherits the warm state, so a replacement is
ready in milliseconds instead of seconds: a worker killed on a timeout never delays the next comparison.

A worker speaks JSON lines on its socket: first ``{"ready": true, "pid": N}`` (the parent kills by that pid),
then one reply per request ``{"gold": str, "pred": str}`` → ``{"equal": bool}`` or ``{"error": str}``.
Math-Verify's own ``signal.alarm`` timeouts are disabled; the parent bounds each request by killing the worker.
Both sides are wrapped in ``\\boxed{}`` so that Math-Verify parses bare LaTeX (its best configuration on the dev
cases); latex2sympy2_extended builds sympy objects from an ANTLR parse tree, never via ``eval``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys

# One pair per kind of construct. The first parse of each construct is slow for two reasons that a fork inherits
# once paid: sympy's lazy imports and caches, and the ANTLR parser's prediction cache (latex2sympy's grammar builds
# its DFA states on first use: a sum over subscripted terms costs seconds cold and milliseconds warm).
_WARM_UP = (
    ("\\frac{1}{2}", "0.5"),
    ("\\sum_{k=1}^{n} a_k b_{n-k}", "\\sum_{j=1}^{n} b_{n-j} a_j"),
    ("a_n = \\sum_{i=1}^{n-1} a_i a_{n-i-1}", "a_n = \\sum_{i=1}^{n-1} a_{n-i-1} a_i"),
    ("x \\le 5", "5 \\ge x"),
    ("\\{1, 2\\}", "\\{2, 1\\}"),
    ("[0, 1) \\cup (2, \\infty)", "(2, \\infty) \\cup [0, 1)"),
    ("\\begin{pmatrix}1 & 2\\\\ 3 & 4\\end{pmatrix}", "\\begin{bmatrix}1 & 2\\\\ 3 & 4\\end{bmatrix}"),
    ("\\int_0^1 x\\,dx", "\\frac{1}{2}"),
    ("\\lim_{x \\to 0} \\frac{\\sin x}{x}", "1"),
    ("3x - y + 2 = 0", "y = 3x + 2"),
    ("f(x) = \\log_{2}(x) + \\sqrt[3]{x}", "f(x) = \\frac{\\ln x}{\\ln 2} + x^{1/3}"),
    ("\\binom{n}{k} \\cdot k!", "\\frac{n!}{(n-k)!}"),
    ("\\text{(A)}\\ 12\\%", "12"),
    ("\\overline{AB} = 2\\sqrt{3}", "\\sqrt{12}"),
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


def serve(connection: socket.socket) -> None:
    """Worker loop: one JSON request per line until the parent closes the socket (or kills us)."""
    stream = connection.makefile("rwb")
    stream.write(json.dumps({"ready": True, "pid": os.getpid()}).encode() + b"\n")
    stream.flush()
    for line in stream:
        try:
            request = json.loads(line)
            reply = _answer(str(request["gold"]), str(request["pred"]))
        except (ValueError, KeyError, TypeError) as error:
            reply = {"error": f"bad request: {type(error).__name__}: {error}"[:200]}
        stream.write(json.dumps(reply).encode() + b"\n")
        stream.flush()


def template(control: socket.socket) -> None:
    """Fork one warm worker per socket received on ``control``; exit when the parent closes it."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped automatically
    control.sendall(b'{"ready": true}\n')
    while True:
        message, fds, _, _ = socket.recv_fds(control, 16, 1)
        if not message:
            return
        if not fds:
            continue
        pid = os.fork()
        if pid == 0:  # the worker: only its own socket stays open
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                serve(socket.socket(fileno=fds[0]))
            finally:
                os._exit(0)
        os.close(fds[0])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m r1_ascend.recipe.reward.symbolic_worker CONTROL_FD", file=sys.stderr)
        return 2
    logging.disable(logging.WARNING)  # Math-Verify warns once that its timeouts are off: intended here
    control = socket.socket(fileno=int(argv[0]))
    for gold, pred in _WARM_UP:  # load sympy, the ANTLR grammar and sympy's lazy modules before forking
        _compare(gold, pred)
    template(control)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
