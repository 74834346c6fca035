"""Rendering for the CLI: the library returns Arrow and dataclasses, only this formats."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from typing import IO, Any

import pyarrow as pa
import pyarrow.csv as pacsv

from .formats import UNPRINTABLE, printable
from .numbers import hex_address

HEX_COLUMNS = ("physical_address", "physical_block_base", "cpu_base_address")
# Arrow's canonical name for a string column that holds JSON text: the JSON writers embed
# it as JSON (an object, not a string of one); every other format keeps the text
JSON_EXTENSION = {b"ARROW:extension:name": b"arrow.json"}


def json_text_field(name: str) -> pa.Field:
    """A string column whose values are JSON documents (``violations``' row)."""
    return pa.field(name, pa.string(), metadata=JSON_EXTENSION)


def _is_json_text(field: pa.Field) -> bool:
    return bool(field.metadata) and field.metadata.get(b"ARROW:extension:name") == b"arrow.json"


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
    return pa.Table.from_arrays([pa.array(c) for c in columns], names=list(header))


def printable_column(column: pa.Array) -> pa.Array:
    """``printable`` over a string column: Arrow finds the cells that need it, Python
    escapes those only (none, in a healthy table)."""
    import pyarrow.compute as pc

    flagged = pc.match_substring_regex(column, UNPRINTABLE)
    if not pc.any(flagged).as_py():
        return column
    values = column.to_pylist()
    for i in pc.indices_nonzero(flagged).to_pylist():
        values[i] = printable(values[i])
    return pa.array(values, pa.string())


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, list):
        return "[" + ", ".join(_cell(x) for x in v) + "]"
    return printable(v)


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


_FACT_ESCAPES = str.maketrans({"\t": "\\t", "\r": "\\r", "\n": "\\n"})


def _write_text_rows(
    reader: pa.RecordBatchReader, out: IO[bytes], delimiter: str, header: bool
) -> int:
    """Delimited text of mixed columns (a report's): strings quoted only when they must
    be, as DuckDB and sqlite-utils write them; lists and structs as JSON. Soufflé's facts
    (``header`` False) have no quoting at all: each cell as it is, a tab, CR or LF in one
    written as ``\\t``, ``\\r``, ``\\n`` (a JSON cell never holds one raw)."""
    import csv

    text = io.TextIOWrapper(out, encoding="utf-8", newline="")  # flushed before it returns
    writer = csv.writer(text, delimiter=delimiter, lineterminator="\n")
    if header:
        writer.writerow(reader.schema.names)
    rows = 0
    for batch in reader:
        for row in zip(*(c.to_pylist() for c in batch.columns), strict=True):
            cells = (
                json.dumps(v) if isinstance(v, list | dict) else "" if v is None else v for v in row
            )
            if header:
                writer.writerow(cells)
            else:
                text.write(delimiter.join(str(c).translate(_FACT_ESCAPES) for c in cells) + "\n")
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
    for i, (field, column) in enumerate(zip(batch.schema, batch.columns, strict=True)):
        pieces.append((prefix + "{" if i == 0 else ",") + json.dumps(field.name) + ":")
        if pa.types.is_integer(column.type) and column.null_count == 0:
            pieces.append(pc.cast(column, pa.string()))
        elif _is_json_text(field):  # already JSON: embedded as it is
            pieces.append(column.fill_null("null"))
        else:
            pieces.append(pa.array([json.dumps(v) for v in column.to_pylist()], pa.string()))
    pieces.append("}" + suffix)
    return pc.binary_join_element_wise(*pieces, "")


def _write_strings(strings: Any, out: IO[bytes], cut: int = 0) -> None:
    """Write a string array's characters back to back, straight from its buffer, less
    the last ``cut`` bytes (never empty: the callers skip empty batches)."""
    if isinstance(strings, pa.ChunkedArray):
        strings = strings.combine_chunks()
    offsets = memoryview(strings.buffers()[1]).cast("i")  # int32, in the machine's order
    start, end = offsets[strings.offset], offsets[strings.offset + len(strings)]
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
    """A text table for people, streamed: every cell right-aligned to its column's width.
    Widths come from the first batch and grow when a later batch has a wider value (a
    value is never cut). Integer cells are laid out by numpy, the rest by Arrow kernels:
    nothing row by row."""
    names = list(reader.schema.names)
    hexed = [
        i
        for i, n in enumerate(names)
        if hex_columns and n in HEX_COLUMNS and pa.types.is_integer(reader.schema.field(n).type)
    ]
    header = names + [f"{names[i]} (hex)" for i in hexed]
    widths = [len(h) for h in header]
    rows = 0
    for batch in reader:
        if batch.num_rows == 0:
            continue
        columns = batch.columns
        needed = [_text_width(c) for c in columns] + [_hex_width(columns[i]) for i in hexed]
        widths = list(map(max, widths, needed))
        if rows == 0:
            out.write((_row(header, widths) + "\n").encode())
        fields = [(c, 10, b"") for c in columns] + [(columns[i], 16, b"0x") for i in hexed]
        if all(pa.types.is_integer(c.type) and not c.null_count for c in columns):
            lines = _integer_lines(fields, widths)  # one byte array, "\n" first on each line
            out.write(memoryview(lines).cast("B")[1:])
            out.write(b"\n")
        else:
            _write_mixed_lines(fields, widths, out)
        rows += batch.num_rows
    if rows == 0:
        out.write((_row(header, widths) + "\n").encode())
    out.write(f"({rows} row{'s' if rows != 1 else ''})\n".encode())
    return rows


def _text_width(column: pa.Array) -> int:
    """The widest cell of a column as the table writes it."""
    import pyarrow.compute as pc  # here: a command that writes no table starts without it

    if pa.types.is_integer(column.type):
        low, high = pc.min_max(column).values()
        widest = max(len(str(low.as_py())), len(str(high.as_py())))
        return max(widest, 1) if column.null_count < len(column) else 1
    return int(pc.max(pc.utf8_length(_text_cells(column))).as_py() or 0)


def _hex_width(column: pa.Array) -> int:
    import pyarrow.compute as pc

    low, high = pc.min_max(column).values()
    if low.as_py() is None:
        return 1
    return max(len(hex_address(low.as_py())), len(hex_address(high.as_py())))


def _text_cells(column: pa.Array) -> pa.Array:
    """A column that is not integers as strings, '-' for null (lists as DuckDB prints)."""
    import pyarrow.compute as pc

    if pa.types.is_string(column.type):
        text = printable_column(column)
    elif pa.types.is_floating(column.type):
        text = pc.cast(column, pa.string())
    else:
        text = pa.array([None if v is None else _cell(v) for v in column.to_pylist()], pa.string())
    return text.fill_null("-") if text.null_count else text


def _write_mixed_lines(
    fields: list[tuple[Any, int, bytes]], widths: list[int], out: IO[bytes]
) -> None:
    """Lines of a batch with strings or nulls: each cell padded, the cells joined by Arrow."""
    import numpy as np
    import pyarrow.compute as pc

    pieces: list[Any] = []
    for (column, base, prefix), width in zip(fields, widths, strict=True):
        if pa.types.is_integer(column.type):
            cells = _integer_lines([(column.fill_null(0), base, prefix)], [width])
            if column.null_count:
                null = np.asarray(column.is_null().to_numpy(zero_copy_only=False))
                cells[null, 1:] = ord(" ")
                cells[null, -1] = ord("-")
            n = len(column)
            offsets = np.arange(0, n * width + 1, width, dtype=np.int32)
            data = np.ascontiguousarray(cells[:, 1:])
            text = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))
        else:
            text = pc.utf8_lpad(_text_cells(column), width=width, padding=" ")
        pieces += [text, "  "]
    pieces[-1] = "\n"
    _write_strings(pc.binary_join_element_wise(*pieces, ""), out)


_TRIPLES: dict[int, Any] = {}


def _triples(base: int) -> Any:
    """Four bytes an entry (uint32), a blank then three digits: [0, b^3) digits inside a
    number, [b^3, 2*b^3) a number's top digits (no leading zero), then all blank."""
    import numpy as np

    table = _TRIPLES.get(base)
    if table is None:
        digit = "0123456789abcdef"
        inner = [
            digit[r // base // base] + digit[r // base % base] + digit[r % base]
            for r in range(base**3)
        ]
        top = [t.lstrip("0").rjust(3) if r else "  0" for r, t in enumerate(inner)]
        text = "".join(" " + t for t in [*inner, *top, "   "])
        table = _TRIPLES[base] = np.frombuffer(text.encode(), np.uint32)
    return table


def _integer_lines(fields: list[tuple[Any, int, bytes]], widths: list[int]) -> Any:
    """The lines of integer columns (no nulls) as one uint8 array, a row a line: a
    newline, then each field right-aligned in its width (base 10 or 16, with a prefix
    like 0x after the sign), two spaces apart. Digits are written three a pass, every
    row at once."""
    import numpy as np

    n = len(fields[0][0])
    line = np.full((n, 1 + sum(widths) + 2 * (len(widths) - 1)), ord(" "), np.uint8)
    starts = [1 + sum(widths[:i]) + 2 * i for i in range(len(widths))]
    # right to left: a field's passes may blank up to three columns left of it
    for (column, base, prefix), width, start in reversed(
        list(zip(fields, widths, starts, strict=True))
    ):
        values = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)
        _place_digits(line, start, start + width, values, base, prefix)
    line[:, 0] = ord("\n")
    return line


def _place_digits(line: Any, start: int, end: int, values: Any, base: int, prefix: bytes) -> None:
    """Write ``values`` into columns [start, end) of every row of ``line``, right-aligned;
    the columns just left of ``start`` may be blanked."""
    import numpy as np

    table = _triples(base)
    n, length = line.shape
    cube = base**3
    negative = values < 0
    signed = bool(negative.any())
    rest = values.view(np.uint64)
    if signed:
        rest = rest.copy()
        np.negative(rest, out=rest, where=negative)  # magnitudes, 2^63 included
    marked = signed or bool(prefix)
    first = np.zeros(n, np.intp)  # each row's first digit's column, when marked
    col, later = end - 4, False  # a pass writes 4 bytes: a blank, then three digits
    while col >= start - 3:
        if base == 16:
            after = rest >> np.uint64(12)
            r = (rest & np.uint64(4095)).astype(np.intp)
        else:
            after, low = np.divmod(rest, np.uint64(cube))
            r = low.astype(np.intp)
        last = after == 0
        index = r + last * cube
        if later:
            index += (rest == 0) * cube  # wholly left of the number: blank
        if marked:
            top = (last & (rest > 0)) if later else last
            blanks = (r < base).astype(np.intp) + (r < base * base)  # before the top digit
            first = np.where(top, col + 1 + blanks, first)
        if col >= 0:
            quad = np.ndarray((n,), np.uint32, buffer=line, offset=col, strides=(length,))
            quad[:] = table[index]
        else:  # the line's first field: what would fall left of the line is blank
            line[:, : col + 4] = table[index].view(np.uint8).reshape(n, 4)[:, -col:]
        if not after.any():
            break
        rest, col, later = after, col - 3, True
    if marked:
        at = np.arange(n)
        for c in reversed(prefix):
            first = first - 1
            line[at, first] = c
        if signed:
            line[at[negative], first[negative] - 1] = ord("-")


def _row(values: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(map(str.rjust, values, widths))


def hex_or_int(v: Any) -> str:
    return f"{v} ({hex_address(v)})" if isinstance(v, int) else str(v)
