"""Answer classes, each tested with generated variants: equivalent rewrites must agree, near-misses must not.

One test pair per class stated in docs/reward.md ("Equivalence"). The fast stages alone must decide every
equivalent rewrite here (``symbolic=False``), so these rules never depend on the symbolic worker or machine load.
"""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from r1_ascend.recipe.reward import compute_score, grade_answer

SETTINGS = settings(max_examples=60, deadline=None)
_INTS = st.integers(-60, 60)
_NONZERO = _INTS.filter(bool)
_LABELS = st.sampled_from(["x", "y", "k", "PQ", "|PQ|", "AB", "|AB|", "\\frac{AB}{CD}", "\\frac{BE}{EC}", "f(x)"])


def _same(gold: str, pred: str) -> bool:
    return grade_answer(gold, pred, symbolic=False)


def _latex(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


_VALUES = st.builds(Fraction, _INTS, st.integers(1, 9)).map(_latex)


def _linear(coefficients: dict[str, int]) -> str:
    """``3x - y + 2`` from {"x": 3, "y": -1, "": 2}; zero terms dropped, ``0`` when all vanish."""
    text = ""
    for name, value in coefficients.items():
        if value == 0:
            continue
        magnitude = "" if abs(value) == 1 and name else str(abs(value))
        sign = "-" if value < 0 else ("+" if text else "")
        text += f" {sign} {magnitude}{name}" if text else f"{'-' if value < 0 else ''}{magnitude}{name}"
    return text.strip() or "0"


# -- relations and equations as the answer ---------------------------------------------------------------


@SETTINGS
@given(label=_LABELS, value=_VALUES, relation=st.sampled_from(["=", "\\approx"]))
def test_a_named_value_equals_the_value(label: str, value: str, relation: str) -> None:
    assert _same(value, f"{label} {relation} {value}")
    assert _same(f"{label} = {value}", value)


@SETTINGS
@given(label=_LABELS, value=_INTS, delta=_NONZERO, relation=st.sampled_from(["=", "\\approx"]))
def test_a_named_value_never_equals_another_value(label: str, value: int, delta: int, relation: str) -> None:
    assert not _same(str(value), f"{label} {relation} {value + delta}")
    assert not _same(f"{label} = {value}", str(value + delta))


@SETTINGS
@given(a=_INTS, b=_NONZERO, c=_INTS, scale=_NONZERO, swap=st.booleans())
def test_a_line_equals_its_rearrangements(a: int, b: int, c: int, scale: int, swap: bool) -> None:
    # gold "a x + b y + c = 0"; prediction "y = ..." or a scaled equation with sides exchanged
    gold = f"{_linear({'x': a, 'y': b, '': c})} = 0"
    slope, intercept = Fraction(-a, b), Fraction(-c, b)
    solved = f"y = {_latex(slope)}x + {_latex(intercept)}"
    left, right = _linear({"x": scale * a, "": scale * c}), _linear({"y": -scale * b})
    scaled = f"{right} = {left}" if swap else f"{left} = {right}"
    assert _same(gold, solved)
    assert _same(solved, gold)
    assert _same(gold, scaled)


@SETTINGS
@given(a=_INTS, b=_NONZERO, c=_INTS, delta=_NONZERO)
def test_a_line_never_equals_a_shifted_line(a: int, b: int, c: int, delta: int) -> None:
    gold = f"{_linear({'x': a, 'y': b, '': c})} = 0"
    shifted = f"{_linear({'x': a, 'y': b, '': c + delta})} = 0"
    assert not _same(gold, shifted)
    assert not _same(gold, f"y = {_latex(Fraction(-a, b))}x + {_latex(Fraction(-c - delta, b))}")


# -- sets, tuples, lists -------------------------------------------------------------------------------


@SETTINGS
@given(values=st.lists(_INTS, min_size=2, max_size=5, unique=True), data=st.data())
def test_sets_lists_and_pairs(values: list[int], data: st.DataObject) -> None:
    shuffled = data.draw(st.permutations(values))
    joined, shuffled_joined = ", ".join(map(str, values)), ", ".join(map(str, shuffled))
    assert _same(f"\\{{{joined}\\}}", f"\\{{{shuffled_joined}\\}}")  # sets are unordered
    assert _same(joined, shuffled_joined)  # so are bare lists of answers
    assert _same(f"({joined})", f"\\{{{joined}\\}}")  # "both values" in the order given
    assert _same(f"({joined})", joined)
    if shuffled != values:
        assert not _same(f"({joined})", f"({shuffled_joined})")  # tuples are ordered
        assert not _same(f"({joined})", f"\\{{{shuffled_joined}\\}}")
    assert not _same(f"\\{{{joined}\\}}", f"\\{{{', '.join(map(str, values[:-1]))}\\}}")  # a missing element
    assert not _same(f"[{values[0]}, {values[1]}]", f"({values[0]}, {values[1]})")  # bracket kinds matter


@SETTINGS
@given(pairs=st.lists(st.tuples(_INTS, _INTS), min_size=2, max_size=4, unique=True), data=st.data())
def test_unordered_lists_of_tuples(pairs: list[tuple[int, int]], data: st.DataObject) -> None:
    text = ", ".join(f"({a}, {b})" for a, b in pairs)
    shuffled = data.draw(st.permutations(pairs))
    assert _same(text, ", ".join(f"({a},{b})" for a, b in shuffled))
    assert _same(text, f"\\{{{text}\\}}")
    changed = [*pairs[:-1], (pairs[-1][0], pairs[-1][1] + 1)]
    if changed[-1] not in pairs:
        assert not _same(text, ", ".join(f"({a}, {b})" for a, b in changed))


@SETTINGS
@given(a=st.integers(1, 60), b=_INTS, name=st.sampled_from(["", "x = ", "x=", "k = "]))
def test_plus_minus_is_two_answers(a: int, b: int, name: str) -> None:
    assert _same(f"\\{{{-a}, {a}\\}}", f"{name}\\pm {a}")
    assert _same(f"{a}, {-a}", f"{name}\\pm{a}")
    assert _same(f"{b + a}, {b - a}", f"{name}{b} \\pm {a}")
    assert not _same(str(a), f"\\pm {a}")  # one of two answers is not the answer
    assert not _same(f"\\{{{-a}, {a + 1}\\}}", f"\\pm {a}")


@SETTINGS
@given(
    values=st.lists(_INTS, min_size=2, max_size=3, unique=True),
    joiner=st.sampled_from([" or ", " and ", "\\text{ or }", "\\text{ and }", ", ", "\\quad\\text{or}\\quad "]),
    named=st.booleans(),
)
def test_alternatives_joined_by_words(values: list[int], joiner: str, named: bool) -> None:
    prediction = joiner.join(f"x = {v}" if named else str(v) for v in reversed(values))
    assert _same(", ".join(map(str, values)), prediction)
    assert not _same(str(values[0]), prediction)  # hedging between answers earns nothing
    assert not _same(", ".join(map(str, values)), joiner.join(str(v) for v in values[:-1]))


# -- number formatting ---------------------------------------------------------------------------------


def _grouped(number: int, separator: str) -> str:
    digits = f"{number:,}".split(",")
    return separator.join(digits)


@SETTINGS
@given(
    number=st.integers(1000, 10**12),
    separator=st.sampled_from([",", "{,}", ",\\!", ",\\! ", "\\,", "\\;", "\\ ", " ", "\\!"]),
    decimals=st.sampled_from(["", ".5", ".25"]),
)
def test_thousands_separators(number: int, separator: str, decimals: str) -> None:
    written = _grouped(number, separator) + decimals
    assert _same(f"{number}{decimals}", written)
    assert _same(written, f"{number}{decimals}")
    assert not _same(f"{number + 1}{decimals}", written)
    assert not _same(f"{number * 10}{decimals}", written)


@SETTINGS
@given(whole=st.integers(0, 999), fraction=st.integers(0, 99))
def test_a_comma_pair_is_not_a_decimal(whole: int, fraction: int) -> None:
    assert not _same(f"{whole}.{fraction}", f"{whole},{fraction}")
    assert not _same(f"{whole}.{fraction}", f"{whole}{{,}}{fraction}")
    assert _same(f"({whole}, {fraction})", f"{whole},{fraction}")


# -- repeated answers and malformed endings ------------------------------------------------------------


@SETTINGS
@given(answer=_VALUES, other=_VALUES, prose=st.sampled_from(["", " So the answer is {a}.", " Thus $x = {a}$."]))
def test_a_repeated_final_answer_is_not_a_conflict(answer: str, other: str, prose: str) -> None:
    tail = prose.format(a=answer)
    response = f"<think>x</think> \\boxed{{{answer}}}, then \\boxed{{{other}}}; finally \\boxed{{{answer}}}.{tail}"
    assert compute_score("t", response, answer, symbolic=False)["acc"] == 1.0
    if not _same(answer, other):
        earlier = f"<think>x</think> \\boxed{{{answer}}}, but then \\boxed{{{other}}}.{tail}"
        result = compute_score("t", earlier, answer, symbolic=False)
        assert result["acc"] == 0.0  # the last box is the answer
        assert result["fail_reason"] == "conflicting_boxes"


@SETTINGS
@given(answer=_VALUES, ending=st.sampled_from(["\\", "\\\\", " \\", "\\ ", ".\\"]), delta=_NONZERO)
def test_a_stray_trailing_backslash(answer: str, ending: str, delta: int) -> None:
    assert _same(answer, answer + ending)
    assert compute_score("t", f"</think>\\boxed{{{answer}{ending.strip()}}}", answer, symbolic=False)["acc"] == 1.0
    assert not _same(str(delta), f"{delta + 1}{ending}")


@SETTINGS
@given(a=_INTS, b=_INTS, variable=st.sampled_from(["x", "t", "a"]), flip=st.booleans())
def test_a_bound_on_one_variable_is_an_interval(a: int, b: int, variable: str, flip: bool) -> None:
    cases = {
        ">": f"({a}, \\infty)",
        "\\ge": f"[{a}, \\infty)",
        "<": f"(-\\infty, {a})",
        "\\le": f"(-\\infty, {a}]",
    }
    mirrored = {">": "<", "<": ">", "\\ge": "\\le", "\\le": "\\ge"}
    for op, interval in cases.items():
        relation = f"{a} {mirrored[op]} {variable}" if flip else f"{variable} {op} {a}"
        assert _same(interval, relation)
        assert _same(relation, interval)
        other = mirrored[op] if op in (">", "<") else {"\\ge": ">", "\\le": "<"}[op]  # wrong direction or bracket
        assert not _same(interval, f"{variable} {other} {a}")
        if a != b:
            assert not _same(interval, f"{variable} {op} {b}")
    low, high = sorted((a, b))
    if low != high:
        union = f"(-\\infty, {low}) \\cup [{high}, \\infty)"
        assert _same(union, f"{variable} < {low} \\text{{ or }} {variable} \\ge {high}")
        assert not _same(union, f"{variable} < {low} \\text{{ or }} {variable} > {high}")
        assert not _same(union, f"{variable} < {low} \\text{{ or }} z \\ge {high}")


@SETTINGS
@given(pairs=st.lists(st.tuples(_INTS, _INTS), min_size=2, max_size=4, unique=True), repeat=st.integers(0, 3))
def test_an_answer_written_twice_counts_once(pairs: list[tuple[int, int]], repeat: int) -> None:
    gold = ", ".join(f"({a}, {b})" for a, b in pairs)
    doubled = [*pairs, pairs[repeat % len(pairs)]]
    assert _same(gold, ", ".join(f"({a}, {b})" for a, b in doubled))
    assert not _same(", ".join(f"({a}, {b})" for a, b in doubled), gold)  # a repeated gold item must be repeated
    assert not _same(gold, ", ".join(f"({a}, {b})" for a, b in pairs[:-1]))


@SETTINGS
@given(numerator=st.integers(1, 500), denominator=st.sampled_from([3, 6, 7, 9, 11, 12, 13, 33, 37, 99]))
def test_a_repeating_decimal_is_its_fraction(numerator: int, denominator: int) -> None:
    value = Fraction(numerator, denominator)
    whole, remainder = divmod(value.numerator, value.denominator)
    digits, seen, position = "", {}, remainder
    while position and position not in seen:  # long division until the remainder repeats
        seen[position] = len(digits)
        position *= 10
        digits += str(position // value.denominator)
        position %= value.denominator
    if not position:
        return  # terminates: not a repeating decimal
    start = seen[position]
    written = f"{whole}.{digits[:start]}\\overline{{{digits[start:]}}}"
    assert _same(_latex(value), written)
    assert _same(written, _latex(value))
    assert not _same(_latex(value + Fraction(1, 10 ** (len(digits) + 1))), written)
    if len((str(whole) + digits).lstrip("0")) < 4:  # below the decimal rule's four significant digits
        assert not _same(f"{whole}.{digits}", written)  # the truncated decimal is not the repeating one


@SETTINGS
@given(
    name=st.sampled_from(
        ["\\overline{PQ}", "\\|PQ\\|", "|\\overrightarrow{AB}|", "\\vec{v}", "\\sin A", "\\cos\\theta"]
    ),
    value=_VALUES,
    delta=_NONZERO,
)
def test_decorated_names(name: str, value: str, delta: int) -> None:
    assert _same(value, f"{name} = {value}")
    assert not _same(value, f"{name} = {value} + {delta}")
