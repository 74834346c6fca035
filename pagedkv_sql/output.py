"""Rendering for the CLI: the library returns Arrow and dataclasses, only this formats."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import IO, Any

import pyarrow as pa
import pyarrow.csv as pacsv

RESOLVE_FORMATS = ("tsv", "csv", "json", "table", "arrow", "parquet")
BINARY_FORMATS = ("arrow", "parquet")
HEX_COLUMNS = ("physical_address", "physical_block_base", "cpu_base_address")


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


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, list):
        return "[" + ", ".join(_cell(x) for x in v) + "]"
    return str(v)


def write_batches(
    reader: pa.RecordBatchReader, fmt: str, out: IO[bytes], hex_columns: bool = True
) -> int:
    """Stream a reader to ``out`` in ``fmt``; return the number of rows written."""
    rows = 0
    if fmt in ("tsv", "csv"):
        options = pacsv.WriteOptions(
            include_header=fmt == "csv",
            delimiter="\t" if fmt == "tsv" else ",",
            quoting_style="none" if fmt == "tsv" else "needed",
        )
        with pacsv.CSVWriter(out, reader.schema, write_options=options) as writer:
            for batch in reader:
                writer.write_batch(batch)
                rows += batch.num_rows
    elif fmt == "json":
        for batch in reader:
            names = batch.schema.names
            columns = [c.to_pylist() for c in batch.columns]
            lines = [
                json.dumps(dict(zip(names, values, strict=True)), separators=(",", ":"))
                for values in zip(*columns, strict=True)
            ]
            if lines:
                out.write(("\n".join(lines) + "\n").encode())
            rows += batch.num_rows
    elif fmt == "table":
        rows = _write_table(reader, out, hex_columns)
    elif fmt == "arrow":
        with pa.ipc.new_stream(out, reader.schema) as writer:
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


def _write_table(reader: pa.RecordBatchReader, out: IO[bytes], hex_columns: bool) -> int:
    """A text table for people, streamed: column widths come from the first batch."""
    names = list(reader.schema.names)
    hexed = [n for n in names if hex_columns and n in HEX_COLUMNS]
    header = names + [f"{n} (hex)" for n in hexed]
    widths: list[int] | None = None
    rows = 0
    for batch in reader:
        columns = [batch.column(n).to_pylist() for n in names]
        columns += [[_hex(v) for v in batch.column(n).to_pylist()] for n in hexed]
        cells = [[str(v) for v in c] for c in columns]
        if widths is None:
            widths = [max([len(h), *map(len, c)]) for h, c in zip(header, cells, strict=True)]
            out.write((_row(header, widths) + "\n").encode())
        lines = [_row([c[i] for c in cells], widths) for i in range(batch.num_rows)]
        if lines:
            out.write(("\n".join(lines) + "\n").encode())
        rows += batch.num_rows
    if widths is None:
        out.write((_row(header, [len(h) for h in header]) + "\n").encode())
    out.write(f"({rows} row{'s' if rows != 1 else ''})\n".encode())
    return rows


def _row(values: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(v.rjust(w) for v, w in zip(values, widths, strict=True))


def _hex(v: int) -> str:
    return f"-0x{-v:x}" if v < 0 else f"0x{v:x}"


def hex_or_int(v: Any) -> str:
    return f"{v} ({_hex(v)})" if isinstance(v, int) else str(v)


def stdout_binary() -> IO[bytes]:
    return sys.stdout.buffer
