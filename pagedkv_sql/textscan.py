"""A line-by-line reader of delimited text, used where DuckDB's bulk reader said no.

The bulk path (DuckDB ``read_csv`` plus a strict cast) loads good files at full speed but
cannot say which line is wrong. When it refuses a file, this reader walks the file once
and names every malformed line (file:line:column and the text found), and it finds the
lines that hold the rows a constraint refused.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path

from .errors import Problem
from .numbers import NumberSyntaxError, parse_number

_NEWLINE = re.compile(rb"\r\n|\r|\n")


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Physical lines with their 1-based numbers: LF, CRLF and CR all end a line."""
    number = 0
    rest = b""
    with path.open("rb") as f:
        while True:
            chunk = f.read(1 << 22)
            if not chunk:
                break
            if number == 0 and not rest and chunk.startswith(b"\xef\xbb\xbf"):
                chunk = chunk[3:]
            data = rest + chunk
            carry = b""
            if data.endswith(b"\r"):
                # maybe the first half of a CRLF: keep it for the next chunk
                data, carry = data[:-1], b"\r"
            parts = _NEWLINE.split(data)
            rest = parts.pop() + carry
            for part in parts:
                number += 1
                yield number, part
    if rest:
        for part in _NEWLINE.split(rest):
            number += 1
            if part or number == 1:
                yield number, part


def scan(
    path: Path, label: str, columns: tuple[str, ...], delimiter: str, header: bool, quoted: bool
) -> Iterator[tuple[int, tuple[int, ...] | Problem]]:
    """Yield (line, row) for every fact line, or (line, Problem) for a malformed one.
    Empty lines are skipped, as DuckDB's reader skips them."""
    arity = len(columns)
    for number, raw in _lines(path):
        if not raw:
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            yield (
                number,
                Problem(label, number, e.start + 1, "not UTF-8 text; save the file as UTF-8"),
            )
            continue
        try:
            fields = _split(text, delimiter, quoted)
        except csv.Error as e:
            yield number, Problem(label, number, None, f"malformed CSV: {e}")
            continue
        if header:
            header = False
            continue  # the header was checked before the load
        if len(fields) != arity:
            yield (
                number,
                Problem(
                    label,
                    number,
                    None,
                    f"{len(fields)} field(s), expected {arity} ({', '.join(columns)}) "
                    f"separated by {'a tab' if delimiter == chr(9) else repr(delimiter)}",
                ),
            )
            continue
        values: list[int] = []
        column = 1
        bad: Problem | None = None
        for i, field in enumerate(fields):
            try:
                values.append(parse_number(field))
            except NumberSyntaxError as e:
                # in quoted CSV a field's column is not its offset: say only the line
                where = None if quoted else column
                bad = Problem(label, number, where, f"{columns[i]}: {e}")
                break
            column += len(field) + 1
        yield number, (bad if bad is not None else tuple(values))


def _split(text: str, delimiter: str, quoted: bool) -> list[str]:
    if quoted:
        return next(csv.reader([text], delimiter=delimiter, strict=True), [])
    return text.split(delimiter)


def read_header(path: Path, delimiter: str, quoted: bool) -> list[str]:
    """The fields of the first non-empty line."""
    for _, raw in _lines(path):
        if raw:
            try:
                return _split(raw.decode("utf-8", errors="replace"), delimiter, quoted)
            except csv.Error:
                return [raw.decode("utf-8", errors="replace")]
    return []
