"""The output formats and how a file's extension picks one: what the CLI's options offer,
without pyarrow (the writers are in output.py)."""

from __future__ import annotations

from enum import Enum
from pathlib import PurePath


class RowsFormat(str, Enum):
    """How rows are written. ``facts`` is Soufflé's (tab-separated, no header); ``tsv``
    and ``csv`` have a bare header line; ``json`` is one JSON array, ``jsonl`` (alias
    ``ndjson``) one object a line; ``arrow`` an Arrow IPC file (``.arrow``/``.feather``),
    ``arrows`` an IPC stream; ``table`` (alias ``text``) is for people."""

    facts = "facts"
    tsv = "tsv"
    csv = "csv"
    json = "json"
    jsonl = "jsonl"
    ndjson = "ndjson"
    table = "table"
    text = "text"
    arrow = "arrow"
    arrows = "arrows"
    parquet = "parquet"


class ReportFormat(str, Enum):
    """A report (check, stats, explain): ``text`` (alias ``table``) for people, ``json``
    one document, or its rows in a tabular format."""

    text = "text"
    table = "table"
    json = "json"
    jsonl = "jsonl"
    ndjson = "ndjson"
    csv = "csv"
    tsv = "tsv"
    arrow = "arrow"
    arrows = "arrows"
    parquet = "parquet"


BINARY_FORMATS = ("arrow", "arrows", "parquet")
# the format for people has two names, one each command family grew up with: both are
# taken everywhere; rows call it table, reports text
HUMAN = ("table", "text")
# output file extension -> format, when --format is not given; a compression suffix
# (.gz, .zst) after it is set aside (compression.py)
EXTENSIONS = {
    ".facts": "facts",
    ".tsv": "tsv",
    ".csv": "csv",
    ".json": "json",
    ".jsonl": "jsonl",
    ".ndjson": "ndjson",
    ".txt": "text",
    ".arrow": "arrow",
    ".feather": "arrow",
    ".arrows": "arrows",
    ".parquet": "parquet",
}
ROWS_FORMATS = tuple(f.value for f in RowsFormat if f.value != "text")
REPORT_FORMATS = tuple(f.value for f in ReportFormat if f.value != "table")


def format_for(
    path: str | None, given: str | None, default: str, known: tuple[str, ...] = ROWS_FORMATS
) -> str:
    """The format asked for, else the one the output file's extension names (its ``.gz``
    or ``.zst`` set aside), else ``default`` (no path, stdout, a name without an extension);
    the human format by the name ``known`` gives it. An extension that names no format of
    ``known`` is refused, never written in the default format."""
    human = "table" if "table" in known else "text"
    found = given
    if found is None and path is not None and path != "-":
        from .compression import SUFFIXES, strip

        suffix = PurePath(strip(path)[0]).suffix.lower()
        found = EXTENSIONS.get(suffix, suffix) if suffix else None
        if found not in (*known, *HUMAN, None):
            from .errors import UsageError

            extensions = [e for e, f in EXTENSIONS.items() if f in known or f in HUMAN]
            raise UsageError(
                f"--output {path}: '{suffix}' names no format this command writes; "
                "nothing was written",
                hint=f"pass --format ({', '.join(known)}), or name the file {' '.join(extensions)}"
                f" (then {' or '.join(SUFFIXES)} to compress it)",
            )
    if found is None:
        return default
    return human if found in HUMAN else found


__all__ = [
    "BINARY_FORMATS",
    "EXTENSIONS",
    "HUMAN",
    "REPORT_FORMATS",
    "ROWS_FORMATS",
    "ReportFormat",
    "RowsFormat",
    "format_for",
]


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
