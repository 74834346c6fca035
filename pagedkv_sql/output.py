"""Rendering for the CLI: the library returns Arrow and dataclasses, only this formats."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterable, Sequence
from enum import Enum
from pathlib import PurePath
from typing import IO, Any

import pyarrow as pa
import pyarrow.csv as pacsv

HEX_COLUMNS = ("physical_address", "physical_block_base", "cpu_base_address")


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


def text_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain aligned table: numbers right-aligned, everything else left-aligned."""
    raw = [list(r) for r in rows]
    cells = [[_cell(v) for v in r] for r in raw]
    widths = [len(h) for h in header]
    for r in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, r, strict=True)]

    def line(values: Sequence[str], originals: Sequence[Any]) -> str:
        parts = []
        for v, w, o in zip(values, widths, originals, strict=True):
            numeric = isinstance(o, int) and not isinstance(o, bool)
            parts.append(v.rjust(w) if numeric else v.ljust(w))
        return "  ".join(parts).rstrip()

    lines = [line(list(header), [None] * len(header))]
    lines += [line(c, r) for c, r in zip(cells, raw, strict=True)]
    return "\n".join(lines)


def pa_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> pa.Table:
    """A report's rows as an Arrow table (types inferred per column)."""
    columns = [[r[i] for r in rows] for i in range(len(header))]
    return pa.table({h: pa.array(c) for h, c in zip(header, columns, strict=True)})


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, list):
        return "[" + ", ".join(_cell(x) for x in v) + "]"
    return str(v)


def write_batches(
    reader: pa.RecordBatchReader, fmt: str, out: IO[bytes], hex_columns: bool = True
) -> int:
    """Stream a reader to ``out`` in ``fmt`` (a RowsFormat value); return the number of
    rows written. Text formats are built by Arrow kernels, not row by row in Python."""
    rows = 0
    if fmt in ("facts", "tsv", "csv") and not all(
        pa.types.is_integer(f.type) for f in reader.schema
    ):
        rows = _write_text_rows(reader, out, "," if fmt == "csv" else "\t", fmt != "facts")
    elif fmt in ("facts", "tsv", "csv"):
        delimiter = "," if fmt == "csv" else "\t"
        if fmt != "facts":  # a bare header, as DuckDB and sqlite-utils write it
            out.write((delimiter.join(reader.schema.names) + "\n").encode())
        options = pacsv.WriteOptions(
            include_header=False,
            delimiter=delimiter,
            quoting_style="needed" if fmt == "csv" else "none",
        )
        with pacsv.CSVWriter(out, reader.schema, write_options=options) as writer:
            for batch in reader:
                writer.write_batch(batch)
                rows += batch.num_rows
    elif fmt in ("json", "jsonl", "ndjson"):
        rows = _write_json(reader, out, array=fmt == "json")
    elif fmt == "table":
        rows = _write_table(reader, out, hex_columns)
    elif fmt in ("arrow", "arrows"):
        new = pa.ipc.new_file if fmt == "arrow" else pa.ipc.new_stream
        with new(out, reader.schema) as writer:
            for batch in reader:
                writer.write_batch(batch)
                rows += batch.num_rows
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        with pq.ParquetWriter(out, reader.schema) as writer:
            for batch in reader:
                writer.write_batch(batch)
                rows += batch.num_rows
    else:  # pragma: no cover - the CLI validates the choice
        raise ValueError(fmt)
    return rows


def _write_text_rows(
    reader: pa.RecordBatchReader, out: IO[bytes], delimiter: str, header: bool
) -> int:
    """Delimited text of mixed columns (a report's): strings quoted only when they must
    be, as DuckDB and sqlite-utils write them; lists and structs as JSON."""
    import csv

    text = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
    writer = csv.writer(text, delimiter=delimiter, lineterminator="\n")
    if header:
        writer.writerow(reader.schema.names)
    rows = 0
    for batch in reader:
        for row in zip(*(c.to_pylist() for c in batch.columns), strict=True):
            writer.writerow(
                json.dumps(v) if isinstance(v, list | dict) else "" if v is None else v for v in row
            )
        rows += batch.num_rows
    text.flush()
    text.detach()
    return rows


def write_table(table: pa.Table, fmt: str, out: IO[bytes]) -> int:
    """``write_batches`` for a table in memory (a report's rows)."""
    return write_batches(
        pa.RecordBatchReader.from_batches(table.schema, table.to_batches()), fmt, out
    )


def _json_lines(batch: pa.RecordBatch, prefix: str, suffix: str) -> pa.Array:
    """Each row as a JSON object between ``prefix`` and ``suffix``, built by Arrow's string kernels
    for integer columns (json.dumps per value for anything else)."""
    import pyarrow.compute as pc  # here: a command that writes no JSON starts without it

    pieces: list[Any] = []
    for i, (name, column) in enumerate(zip(batch.schema.names, batch.columns, strict=True)):
        pieces.append((prefix + "{" if i == 0 else ",") + json.dumps(name) + ":")
        if pa.types.is_integer(column.type) and column.null_count == 0:
            pieces.append(pc.cast(column, pa.string()))
        else:
            pieces.append(pa.array([json.dumps(v) for v in column.to_pylist()], pa.string()))
    pieces.append("}" + suffix)
    return pc.binary_join_element_wise(*pieces, "")


def _write_strings(strings: Any, out: IO[bytes], cut: int = 0) -> None:
    """Write a string array's characters back to back, straight from its buffer, less
    the last ``cut`` bytes."""
    if isinstance(strings, pa.ChunkedArray):
        strings = strings.combine_chunks()
    if len(strings) == 0:
        return
    offsets = strings.buffers()[1]
    start, end = (
        int.from_bytes(offsets[i * 4 : i * 4 + 4], "little", signed=True)
        for i in (strings.offset, strings.offset + len(strings))
    )
    out.write(memoryview(strings.buffers()[2])[start : end - cut])


def _write_json(reader: pa.RecordBatchReader, out: IO[bytes], array: bool) -> int:
    """JSON Lines, or one JSON array laid out as DuckDB's COPY (FORMAT json, ARRAY true)
    lays it out: one object a line, tab-indented."""
    rows = 0
    if array:
        out.write(b"[\n")
    for batch in reader:
        if batch.num_rows == 0:
            continue
        if array:
            # objects end in ",\n"; the last of a batch waits to know if another follows
            out.write(b",\n" if rows else b"")
            _write_strings(_json_lines(batch, "\t", ",\n"), out, cut=2)
        else:
            _write_strings(_json_lines(batch, "", "\n"), out)
        rows += batch.num_rows
    if array:
        out.write(b"\n]\n" if rows else b"]\n")
    return rows


def _write_table(reader: pa.RecordBatchReader, out: IO[bytes], hex_columns: bool) -> int:
    """A text table for people, streamed: column widths come from the first batch. Each
    batch's lines are built by one DuckDB query (casts, hex, padding), not in Python."""
    import duckdb

    names = list(reader.schema.names)
    hexed = [
        n
        for n in names
        if hex_columns and n in HEX_COLUMNS and pa.types.is_integer(reader.schema.field(n).type)
    ]
    header = names + [f"{n} (hex)" for n in hexed]
    cells = [f"coalesce(CAST({_quote(n)} AS VARCHAR), '-')" for n in names]
    cells += [
        f"CASE WHEN {_quote(n)} >= 0 THEN '0x' || lower(hex({_quote(n)})) "
        f"ELSE format('{{:#x}}', {_quote(n)}) END"
        for n in hexed
    ]
    widths: list[int] | None = None
    rows = 0
    con = duckdb.connect()
    try:
        for batch in reader:
            if batch.num_rows == 0:
                continue
            con.register("_pagedkv_batch", pa.Table.from_batches([batch]))
            if widths is None:
                longest = ", ".join(f"max(length({c}))" for c in cells)
                found = con.execute(f"SELECT {longest} FROM _pagedkv_batch").fetchall()[0]
                widths = [max(len(h), w or 0) for h, w in zip(header, found, strict=True)]
                out.write((_row(header, widths) + "\n").encode())
            line = " || '  ' || ".join(
                f"lpad({c}, {w}, ' ')" for c, w in zip(cells, widths, strict=True)
            )
            lines = con.sql(f"SELECT {line} || chr(10) FROM _pagedkv_batch").to_arrow_table()
            _write_strings(lines.column(0), out)
            con.unregister("_pagedkv_batch")
            rows += batch.num_rows
    finally:
        con.close()
    if widths is None:
        out.write((_row(header, [len(h) for h in header]) + "\n").encode())
    out.write(f"({rows} row{'s' if rows != 1 else ''})\n".encode())
    return rows


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _row(values: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(v.rjust(w) for v, w in zip(values, widths, strict=True))


def _hex(v: int) -> str:
    return f"-0x{-v:x}" if v < 0 else f"0x{v:x}"


def hex_or_int(v: Any) -> str:
    return f"{v} ({_hex(v)})" if isinstance(v, int) else str(v)


def stdout_binary() -> IO[bytes]:
    return sys.stdout.buffer
