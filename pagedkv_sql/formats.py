"""The output formats and how a file's extension picks one: what the CLI's options offer,
without pyarrow (the writers are in output.py)."""

from __future__ import annotations

from enum import Enum
from pathlib import PurePath


class RowsFormat(str, Enum):
    """How rows are written. ``facts`` is Soufflé's (tab-separated, no header); ``tsv``
    and ``csv`` have a bare header line; ``json`` is one JSON array, ``jsonl`` (alias
    ``ndjson``) one object a line; ``arrow`` an Arrow IPC file (``.arrow``/``.feather``),
    ``arrows`` an IPC stream; ``table`` is for people."""

    facts = "facts"
    tsv = "tsv"
    csv = "csv"
    json = "json"
    jsonl = "jsonl"
    ndjson = "ndjson"
    table = "table"
    arrow = "arrow"
    arrows = "arrows"
    parquet = "parquet"


class ReportFormat(str, Enum):
    """A report (check, stats, explain): ``text`` for people, ``json`` one document, or
    its rows in a tabular format."""

    text = "text"
    json = "json"
    jsonl = "jsonl"
    ndjson = "ndjson"
    csv = "csv"
    tsv = "tsv"
    arrow = "arrow"
    arrows = "arrows"
    parquet = "parquet"


BINARY_FORMATS = ("arrow", "arrows", "parquet")
# output file extension -> format, when --format is not given
EXTENSIONS = {
    ".facts": "facts",
    ".tsv": "tsv",
    ".csv": "csv",
    ".json": "json",
    ".jsonl": "jsonl",
    ".ndjson": "ndjson",
    ".arrow": "arrow",
    ".feather": "arrow",
    ".arrows": "arrows",
    ".parquet": "parquet",
}


def format_for(path: str | None, given: str | None, default: str) -> str:
    """The format asked for, else the one the output file's extension names, else
    ``default``."""
    if given is not None:
        return given
    if path is not None and path != "-":
        return EXTENSIONS.get(PurePath(path).suffix.lower(), default)
    return default


__all__ = ["BINARY_FORMATS", "EXTENSIONS", "ReportFormat", "RowsFormat", "format_for"]


# -- text for a terminal ----------------------------------------------------------------
NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# what str.isprintable() refuses, as an RE2 class for Arrow: anything not a letter, mark,
# number, punctuation, symbol or the plain space (controls, format characters such as the
# bidi overrides, line and paragraph separators, unassigned code points)
UNPRINTABLE = r"[^\p{L}\p{M}\p{N}\p{P}\p{S} ]"


def printable(value: object) -> str:
    """``value`` as text for a terminal: every character Python does not call printable
    (C0 and C1 controls, DEL, ESC and so every escape sequence, newlines, bidi overrides,
    U+2028/2029, zero-width and unassigned characters) written as its escape (``\\n``,
    ``\\x1b``, ``\\u202e``), so a string from an engine cannot move the cursor, retitle
    the window, reach the clipboard or forge a line of a report. The one escaper of every
    rendering for people; data formats (JSON, TSV, CSV, Arrow, Parquet) keep strings
    exact. Idempotent: the escapes themselves are printable (a backslash stays as it is)."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    if c in NAMED_ESCAPES:
        return NAMED_ESCAPES[c]
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
