"""A JSON Lines step log read line by line (docs/replay.md): each line decoded strictly as
UTF-8 and parsed strictly as JSON, the header and the steps through the builder, up to a
recorder's mark (or a last line cut off while written, read as one), every bad line named
when the log is refused (all or nothing)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pyarrow as pa

from ..arguments import argument
from ..errors import InputError, Problem
from ..limits import DuplicateKey, loads_strict
from .builder import Builder
from .header import (
    HEADER_KEY,
    MAX_PROBLEMS,
    Header,
    LogLineError,
    header_from,
    replayable,
    version_of,
)
from .marks import Mark, is_mark, mark_from, with_mark


def parse_line(text: str) -> Any:
    """One JSON line, strictly (``limits.loads_strict``): a duplicate key (JSON would keep
    the last, silently dropping the first), nesting too deep to read and numbers of more
    than 4300 digits are each a LogLineError, as malformed JSON is."""
    try:
        return loads_strict(text)
    except DuplicateKey as e:
        raise LogLineError(
            f"duplicate key '{e}' in one object (JSON would keep only the last one)"
        ) from None
    except json.JSONDecodeError as e:
        error = LogLineError(f"malformed JSON: {e.msg}")
        error.column = e.colno
        raise error from None
    except RecursionError:
        raise LogLineError("nested too deeply to read") from None
    except ValueError:  # Python's limit on the digits of an integer
        raise LogLineError(
            "a number has more than 4300 digits (no step, id or count is that long)"
        ) from None


def _lines(lines: Iterable[str | bytes]) -> Iterator[tuple[int, str | LogLineError]]:
    """(line number, text) of each line, decoded strictly as UTF-8 (a byte that is not
    UTF-8 is an error of its line, never replaced: two ids differing in it would merge),
    a BOM at the start dropped, and CR, LF and CRLF each ending a line, as in fact files."""
    number = 0
    for raw in lines:
        for piece in _pieces(raw):
            number += 1
            if isinstance(piece, bytes):
                try:
                    text = piece.decode("utf-8")
                except UnicodeDecodeError as e:
                    error = LogLineError(
                        f"not UTF-8 (byte 0x{piece[e.start]:02x} at column {e.start + 1})"
                    )
                    # a character cut at the line's end: a line cut off while written
                    error.cut = e.end == len(piece) and e.reason == "unexpected end of data"
                    yield number, error
                    continue
            else:
                text = piece
            yield number, text.removeprefix("\ufeff") if number == 1 else text


def _pieces(raw: str | bytes) -> list[str] | list[bytes]:
    """One line read up to LF, cut at each CR (a CR-only file reads as one such line)."""
    if isinstance(raw, bytes):
        body = raw.rstrip(b"\n")
        body = body[:-1] if body.endswith(b"\r") else body
        return body.split(b"\r")
    text = raw.rstrip("\n")
    text = text[:-1] if text.endswith("\r") else text
    return text.split("\r")


def read_jsonl(lines: Iterable[str | bytes | Mapping[str, Any]], source: str) -> pa.Table:
    """Read a JSON Lines step log (lines of text or bytes, or step objects already parsed),
    all or nothing (InputError naming each bad line), up to a recorder's mark (``marks``)."""
    problems: list[Problem] = []
    total = 0
    builder: Builder | None = None
    mark: Mark | None = None
    after = 0  # lines past a mark: not read
    last: list[Any] = [None]  # the last raw line read (a file's: its newline, if it has one)
    torn: tuple[int, str] | None = None  # a line that is no JSON: its number, the error
    read = 0  # the number of the last line that is not blank
    if not isinstance(lines, list | tuple):
        lines = _tapped(lines, last)
    for number, item in _numbered(lines):
        if mark is not None:
            after += not (isinstance(item, str) and not item.strip())
            continue
        if not (isinstance(item, str) and not item.strip()):
            read = number
        try:
            if isinstance(item, LogLineError):
                if item.cut:
                    torn = (number, str(item))
                raise item
            if isinstance(item, str):
                if not item.strip():
                    continue
                try:
                    obj = parse_line(item)
                except LogLineError as e:
                    torn = (number, str(e))
                    raise
            else:
                obj = item
            if builder is None:
                if isinstance(obj, dict) and HEADER_KEY in obj:
                    header = replayable(header_from(obj), f"{source}, line {number}")
                    builder = Builder(header, version=version_of(obj))
                    continue
                builder = Builder(Header())
            if is_mark(obj):
                mark = mark_from(obj)
                if mark.after_step != builder.last_step:
                    said, read_to = (
                        "no step" if n is None else f"step {n}"
                        for n in (mark.after_step, builder.last_step)
                    )
                    raise LogLineError(
                        f"a recorder mark after {said}, but the last step read is {read_to}: "
                        "a recorder marks where its step lines stop"
                    )
                continue
            builder.step(obj)
            continue
        except LogLineError as e:
            problem = Problem(source, number, e.column, str(e))
        total += 1
        if len(problems) < MAX_PROBLEMS:
            problems.append(problem)
    end = last[0]
    if (
        total == 1 and torn is not None and torn[0] == read and _unended(end)
    ):  # the last line cut off while written (a recorder's full disk): read up to it
        reason = f"its last line ({read}) was cut off while written, a full disk?: {torn[1]}"
        after_step = builder.last_step if builder is not None else None
        problems, mark = [], Mark("stopped", after_step, reason=reason)
    if problems:
        raise InputError(
            f"{source}: {total} line(s) of the step log cannot be read; nothing was loaded",
            problems,
            total,
            hint="fix those lines (the format: https://github.com/pagedkv-sql/pagedkv-sql/blob/main/docs/replay.md)",
        )
    table = (builder or Builder(Header())).table()
    return with_mark(table, mark, lines_after=after)


def _unended(raw: Any) -> bool:
    """A raw line read from a file without its newline (the file's last, cut short)."""
    if isinstance(raw, bytes):
        return not raw.endswith(b"\n")
    return isinstance(raw, str) and not raw.endswith("\n")


def _tapped(lines: Iterable[Any], last: list[Any]) -> Iterator[Any]:
    """``lines`` as they are, the last one read kept in ``last[0]``."""
    for raw in lines:
        last[0] = raw
        yield raw


def _numbered(
    lines: Iterable[str | bytes | Mapping[str, Any]],
) -> Iterator[tuple[int, str | LogLineError | Mapping[str, Any]]]:
    """Text lines through ``_lines``; step objects (a list of dicts) numbered as given."""
    if isinstance(lines, list | tuple):
        for i, item in enumerate(lines, start=1):
            if isinstance(item, dict):
                yield i, item
            elif isinstance(item, str | bytes):
                for _, text in _lines([item]):
                    yield i, text
            else:
                argument(item, f"log[{i - 1}]", (dict, str), "a step (a dict) or one JSON line")
        return
    yield from _lines(lines)  # type: ignore[arg-type]
