"""Stream rows out of a JSON array file or a JSON Lines file without holding the file text in memory.

A JSON array is decoded one element at a time from a sliding buffer, so only the parsed rows (kept by the
caller) and a bounded window of text are in memory. A file named ``*.jsonl`` (``.ndjson``, ``.jsonlines``) is
JSON Lines; otherwise the first non-whitespace character decides: ``[`` means a JSON array, anything else JSON
Lines. Files are read as UTF-8 (a BOM is allowed); undecodable bytes become lone surrogates and the row holding
them is later rejected as ``invalid_unicode``.

Positions are 1-based line and column and a 0-based character offset from the start of the file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TextIO

CHUNK_CHARS = 1 << 20
# A decode error with this much text buffered after the element start is a real syntax error, not truncation.
MAX_ELEMENT_CHARS = 64 << 20
# A number is complete once this many characters after it are buffered (".d" fraction, "e+d" exponent).
_NUMBER_LOOKAHEAD = 4
_WHITESPACE = re.compile(r"[ \t\n\r]*")


class InputFormatError(ValueError):
    """The file as a whole cannot be read as a JSON array or JSON Lines (nothing after this point is usable)."""


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One row as found in the file: its parsed value, or the syntax error of its JSON Lines line."""

    input_row: int  # 0-based: array element number / non-blank line number
    line: int
    column: int
    offset: int
    value: Any = None
    error: str | None = None  # JSON syntax error (JSON Lines only), position in line/column/offset
    raw_text: str | None = None  # the offending line for a syntax error


JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonlines")


def detect_format(path: Path) -> str:
    """``"jsonl"`` for a ``.jsonl``/``.ndjson``/``.jsonlines`` name; else ``"json"`` if the text starts with ``[``."""
    if path.suffix.lower() in JSONL_SUFFIXES:
        return "jsonl"
    with _open(path) as fh:
        while chunk := fh.read(65536):
            stripped = chunk.lstrip(" \t\n\r")
            if stripped:
                return "json" if stripped[0] == "[" else "jsonl"
    return "jsonl"


def read_records(path: Path) -> Iterator[RawRecord]:
    """Yield every row of ``path`` in file order; raise :class:`InputFormatError` for a broken file structure."""
    if detect_format(path) == "json":
        with _open(path) as fh:
            yield from _ArrayReader(fh, path).records()
    else:
        with _open(path) as fh:
            yield from _jsonl_records(fh, path)


def _open(path: Path) -> TextIO:
    return path.open(encoding="utf-8-sig", errors="surrogateescape", newline="")


def _jsonl_records(fh: TextIO, path: Path) -> Iterator[RawRecord]:
    row = 0
    offset = 0
    for lineno, line in enumerate(fh, start=1):
        if not line.strip():
            offset += len(line)
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            if row == 0 and line.strip() == "{":
                msg = (
                    f"{path}: line {lineno} holds only '{{': this looks like one pretty-printed JSON object. "
                    "Expected a JSON array of row objects ('[{...}, {...}]') or JSON Lines (one object per line)."
                )
                raise InputFormatError(msg) from exc
            text = line.rstrip("\r\n")
            column = min(exc.pos, len(text)) + 1
            yield RawRecord(row, lineno, column, offset + column - 1, error=exc.msg, raw_text=text)
        else:
            col = len(line) - len(line.lstrip()) + 1
            yield RawRecord(row, lineno, col, offset + col - 1, value=value)
        row += 1
        offset += len(line)


class _ArrayReader:
    """Incremental decoder for ``[v, v, ...]`` over a text stream (one element in memory at a time)."""

    def __init__(self, fh: TextIO, path: Path) -> None:
        self._fh = fh
        self._path = path
        self._decoder = json.JSONDecoder()
        self._buf = ""
        self._base = 0  # absolute offset of _buf[0]
        self._eof = False
        self._mark = 0  # buffer position whose line number is known
        self._mark_line = 1
        self._line_start = 0  # absolute offset where the line containing _mark starts

    def records(self) -> Iterator[RawRecord]:
        pos = self._skip_ws(0)
        if pos >= len(self._buf) or self._buf[pos] != "[":
            self._fail(pos, "expected '[' to start a JSON array")
        pos += 1
        row = 0
        while True:
            pos = self._skip_ws(pos)
            if pos >= len(self._buf):
                self._fail(pos, f"the array is not closed: expected ',' or ']' after element {row - 1}")
            char = self._buf[pos]
            if char == "]":
                self._expect_end(pos + 1)
                return
            if row > 0:
                if char != ",":
                    self._fail(pos, f"expected ',' or ']' after element {row - 1}, found {char!r}")
                pos = self._skip_ws(pos + 1)
                if pos >= len(self._buf) or self._buf[pos] == "]":
                    self._fail(pos, f"expected element {row} after ',' (JSON allows no trailing comma)")
            pos = self._advance_and_trim(pos)
            line, column, offset = self._position(pos)
            value, pos = self._decode(pos, row)
            yield RawRecord(row, line, column, offset, value=value)
            row += 1

    def _fill(self) -> bool:
        if self._eof:
            return False
        chunk = self._fh.read(CHUNK_CHARS)
        if not chunk:
            self._eof = True
            return False
        self._buf += chunk
        return True

    def _skip_ws(self, pos: int) -> int:
        while True:
            match = _WHITESPACE.match(self._buf, pos)
            pos = match.end() if match else pos
            if pos < len(self._buf) or not self._fill():
                return pos

    def _decode(self, pos: int, row: int) -> tuple[Any, int]:
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, pos)
            except json.JSONDecodeError as exc:
                if len(self._buf) - pos < MAX_ELEMENT_CHARS and self._fill():
                    continue
                self._fail(exc.pos, f"element {row} is not valid JSON: {exc.msg}")
            if len(self._buf) - end < _NUMBER_LOOKAHEAD and self._fill():
                continue  # a number may go on in the next chunk ("1" | "2", "0" | ".5", "1" | "e5")
            return value, end

    def _advance_and_trim(self, pos: int) -> int:
        """Move the line bookkeeping to ``pos``; drop consumed text once it exceeds one chunk."""
        newlines = self._buf.count("\n", self._mark, pos)
        if newlines:
            self._mark_line += newlines
            self._line_start = self._base + self._buf.rindex("\n", self._mark, pos) + 1
        self._mark = pos
        if pos > CHUNK_CHARS:
            self._buf = self._buf[pos:]
            self._base += pos
            self._mark = 0
            pos = 0
        return pos

    def _position(self, pos: int) -> tuple[int, int, int]:
        line = self._mark_line + self._buf.count("\n", self._mark, pos)
        last_newline = self._buf.rfind("\n", self._mark, pos)
        line_start = self._base + last_newline + 1 if last_newline >= 0 else self._line_start
        offset = self._base + pos
        return line, offset - line_start + 1, offset

    def _expect_end(self, pos: int) -> None:
        pos = self._skip_ws(pos)
        if pos < len(self._buf):
            what = "unexpected data after the closing ']' of the array (JSON Lines files must be named *.jsonl)"
            self._fail(pos, what)

    def _fail(self, pos: int, what: str) -> NoReturn:
        line, column, offset = self._position(max(pos, self._mark))
        msg = (
            f"{self._path}: line {line}, column {column} (character offset {offset}): {what}. "
            "A JSON array cannot be read past a syntax error, so no rows were written; fix the file "
            "(or convert it to JSON Lines, where a broken line is rejected on its own)."
        )
        raise InputFormatError(msg)
