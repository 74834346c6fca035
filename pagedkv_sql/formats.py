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


class TextFormat(str, Enum):
    """A report that has no rows to export: ``text`` for people or ``json``."""

    text = "text"
    json = "json"


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


__all__ = ["BINARY_FORMATS", "EXTENSIONS", "ReportFormat", "RowsFormat", "TextFormat", "format_for"]
