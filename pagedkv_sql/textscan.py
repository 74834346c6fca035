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
MAX_LINE = 1 << 20  # bytes; a fact line holds a few integers, so a longer one is an error
CHUNK = 1 << 22  # bytes read at a time (here, and by sources.preflight): 4 MiB


class LongLine(bytes):
    """Stands for a line longer than MAX_LINE, which is not kept: its length in bytes."""

    length: int

    @classmethod
    def of(cls, length: int) -> LongLine:
        line = cls()
        line.length = length
        return line


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Physical lines with their 1-based numbers: LF, CRLF and CR all end a line. A line
    longer than MAX_LINE comes as a LongLine: memory stays bounded whatever the file."""
    number = 0
    rest = b""
    long: int | None = None  # length so far of an over-long line being skipped
    skip_lf = False  # an over-long line ended with a CR at the end of a chunk
    first = True
    with path.open("rb") as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                break
            if first:
                first = False
                if chunk.startswith(b"\xef\xbb\xbf"):
                    chunk = chunk[3:]
            if skip_lf:
                skip_lf = False
                if chunk.startswith(b"\n"):
                    chunk = chunk[1:]
            if long is not None:
                end = _NEWLINE.search(chunk)
                if end is None:
                    long += len(chunk)
                    continue
                number += 1
                yield number, LongLine.of(long + end.start())
                long = None
                skip_lf = end.group() == b"\r" and end.end() == len(chunk)
                chunk = chunk[end.end() :]
            data = rest + chunk
            carry = b""
            if data.endswith(b"\r"):
                # maybe the first half of a CRLF: keep it for the next chunk
                data, carry = data[:-1], b"\r"
            parts = _NEWLINE.split(data)
            rest = parts.pop() + carry
            for part in parts:
                number += 1
                yield number, part if len(part) <= MAX_LINE else LongLine.of(len(part))
            if len(rest) > MAX_LINE:
                if carry:  # the line ended with a CR: complete
                    number += 1
                    yield number, LongLine.of(len(rest) - 1)
                    skip_lf = True
                else:
                    long = len(rest)
                rest = b""
    if long is not None:
        number += 1
        yield number, LongLine.of(long)
    elif rest:
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
        if isinstance(raw, LongLine):
            yield number, Problem(label, number, None, long_line(raw.length))
            continue
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


def long_line(length: int) -> str:
    return (
        f"a line of {length:,} bytes, longer than any fact line can be "
        f"(at most {MAX_LINE:,} bytes are read a line)"
    )


def read_header(path: Path, delimiter: str, quoted: bool) -> list[str]:
    """The fields of the first non-empty line."""
    for _, raw in _lines(path):
        if isinstance(raw, LongLine):
            return [f"<{long_line(raw.length)}>"]
        if raw:
            try:
                return _split(raw.decode("utf-8", errors="replace"), delimiter, quoted)
            except csv.Error:
                return [raw.decode("utf-8", errors="replace")]
    return []
