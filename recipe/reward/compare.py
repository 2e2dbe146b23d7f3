"""Deciding equivalence of two parsed answers without sympy.

Constants are evaluated exactly (``Fraction``) while that stays small, otherwise with a private 40-digit mpmath
context, so ``100000000!`` or ``9^{9^{9}}`` cost microseconds instead of materialising huge integers. Expressions
with variables are compared by evaluating both sides at a few deterministic pseudo-random points (a
Schwartz–Zippel style identity test at 40 digits). Equations match when their ``lhs - rhs`` differ by a non-zero
constant factor, inequalities when by a positive one.

No tolerance makes different exact values equal: ``50`` vs ``0.5`` and ``9999`` vs ``10000`` are compared
exactly. The one numeric allowance: a decimal literal with at least ``MIN_DECIMAL_SIGNIFICANT`` significant digits
matches an exact value that has no terminating decimal expansion (``1/3``, ``\\sqrt{17}``) when that value rounds
to the literal at the literal's own number of decimal places.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import mpmath

from r1_ascend.recipe.reward.parse import Node

MIN_DECIMAL_SIGNIFICANT = 4
_EXACT_MAX_BITS = 20_000
# Magnitude guards. mpmath keeps a number's binary exponent as a Python int, so a value like 9^{9^{9^{9}}} (whose
# exponent alone has 3.7e8 digits) or sin(10^{10^{10}}) (argument reduction at 10^10 digits) takes unbounded time.
# Every operation checks the size of its result (or of its argument, for the periodic functions) before computing
# it; anything beyond these bounds is undecidable here and never reaches the symbolic stage either.
MAX_MAGNITUDE_BITS = 2**32  # |value| < 2^(2^32), about 10^(1.3e9): far beyond any real answer
_MAX_PERIODIC_ARG_BITS = 4096  # trig arguments up to 2^4096 (reduction costs a few thousand bits)
_MAX_FACTORIAL_ARG = 10**8  # n! < 2^(2.7e9)
_MP = mpmath.MPContext()
_MP.dps = 40
_RELATIVE_TOLERANCE = _MP.mpf(10) ** -25
_SAMPLE_POINTS = 3

Value = Any  # Fraction | mpc/mpf


class Undecided(Exception):
    """The fast stage cannot decide (unsupported construct, evaluation failure); use the symbolic stage."""


class Malformed(Exception):
    """A container or statement appears inside arithmetic (``-[0,1)``): not equal to any well-formed answer."""


class DeadlineExceeded(Exception):
    """The per-answer time budget ran out inside the fast stage."""


class TooLarge(Undecided):
    """A value (or an intermediate) would exceed the magnitude guards; neither stage may evaluate it."""


def _magnitude(value: Value) -> Any:
    """About log2|value| (0 for zero), in constant time for any size."""
    if isinstance(value, Fraction):
        return value.numerator.bit_length() - value.denominator.bit_length() if value else 0
    if _MP.isnan(value) or _MP.isinf(value) or not value:
        return 0  # infinities are legitimate answers (intervals); arithmetic on them is cheap
    return _MP.mag(value)


def _shrink(value: Value) -> Value:
    """Leave exact arithmetic once integers get long (big-int products and gcds are quadratic; 40 digits suffice),
    and refuse values beyond ``MAX_MAGNITUDE_BITS``."""
    if isinstance(value, Fraction):
        if max(value.numerator.bit_length(), value.denominator.bit_length()) <= _EXACT_MAX_BITS:
            return value
        value = _to_mp(value)
    if abs(_magnitude(value)) > MAX_MAGNITUDE_BITS:
        raise TooLarge
    return value


def _guard_power(base: Value, exponent: Value) -> None:
    """Refuse base^exponent when |result| or 1/|result| would exceed ``MAX_MAGNITUDE_BITS``."""
    if _magnitude(exponent) > 64:  # |exponent| > 2^64: only a base of exactly 0 or 1 (or -1) stays small
        if base in (0, 1, -1):
            return
        raise TooLarge
    log_base = abs(_MP.log(abs(_to_mp(base)), 2)) if base != 0 else 0
    if abs(_to_mp(exponent)) * (log_base + 1) > MAX_MAGNITUDE_BITS:
        raise TooLarge


class _Evaluator:
    def __init__(self, env: dict[str, Value], deadline: float) -> None:
        self.env = env
        self.deadline = deadline
        self.steps = 0

    def __call__(self, node: Node) -> Value:
        self.steps += 1
        if self.steps % 64 == 0 and time.monotonic() > self.deadline:
            raise DeadlineExceeded
        kind = node[0]
        handler: Callable[[Node], Value] | None = getattr(self, "_" + kind, None)
        if handler is None:
            msg = f"cannot evaluate {kind}"
            raise Undecided(msg)
        return _shrink(handler(node))

    def _container(self, node: Node) -> Value:
        msg = f"{node[0]} used as a number"
        raise Malformed(msg)

    _tuple = _list = _set = _union = _eq = _rel = _named = _container

    def _num(self, node: Node) -> Value:
        return node[1]

    def _sym(self, node: Node) -> Value:
        return self.env[node[1]]

    def _const(self, node: Node) -> Value:
        return _MP.pi if node[1] == "pi" else _MP.inf

    def _add(self, node: Node) -> Value:
        total: Value = Fraction(0)
        for part in node[1]:
            total = _shrink(_lift(total, value := self(part)) + _lift(value, total))
        return total

    def _mul(self, node: Node) -> Value:
        total: Value = Fraction(1)
        for part in node[1]:
            total = _shrink(_lift(total, value := self(part)) * _lift(value, total))
        return total

    def _neg(self, node: Node) -> Value:
        return -self(node[1])

    def _div(self, node: Node) -> Value:
        numerator, denominator = self(node[1]), self(node[2])
        if denominator == 0:
            msg = "division by zero"
            raise Undecided(msg)
        return _lift(numerator, denominator) / _lift(denominator, numerator)

    def _pow(self, node: Node) -> Value:
        base, exponent = self(node[1]), self(node[2])
        if isinstance(base, Fraction) and isinstance(exponent, Fraction):
            exact = _exact_power(base, exponent)
            if exact is not None:
                return exact
        if base == 0 and _MP.re(_to_mp(exponent)) <= 0:
            msg = "zero to a non-positive power"
            raise Undecided(msg)
        _guard_power(base, exponent)
        return _MP.power(_to_mp(base), _to_mp(exponent))

    def _fact(self, node: Node) -> Value:
        value = self(node[1])
        if isinstance(value, Fraction) and value.denominator == 1 and value >= 0:
            if value <= 2000:
                return Fraction(math.factorial(int(value)))
            if value > _MAX_FACTORIAL_ARG:
                raise TooLarge
            return _MP.factorial(_MP.mpf(int(value)))
        msg = "factorial of a non-integer"
        raise Undecided(msg)

    def _binom(self, node: Node) -> Value:
        n, k = self(node[1]), self(node[2])
        if all(isinstance(v, Fraction) and v.denominator == 1 and 0 <= v <= 5000 for v in (n, k)):
            return Fraction(math.comb(int(n), int(k)))
        if max(_magnitude(n), _magnitude(k)) > 64:
            raise TooLarge
        return _MP.binomial(_to_mp(n), _to_mp(k))

    def _func(self, node: Node) -> Value:
        name, argument = node[1], self(node[2])
        if name == "abs":
            return abs(argument)
        if name == "sqrt":
            if isinstance(argument, Fraction) and argument >= 0:
                root = _exact_root(argument)
                if root is not None:
                    return root
            return _MP.sqrt(_to_mp(argument))
        functions = {
            "sin": _MP.sin, "cos": _MP.cos, "tan": _MP.tan, "sec": _MP.sec, "csc": _MP.csc, "cot": _MP.cot,
            "arcsin": _MP.asin, "arccos": _MP.acos, "arctan": _MP.atan, "sinh": _MP.sinh, "cosh": _MP.cosh,
            "tanh": _MP.tanh, "ln": _MP.ln, "log": _MP.ln, "exp": _MP.exp,
        }  # fmt: skip
        if argument == 0 and name in ("ln", "log", "cot", "csc"):
            msg = f"{name}(0)"
            raise Undecided(msg)
        size = _magnitude(argument)
        if name in ("exp", "sinh", "cosh", "tanh") and size > 32:  # e^(2^32) is the largest allowed result
            raise TooLarge
        if size > _MAX_PERIODIC_ARG_BITS:
            raise TooLarge
        return functions[name](_to_mp(argument))


def _to_mp(value: Value) -> Any:
    if isinstance(value, Fraction):
        return _MP.mpf(value.numerator) / value.denominator
    return value


def _lift(value: Value, other: Value) -> Value:
    """Keep Fractions exact while both operands are exact; otherwise move both to mpmath."""
    if isinstance(value, Fraction) and isinstance(other, Fraction):
        return value
    return _to_mp(value)


def _exact_power(base: Fraction, exponent: Fraction) -> Fraction | None:
    if exponent.denominator != 1:
        root = _exact_root(base) if exponent.denominator == 2 and base >= 0 else None
        if root is None:
            return None
        return _exact_power(root, Fraction(exponent.numerator))
    power = int(exponent)
    if base == 0 and power < 0:
        return None
    size = max(base.numerator.bit_length(), base.denominator.bit_length(), 1) * abs(power)
    if size > _EXACT_MAX_BITS:
        return None
    return base**power


def _exact_root(value: Fraction) -> Fraction | None:
    numerator, denominator = math.isqrt(value.numerator), math.isqrt(value.denominator)
    if numerator * numerator == value.numerator and denominator * denominator == value.denominator:
        return Fraction(numerator, denominator)
    return None


def _close(a: Value, b: Value) -> bool:
    a, b = _to_mp(a), _to_mp(b)
    if _MP.isnan(a) or _MP.isnan(b):
        msg = "not a number"
        raise Undecided(msg)
    if _MP.isinf(a) or _MP.isinf(b):
        return bool(a == b)
    scale = max(_MP.mpf(1), abs(a), abs(b))
    return bool(abs(a - b) <= _RELATIVE_TOLERANCE * scale)


def _terminating(value: Fraction) -> bool:
    denominator = value.denominator
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    return denominator == 1


def _decimal_literal(node: Node) -> tuple[Fraction, int] | None:
    """(value, decimal places) when the node is a plain decimal with enough significant digits."""
    negative = False
    if node[0] == "neg":
        negative, node = True, node[1]
    if node[0] != "num" or "." not in node[2]:
        return None
    literal = node[2]
    places = len(literal.split(".", 1)[1])
    significant = len(literal.replace(".", "").lstrip("0"))
    if places == 0 or significant < MIN_DECIMAL_SIGNIFICANT:
        return None
    return (-node[1] if negative else node[1]), places


def _rounds_to(exact: Value, decimal: Fraction, places: int) -> bool:
    if isinstance(exact, Fraction):
        if _terminating(exact):
            return False
        scaled = exact * 10**places
        rounded = Fraction(math.floor(scaled + Fraction(1, 2)), 10**places)
        return rounded == decimal
    exact = _to_mp(exact)
    if _MP.im(exact) != 0 or _MP.isinf(exact):
        return False
    rounded = _MP.floor(_MP.re(exact) * 10**places + _MP.mpf(0.5))
    return bool(rounded == decimal * 10**places)


def _symbols(node: Any, found: set[str]) -> set[str]:
    if isinstance(node, tuple):
        if node and node[0] == "sym":
            found.add(node[1])
        else:
            for part in node[1:]:
                _symbols(part, found)
    elif isinstance(node, list):
        for part in node:
            _symbols(part, found)
    return found


def _sample_environments(names: set[str]) -> list[dict[str, Value]]:
    environments = []
    for point in range(_SAMPLE_POINTS):
        env = {}
        for name in sorted(names):
            digest = hashlib.blake2b(f"{name}|{point}".encode(), digest_size=8).digest()
            fraction = int.from_bytes(digest, "big") / 2**64
            env[name] = (
                _MP.mpf(0.6) + _MP.mpf(1.7) * _MP.mpf(fraction) + _MP.sqrt(2) / 1000
            )  # irrational, in (0.6, 2.3)
        environments.append(env)
    return environments


class Comparator:
    """Structural equivalence of two parsed answers under a deadline."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def equal(self, gold: Node, pred: Node) -> bool:
        gold, pred = _unwrap(gold), _unwrap(pred)
        kinds = {gold[0], pred[0]}
        if "named" in kinds:
            return self._named_equal(gold, pred)
        if kinds & {"tuple", "union"} and kinds & {"rel", "list"}:
            converted = _relations_as_intervals(gold), _relations_as_intervals(pred)
            if converted != (gold, pred):
                return self.equal(*converted)
        if kinds <= {"list", "set", "union"} and (gold[0] == pred[0] or kinds == {"list", "set"}):
            return self._multiset_equal(_items(gold), _items(pred))
        if gold[0] == "tuple" or pred[0] == "tuple":
            return self._tuple_equal(gold, pred)
        if kinds & {"list", "set", "union"}:
            return False
        if gold[0] == "eq" or pred[0] == "eq":
            return gold[0] == pred[0] and self._proportional(_difference(gold), _difference(pred), positive=False)
        if gold[0] == "rel" or pred[0] == "rel":
            if gold[0] != pred[0]:
                return False
            gold_op, gold_diff = _oriented(gold)
            pred_op, pred_diff = _oriented(pred)
            return gold_op == pred_op and self._proportional(gold_diff, pred_diff, positive=gold_op != "\\ne")
        return self._expressions_equal(gold, pred)

    def _named_equal(self, gold: Node, pred: Node) -> bool:
        """``x = 3`` names the answer 3; two named equations may also be the same equation rearranged."""
        if gold[0] == "named" and pred[0] == "named":
            try:
                if self.equal(gold[2], pred[2]):
                    return True  # same value under any name: "x = 3" and "k = 3"
            except Undecided:
                pass
            return self._as_equation(gold, pred)
        if gold[0] == "eq" or pred[0] == "eq":
            return self._as_equation(gold, pred)  # "y = 3x + 2" and "3x - y + 2 = 0"
        named, other = (gold, pred) if gold[0] == "named" else (pred, gold)
        value = named[2]
        return self.equal(value, other) if named is gold else self.equal(other, value)

    def _as_equation(self, gold: Node, pred: Node) -> bool:
        sides = []
        for node in (gold, pred):
            if node[1][0] == "tuple" or node[2][0] in ("tuple", "list", "set", "union"):
                return False
            sides.append(("eq", node[1], node[2]))
        return self._proportional(_difference(sides[0]), _difference(sides[1]), positive=False)

    def _tuple_equal(self, gold: Node, pred: Node) -> bool:
        """Tuples and intervals are ordered and their brackets must match. A ``( )`` pair also equals a set or a
        list of the same values written in the same order (``\\{2, 5\\}`` or ``2, 5`` for "both values")."""
        if gold[0] == pred[0]:
            return (
                gold[1:3] == pred[1:3]
                and len(gold[3]) == len(pred[3])
                and all(self.equal(a, b) for a, b in zip(gold[3], pred[3], strict=True))
            )
        pair, other = (gold, pred) if gold[0] == "tuple" else (pred, gold)
        if pair[1:3] != ("(", ")") or other[0] not in ("set", "list") or len(other[1]) != len(pair[3]):
            return False
        items = [(a, b) if pair is gold else (b, a) for a, b in zip(pair[3], other[1], strict=True)]
        return all(self.equal(a, b) for a, b in items)

    def _multiset_equal(self, gold: list[Node], pred: list[Node]) -> bool:
        """Same items, any order. A prediction that writes an item twice, character for character, still matches a
        ground truth without repeats (``(3,17),(3,17),(1,2)`` for ``(1,2),(3,17)``); a ground truth that repeats an
        item (a double root) needs it repeated."""
        if self._same_items(gold, pred):
            return True
        unique = _without_repeats(pred)
        return len(unique) < len(pred) and len(_without_repeats(gold)) == len(gold) and self._same_items(gold, unique)

    def _same_items(self, gold: list[Node], pred: list[Node]) -> bool:
        if len(gold) != len(pred):
            return False
        remaining = list(pred)
        for item in gold:
            for index, candidate in enumerate(remaining):
                if self.equal(item, candidate):
                    del remaining[index]
                    break
            else:
                return False
        return True

    def _expressions_equal(self, gold: Node, pred: Node) -> bool:
        names = _symbols(pred, _symbols(gold, set()))
        if not names:
            gold_value, pred_value = self._evaluate(gold, {}), self._evaluate(pred, {})
            for literal_node, exact in ((gold, pred_value), (pred, gold_value)):
                decimal = _decimal_literal(literal_node)
                if decimal is not None and _rounds_to(exact, *decimal):
                    return True
            if isinstance(gold_value, Fraction) and isinstance(pred_value, Fraction):
                return gold_value == pred_value
            if isinstance(gold_value, Fraction) or isinstance(pred_value, Fraction):
                # one side is rational; mpmath can only tell us "different" reliably when far apart
                return _close(gold_value, pred_value) and not _decimal_mismatch(gold, pred)
            return _close(gold_value, pred_value)
        agreeing = 0
        for env in _sample_environments(names):
            try:
                gold_value, pred_value = self._evaluate(gold, env), self._evaluate(pred, env)
            except TooLarge:
                raise
            except Undecided:
                continue
            if not _close(gold_value, pred_value):
                return False
            agreeing += 1
        if agreeing < 2:
            msg = "too few evaluation points"
            raise Undecided(msg)
        return True

    def _proportional(self, gold: Node, pred: Node, *, positive: bool) -> bool:
        names = _symbols(pred, _symbols(gold, set()))
        ratios = []
        for env in _sample_environments(names) if names else [{}]:
            try:
                gold_value, pred_value = _to_mp(self._evaluate(gold, env)), _to_mp(self._evaluate(pred, env))
            except TooLarge:
                raise
            except Undecided:
                continue
            if pred_value == 0 or gold_value == 0:
                if not (pred_value == 0 and gold_value == 0):
                    return False
                continue
            ratios.append(gold_value / pred_value)
        if not ratios:
            msg = "too few evaluation points"
            raise Undecided(msg)
        first = ratios[0]
        if positive and (_MP.im(first) != 0 or _MP.re(first) <= 0):
            return False
        return all(_close(first, ratio) for ratio in ratios[1:])

    def _evaluate(self, node: Node, env: dict[str, Value]) -> Value:
        try:
            return _Evaluator(env, self.deadline)(node)
        except (ZeroDivisionError, ValueError, OverflowError, ArithmeticError) as error:
            msg = f"evaluation failed: {error}"
            raise Undecided(msg) from error


def _decimal_mismatch(gold: Node, pred: Node) -> bool:
    """A terminating decimal literal equals only the same exact value (no closeness for 12 vs 12.0001)."""
    return _decimal_literal(gold) is not None or _decimal_literal(pred) is not None


def _without_repeats(items: list[Node]) -> list[Node]:
    """A list of answers is a set: an answer written twice, character for character, counts once."""
    return list({repr(item): item for item in items}.values())


def _unwrap(node: Node) -> Node:
    while node[0] in ("list", "union") and len(node[1]) == 1:
        node = node[1][0]
    return node


_INFINITY: Node = ("const", "inf")


def _as_interval(node: Node) -> Node | None:
    """``x > 2`` as ``(2, \\infty)``, ``x \\le 3`` as ``(-\\infty, 3]``: a bound on one lone variable is an interval."""
    if node[0] != "rel" or node[1] == "\\ne":
        return None
    op, left, right = node[1], node[2], node[3]
    if right[0] == "sym" and left[0] != "sym":
        op, left, right = {"<": ">", ">": "<", "\\le": "\\ge", "\\ge": "\\le"}[op], right, left
    if left[0] != "sym" or _symbols(right, set()):
        return None
    closed = op in ("\\le", "\\ge")
    if op in ("<", "\\le"):
        return ("tuple", "(", "]" if closed else ")", [("neg", _INFINITY), right])
    return ("tuple", "[" if closed else "(", ")", [right, _INFINITY])


def _relations_as_intervals(node: Node) -> Node:
    """A relation, or a list of relations joined by "or", as an interval or a union of intervals (else unchanged)."""
    if node[0] == "rel":
        return _as_interval(node) or node
    if node[0] == "list" and all(item[0] == "rel" for item in node[1]):
        intervals = [_as_interval(item) for item in node[1]]
        if all(interval is not None for interval in intervals) and len(_symbols(node, set())) == 1:
            return ("union", intervals)  # "x < 0 or x > 1", all about the same variable
    return node


def _items(node: Node) -> list[Node]:
    return list(node[1])


def _difference(node: Node) -> Node:
    return ("add", [node[1], ("neg", node[2])])


def _oriented(node: Node) -> tuple[str, Node]:
    """Rewrite ``a > b`` as ``b < a`` so that relations compare as ``difference < 0``."""
    op, left, right = node[1], node[2], node[3]
    flips = {">": "<", "\\ge": "\\le"}
    if op in flips:
        op, left, right = flips[op], right, left
    return op, ("add", [left, ("neg", right)])
