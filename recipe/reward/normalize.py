"""String normalisation of a final answer: the cheap first stage of the equivalence check.

Everything here is linear-time regex/str work on the (length-capped) answer. It removes notation that never changes
the value (``$``, ``\\left``, ``\\dfrac``, spacing commands, ``^\\circ``, ``\\%``, units in ``\\text{ ...}``,
thousands separators) so that most correct answers compare equal as strings and the parser sees one dialect.

Percent handling is deliberately a plain deletion: ``50\\%`` equals ``50`` (the sign is notation), but ``50`` never
equals ``0.5`` — no ``x100`` / ``/100`` leniency anywhere.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

# Internal markers for LaTeX set braces ``\{ \}`` so that they survive the removal of grouping braces.
SET_OPEN = "\u2983"  # ⦃
SET_CLOSE = "\u2984"  # ⦄

_TEXT_COMMANDS = ("text", "textbf", "textit", "textnormal", "textrm", "textsf", "texttt", "mbox", "mathrm", "mathbf")
_TEXT_COMMANDS += ("mathit", "mathsf", "mathtt", "mathbb", "mathcal", "operatorname", "rm", "bf", "displaystyle")
_TEXT_RE = re.compile(r"\\(?:" + "|".join(_TEXT_COMMANDS) + r")\s*\{([^{}]*)\}")
_TEXT_WORD_CONNECTORS = re.compile(
    r"\\text\{\s*(?:and|or|,)\s*\}|\s+(?:and|or)\s+|,\s*(?:and|or)\s+|(?<=[)\]])\s*(?:and|or)\s*(?=[(\[])"
)  # "x = 1 or x = 2", "(1,2) and (3,4)", "(11,7)or(7,11)"
# A number followed by a \text group that starts with a space is a unit: "125\text{ miles}". The unit's exponent
# goes with it ("25\text{ cm}^2" is 25, not 25^2); a group holding a digit, or followed by one, is not a unit
# ("2\text{ (or 3)}", "2\text{ dozen}0").
_UNIT_TEXT_RE = re.compile(
    r"(\d|\})\s*\\(?:text|textnormal|textrm|mbox|mathrm)\s*\{\s[^{}\d]*\}(?:\s*\^\s*(?:\{\s*\d\s*\}|\d))?(?!\s*\d)"
)
_SPACING_RE = re.compile(r"\\(?:[,:;! ]|quad|qquad|enspace|thinspace|medspace|thickspace)|~")
_LEFT_RIGHT_RE = re.compile(
    r"\\(?:left|right|big|Big|bigg|Bigg)(?![a-zA-Z])\s*(\\[{}|]|[()\[\].|]|\\?langle|\\?rangle)?"
)
_DEGREE_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|\\degree|°|\^\s*\{\s*o\s*\}")
_PERCENT_RE = re.compile(r"\\?%|\s*\b(?:percent|pct)\b")
_DOLLAR_RE = re.compile(r"\\\$|\$|\\(?:\(|\)|\[|\])")
_FRAC_ALIAS_RE = re.compile(r"\\[dtc]frac(?![a-zA-Z])")
_BINOM_ALIAS_RE = re.compile(r"\\[dt]binom(?![a-zA-Z])")
_RELATION_ALIAS = (
    (re.compile(r"\\leqslant|\\leq|\\le(?![a-zA-Z])|<=|≤"), r"\\le "),
    (re.compile(r"\\geqslant|\\geq|\\ge(?![a-zA-Z])|>=|≥"), r"\\ge "),
    (re.compile(r"\\neq|\\ne(?![a-zA-Z])|!=|≠"), r"\\ne "),
    (re.compile(r"\\lt(?![a-zA-Z])"), "<"),
    (re.compile(r"\\gt(?![a-zA-Z])"), ">"),
)
_THOUSANDS_BRACE_RE = re.compile(r"(\d)\{,\}(?=\d{3})")
# Digit groups joined by a LaTeX thousands separator (``12,\!345``, ``12{,}345``, ``12\,345``, ``12\;345``):
# these spellings only ever group digits, so they are removed anywhere in the answer. A plain comma is not in the
# list (``1,234`` may be a pair), and neither is ``,\,`` (a comma followed by a thin space separates items).
_LATEX_THOUSANDS_SEP = r"(?:,\\!|\{,\}|\\[,;:! ]|\\thinspace|~)[ \t]*"
_LATEX_THOUSANDS_RE = re.compile(r"(?<![\d.])\d{1,3}(?:" + _LATEX_THOUSANDS_SEP + r"\d{3})+(?!\d)")
_LATEX_THOUSANDS_SEP_RE = re.compile(_LATEX_THOUSANDS_SEP)
_THOUSANDS_WHOLE_RE = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_THOUSANDS_SPACE_RE = re.compile(r"[+-]?\d{1,3}(?: \d{3})+(?:\.\d+)?")
_TRAILING_UNIT_WORDS_RE = re.compile(r"^(.*?[\d}])\s+[a-zA-Z]{2,}(?: [a-zA-Z]+)*\.?$")
_DOUBLE_BACKSLASH_CMD_RE = re.compile(r"\\\\(?=[a-zA-Z])")
_BOXED_WRAPPER_RE = re.compile(r"^\\(?:boxed|fbox)\s*\{(.*)\}$", re.DOTALL)
_WS_RE = re.compile(r"\s+")
# Decorations of a name that do not change what it names: a segment \overline{PQ}, a vector \vec{AB}. Digits are
# excluded: \overline{3} in 0.\overline{3} marks a repeating decimal.
_REPEATING_DECIMAL_RE = re.compile(r"(\d*)\.(\d*)\\overline\s*\{\s*(\d{1,30})\s*\}")
_NAME_DECORATION_RE = re.compile(r"\\(?:overline|overrightarrow|vec|widehat|hat|mathbf)\s*\{\s*([A-Za-z]{1,4})\s*\}")
_NORM_BARS_RE = re.compile(r"\\\||\\[lr]Vert(?![a-zA-Z])|\\Vert(?![a-zA-Z])")


def _unwrap_text_groups(text: str) -> str:
    for _ in range(4):  # nested \text{\textbf{A}}; bounded, each pass is linear
        new = _TEXT_RE.sub(r"\1", text)
        if new == text:
            break
        text = new
    return text


def _strip_outer_group_braces(text: str) -> str:
    """``{1,2,3}`` written without backslashes is a group, not a set."""
    while text.startswith("{") and text.endswith("}") and _matching_close(text, 0) == len(text) - 1:
        text = text[1:-1].strip()
    return text


def _matching_close(text: str, open_index: int) -> int:
    depth = 0
    for index in range(open_index, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index
    return -1


def _repeating_decimal(match: re.Match[str]) -> str:
    """``0.1\\overline{6}`` is the exact fraction 1/6: whole part, fixed digits, then the repeating block."""
    whole, fixed, block = match.group(1) or "0", match.group(2), match.group(3)
    value = Fraction(int(whole)) + Fraction(int(fixed or "0"), 10 ** len(fixed))
    value += Fraction(int(block), (10 ** len(block) - 1) * 10 ** len(fixed))
    return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


@functools.lru_cache(maxsize=8192)
def normalize_answer(answer: str) -> str:
    """Canonical spelling of one answer string (no semantic change beyond the documented notation rules)."""
    text = answer.strip()
    text = _DOUBLE_BACKSLASH_CMD_RE.sub(r"\\", text)
    for _ in range(3):
        match = _BOXED_WRAPPER_RE.match(text)
        if not match or _matching_close(text, text.index("{")) != len(text) - 1:
            break
        text = match.group(1).strip()
    text = _DOLLAR_RE.sub(" ", text)
    text = _LATEX_THOUSANDS_RE.sub(lambda match: _LATEX_THOUSANDS_SEP_RE.sub("", match.group()), text)
    text = _TEXT_WORD_CONNECTORS.sub(",", text)
    text = _UNIT_TEXT_RE.sub(r"\1", text)
    text = _unwrap_text_groups(text)
    text = _REPEATING_DECIMAL_RE.sub(_repeating_decimal, text)
    text = _NAME_DECORATION_RE.sub(r"\1", text)
    text = _NORM_BARS_RE.sub("|", text)
    text = _SPACING_RE.sub(" ", text)
    text = _LEFT_RIGHT_RE.sub(lambda m: m.group(1) or "", text)
    text = _FRAC_ALIAS_RE.sub(r"\\frac", text)
    text = _BINOM_ALIAS_RE.sub(r"\\binom", text)
    text = _DEGREE_RE.sub("", text)
    text = _PERCENT_RE.sub("", text)
    for pattern, replacement in _RELATION_ALIAS:
        text = pattern.sub(replacement, text)
    text = text.replace("\\{", SET_OPEN).replace("\\}", SET_CLOSE)
    text = text.replace("\\cdot", "*").replace("\\times", "*").replace("\\div", "/").replace("−", "-")
    text = _THOUSANDS_BRACE_RE.sub(r"\1", text)
    text = _WS_RE.sub(" ", text).strip()
    text = text.rstrip(".\\ ").lstrip()
    text = _strip_outer_group_braces(text)
    if _THOUSANDS_WHOLE_RE.fullmatch(text) or _THOUSANDS_SPACE_RE.fullmatch(text):
        text = text.replace(",", "").replace(" ", "")
    unit = _TRAILING_UNIT_WORDS_RE.match(text)
    if unit and "\\" not in text[unit.end(1) :]:
        text = unit.group(1)
    return text.strip()


def compact(text: str) -> str:
    """Whitespace-free form used for the string-equality shortcut."""
    return _WS_RE.sub("", text)
