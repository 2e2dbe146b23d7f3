"""A small recursive-descent parser from a normalised answer to a tree of tuples.

It never calls ``eval``/``exec``/``sympy.parse_expr``: model text only ever becomes the plain tuples below, which
``compare`` evaluates with exact rationals or guarded mpmath arithmetic. Anything outside the supported dialect
raises ``ParseError`` and the caller falls back to the bounded symbolic stage.

Node shapes: ``("num", Fraction, literal)``, ``("sym", name)``, ``("const", "pi"|"inf")``, ``("add", [..])``,
``("mul", [..])``, ``("neg", x)``, ``("div", a, b)``, ``("pow", a, b)``, ``("fact", x)``, ``("func", name, x)``,
``("binom", n, k)``, ``("pm", a, b)``; containers ``("list", [..])`` (unordered answers),
``("tuple", open, close, [..])`` (ordered pair / interval), ``("set", [..])``, ``("union", [..])``; statements
``("eq", lhs, rhs)``, ``("named", label, value)`` (``x = 3``, ``|PQ| = 3``: a name on the left) and
``("rel", op, lhs, rhs)`` with op in ``<``, ``\\le``, ``>``, ``\\ge``, ``\\ne``.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from r1_ascend.recipe.reward.normalize import SET_CLOSE, SET_OPEN

Node = tuple[Any, ...]

MAX_ANSWER_CHARS = 1000
MAX_NESTING = 40
# Recursion depth of the parser (and so of the evaluator over its tree): unary signs, macro arguments without
# braces (\frac\frac..., \sqrt\sqrt...) and exponents nest without any bracket, so brackets alone do not bound it.
MAX_PARSE_DEPTH = 150  # about three per bracket level, so MAX_NESTING stays the binding limit for brackets

_FUNCTION_NAMES = "sin cos tan sec csc cot arcsin arccos arctan sinh cosh tanh ln log exp"
FUNCTIONS = frozenset(_FUNCTION_NAMES.split())
_RELATIONS = ("<", ">", "\\le", "\\ge", "\\ne", "=")
_TOKEN_RE = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d*)?|\.\d+)|(?P<cmd>\\[a-zA-Z]+)|(?P<word>[a-zA-Z]+)|(?P<op>[-+*/^!()\[\]{},;=<>|_'"
    + SET_OPEN
    + SET_CLOSE
    + r"]))"
)


class ParseError(ValueError):
    """The answer is outside the parser's dialect (the caller falls back to the symbolic stage)."""


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN_RE.match(text, position)
        if not match or match.end() == position:
            msg = f"unexpected character {text[position]!r} at {position}"
            raise ParseError(msg)
        position = match.end()
        kind = match.lastgroup or "op"
        value = match.group(kind)
        if kind == "word":
            # plain-text function names stay whole; other words are products of one-letter symbols
            if value in FUNCTIONS or value == "sqrt" or value == "pi":
                tokens.append(("cmd", "\\" + value))
            else:
                tokens.extend(("word", char) for char in value)
            continue
        tokens.append((kind, value))
    return tokens


def _nesting_depth(text: str) -> int:
    depth = deepest = 0
    for char in text:
        if char in "({[" + SET_OPEN:
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")}]" + SET_CLOSE:
            depth -= 1
    return deepest


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.index = 0
        self.depth = 0

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_PARSE_DEPTH:
            msg = f"answer nested deeper than {MAX_PARSE_DEPTH}"
            raise ParseError(msg)

    # -- token helpers --------------------------------------------------------------------------
    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def peek_value(self) -> str | None:
        token = self.peek()
        return token[1] if token else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            msg = "unexpected end of answer"
            raise ParseError(msg)
        self.index += 1
        return token

    def expect(self, value: str) -> None:
        token = self.take()
        if token[1] != value:
            msg = f"expected {value!r}, found {token[1]!r}"
            raise ParseError(msg)

    def at_end(self) -> bool:
        return self.index >= len(self.tokens)

    # -- statements -----------------------------------------------------------------------------
    def statement(self) -> Node:
        """expr (relop expr)*, with ``\\in`` and label stripping."""
        parts = [self.expr()]
        ops: list[str] = []
        while self.peek_value() in _RELATIONS or self.peek_value() == "\\in":
            ops.append(self.take()[1])
            parts.append(self.expr())
        if not ops:
            return parts[0]
        if ops == ["\\in"]:
            if not is_label(parts[0]):
                msg = "left side of \\in is not a variable"
                raise ParseError(msg)
            return parts[1]
        if all(op == "=" for op in ops):
            if len(ops) >= 2:
                return parts[-1]
            if is_label(parts[0]):
                return ("named", parts[0], parts[1])
            return ("eq", parts[0], parts[1])
        if len(ops) == 1 and ops[0] != "\\in":
            return ("rel", ops[0], parts[0], parts[1])
        if len(ops) == 2 and is_label(parts[1]):
            return _double_inequality(ops, parts)
        msg = f"unsupported relation chain {ops}"
        raise ParseError(msg)

    # -- expressions ----------------------------------------------------------------------------
    def expr(self) -> Node:
        node = self.term()
        terms = [node]
        while self.peek_value() in ("+", "-", "\\pm", "\\mp"):
            op = self.take()[1]
            right = self.term()
            if op == "+":
                terms.append(right)
            elif op == "-":
                terms.append(("neg", right))
            else:
                left = ("add", terms) if len(terms) > 1 else terms[0]
                terms = [("pm", left, right)]
        return ("add", terms) if len(terms) > 1 else terms[0]

    def term(self) -> Node:
        factors = [self.unary()]
        while True:
            value = self.peek_value()
            if value == "*":
                self.take()
                factors.append(self.unary())
            elif value == "/":
                self.take()
                factors = [("div", _product(factors), self.unary())]
            elif value is not None and self._starts_primary():
                factors.append(self.power())
            else:
                break
        return _product(factors)

    def _starts_primary(self) -> bool:
        token = self.peek()
        if token is None:
            return False
        kind, value = token
        if kind in ("num", "word"):
            return True
        if kind == "cmd":
            return value not in ("\\pm", "\\mp", "\\in", "\\cup", "\\le", "\\ge", "\\ne", "\\approx")
        return value in ("(", "[", "{", SET_OPEN)

    def unary(self) -> Node:
        self._enter()
        try:
            if self.peek_value() == "-":
                self.take()
                return ("neg", self.unary())
            if self.peek_value() == "+":
                self.take()
                return self.unary()
            if self.peek_value() in ("\\pm", "\\mp"):  # "\pm 3" is the two answers 3 and -3
                self.take()
                return ("pm", _number("0"), self.unary())
            return self.power()
        finally:
            self.depth -= 1

    def power(self) -> Node:
        self._enter()
        try:
            base = self.postfix()
            if self.peek_value() == "^":
                self.take()
                exponent = self.group_or_atom() if self.peek_value() == "{" else self.unary_exponent()
                return self.postfix_ops(("pow", base, exponent))
            return base
        finally:
            self.depth -= 1

    def unary_exponent(self) -> Node:
        if self.peek_value() == "-":
            self.take()
            return ("neg", self.postfix())
        return self.postfix()

    def postfix(self) -> Node:
        return self.postfix_ops(self.primary())

    def postfix_ops(self, node: Node) -> Node:
        while self.peek_value() in ("!", "'"):
            op = self.take()[1]
            node = ("fact", node) if op == "!" else ("sym", _label_name(node) + "'")
        return node

    def group_or_atom(self) -> Node:
        """A LaTeX macro argument: ``{...}`` or a single character (``\\frac12``)."""
        token = self.peek()
        if token is None:
            msg = "missing macro argument"
            raise ParseError(msg)
        if token[1] == "{":
            self.take()
            node = self.expr()
            self.expect("}")
            return node
        if token[0] == "num" and len(token[1]) > 1:
            self.tokens[self.index] = ("num", token[1][1:])
            return _number(token[1][0])
        return self.primary()

    def primary(self) -> Node:
        self._enter()
        try:
            return self._primary()
        finally:
            self.depth -= 1

    def _primary(self) -> Node:
        kind, value = self.take()
        if kind == "num":
            node = _number(value)
            if self.peek_value() == "\\frac" and "." not in value:
                return self._mixed_number(node)
            return node
        if kind == "word":
            return self.subscripted(("sym", value))
        if kind == "cmd":
            return self.command(value)
        if value in ("(", "["):
            return self.bracketed(value)
        if value == "{":
            node = self.expr()
            self.expect("}")
            return node
        if value == SET_OPEN:
            items = self.comma_items(SET_CLOSE)
            self.expect(SET_CLOSE)
            return ("set", items)
        if value == "|":
            node = self.expr()
            self.expect("|")
            return ("func", "abs", node)
        msg = f"unexpected token {value!r}"
        raise ParseError(msg)

    def _mixed_number(self, whole: Node) -> Node:
        start, saved = self.index, list(self.tokens)
        self.take()
        numerator, denominator = self.group_or_atom(), self.group_or_atom()
        if numerator[0] == "num" and denominator[0] == "num":
            return ("add", [whole, ("div", numerator, denominator)])
        self.index, self.tokens = start, saved  # "2\frac{x}{y}" is a product, not a mixed number
        return whole

    def subscripted(self, node: Node) -> Node:
        if self.peek_value() == "_":
            self.take()
            subscript = self.group_or_atom()
            node = ("sym", f"{_label_name(node)}_{_subscript_name(subscript)}")
        return node

    def bracketed(self, opener: str) -> Node:
        items = self.comma_items(")", "]")
        closer = self.take()[1]
        if closer not in (")", "]"):
            msg = f"unbalanced {opener}"
            raise ParseError(msg)
        if len(items) == 1 and opener == "(" and closer == ")":
            return items[0]
        if len(items) == 1:
            msg = "single-element bracket"
            raise ParseError(msg)
        return ("tuple", opener, closer, items)

    def comma_items(self, *closers: str) -> list[Node]:
        items = [self.statement()]
        while self.peek_value() == ",":
            self.take()
            items.append(self.statement())
        if self.peek_value() not in closers:
            msg = f"expected one of {closers}, found {self.peek_value()!r}"
            raise ParseError(msg)
        return items

    def command(self, name: str) -> Node:
        if name == "\\frac":
            return ("div", self.group_or_atom(), self.group_or_atom())
        if name == "\\binom":
            return ("binom", self.group_or_atom(), self.group_or_atom())
        if name == "\\sqrt":
            if self.peek_value() == "[":
                self.take()
                index = self.expr()
                self.expect("]")
                return ("pow", self.group_or_atom(), ("div", _number("1"), index))
            return ("func", "sqrt", self.group_or_atom())
        if name == "\\pi":
            return ("const", "pi")
        if name == "\\infty":
            return ("const", "inf")
        if name[1:] in FUNCTIONS:
            return self.function(name[1:])
        if name in ("\\alpha", "\\beta", "\\gamma", "\\theta", "\\lambda", "\\mu", "\\phi", "\\omega", "\\varphi"):
            return self.subscripted(("sym", name))
        if self.peek_value() not in ("{", "[", "_", "^"):
            return self.subscripted(("sym", name))  # an argument-less unknown macro (\ell, \hbar) names a symbol
        msg = f"unsupported command {name}"
        raise ParseError(msg)

    def function(self, name: str) -> Node:
        exponent = None
        if self.peek_value() == "^":
            self.take()
            exponent = self.group_or_atom()
        if name == "log" and self.peek_value() == "_":
            msg = "logarithm with a base"
            raise ParseError(msg)
        if self.peek_value() in ("(", "{"):
            opener = self.take()[1]
            argument = self.expr()
            self.expect(")" if opener == "(" else "}")
        else:
            argument = self.power()
        node: Node = ("func", name, argument)
        return ("pow", node, exponent) if exponent is not None else node


def _double_inequality(ops: list[str], parts: list[Node]) -> Node:
    left_ops, right_ops = {"<": "(", "\\le": "["}, {"<": ")", "\\le": "]"}
    if ops[0] in left_ops and ops[1] in right_ops:
        return ("tuple", left_ops[ops[0]], right_ops[ops[1]], [parts[0], parts[2]])
    flipped = {">": "<", "\\ge": "\\le"}
    if ops[0] in flipped and ops[1] in flipped:
        low, high = parts[2], parts[0]
        return ("tuple", left_ops[flipped[ops[1]]], right_ops[flipped[ops[0]]], [low, high])
    msg = f"mixed-direction inequality {ops}"
    raise ParseError(msg)


def _number(literal: str) -> Node:
    return ("num", Fraction(literal), literal)


def _product(factors: list[Node]) -> Node:
    return ("mul", factors) if len(factors) > 1 else factors[0]


def _label_name(node: Node) -> str:
    if node[0] == "sym":
        return node[1]
    if node[0] == "num":
        return node[2]
    msg = "subscript or prime on a non-symbol"
    raise ParseError(msg)


def _subscript_name(node: Node) -> str:
    if node[0] in ("sym", "num"):
        return _label_name(node)
    if node[0] == "mul" and all(part[0] in ("sym", "num") for part in node[1]):
        return "".join(_label_name(part) for part in node[1])
    if node[0] == "add":
        return "+".join(_subscript_name(part) for part in node[1])
    if node[0] == "neg":
        return "-" + _subscript_name(node[1])
    msg = "complex subscript"
    raise ParseError(msg)


def is_label(node: Node) -> bool:
    """Left sides that name the answer rather than constrain it.

    ``x``, ``x_1``, ``f(x)``, ``AB``, ``(p,q)``, a length ``|PQ|``, ``\\sin A`` and a ratio of names
    ``\\frac{AB}{CD}``.
    """
    if node[0] == "sym":
        return True
    if node[0] == "mul":  # f(x) parses as f*x; "AB" as A*B
        return all(part[0] == "sym" for part in node[1])
    if node[0] == "tuple":
        return all(part[0] == "sym" for part in node[3])
    if node[0] == "func":  # |PQ|, \\sin A, \\cos\\theta: a function of a name names a value
        return is_label(node[2]) and node[2][0] != "tuple"
    if node[0] == "div":
        return all(is_label(part) and part[0] != "tuple" for part in node[1:])
    return False


def _split_top_level(text: str, separator: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "({[" + SET_OPEN:
            depth += 1
        elif char in ")}]" + SET_CLOSE:
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def _names_only(text: str) -> bool:
    try:
        parser = _Parser(_tokenize(text))
        node = parser.statement()
    except (ParseError, RecursionError):
        return False
    return parser.at_end() and is_label(node)


def _parse_statement_text(text: str) -> Node:
    text = text.strip()
    if "\\approx" in text:
        # "x = 1/3 \approx 0.33": the exact value before it counts; "y \approx 7": a name, so the value after it
        head, tail = (part.strip() for part in text.split("\\approx", 1))
        head = head.rstrip("=").strip()
        text = tail.split("\\approx", 1)[0] if not head or _names_only(head) else head
    text = re.sub(r"^[A-Za-z]\s*:\s*[A-Za-z]\s*=", "", text)  # "A:B=1" names a ratio
    if not text:
        msg = "empty answer element"
        raise ParseError(msg)
    if "\\cup" in text:
        return ("union", [_parse_statement_text(part) for part in text.split("\\cup")])
    parser = _Parser(_tokenize(text))
    node = parser.statement()
    if not parser.at_end():
        msg = f"trailing input at token {parser.peek_value()!r}"
        raise ParseError(msg)
    return node


def parse_answer(text: str) -> Node:
    """Parse one normalised answer (possibly a comma list of answers) into a node tree."""
    if len(text) > MAX_ANSWER_CHARS:
        msg = f"answer longer than {MAX_ANSWER_CHARS} characters"
        raise ParseError(msg)
    if _nesting_depth(text) > MAX_NESTING:
        msg = f"answer nested deeper than {MAX_NESTING}"
        raise ParseError(msg)
    if not text.strip():
        msg = "empty answer"
        raise ParseError(msg)
    groups = [group for group in _split_top_level(text, ";") if group.strip()]
    if len(groups) > 1:
        return ("list", [_assignment_tuple(group) for group in groups])
    items = [_parse_statement_text(part) for part in _split_top_level(text, ",")]
    expanded = [variant for item in items for variant in expand_plus_minus(item)]
    return expanded[0] if len(expanded) == 1 else ("list", expanded)


def _assignment_tuple(group: str) -> Node:
    items = [_parse_statement_text(part) for part in _split_top_level(group, ",")]
    return items[0] if len(items) == 1 else ("tuple", "(", ")", items)


def expand_plus_minus(node: Node) -> list[Node]:
    """``a \\pm b`` as an answer means the two answers ``a+b`` and ``a-b``."""
    if node[0] == "pm":
        return [("add", [node[1], node[2]]), ("add", [node[1], ("neg", node[2])])]
    if node[0] == "named":
        return [("named", node[1], variant) for variant in expand_plus_minus(node[2])]
    if node[0] == "div" and node[1][0] == "pm":
        return [("div", variant, node[2]) for variant in expand_plus_minus(node[1])]
    return [node]
