"""The step log (docs/replay.md): read JSON Lines steps, or the flat event table from
Parquet / Arrow, into one Arrow table of block-level events.

The reader keeps each request's block table only as far as it needs to number block indices
and to expand request-level operations (free, fork, swap) into block-level events. It never
judges the engine: what an engine did wrong (a block handed out twice, a double free) passes
through as events for the invariant queries of ``sql/replay.sql`` to find. Only a log that
cannot be read is refused, whole, naming each offending line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pyarrow as pa

from ..errors import InputError, Problem
from .builder import Builder, Request
from .header import (
    EVENT_OPS,
    EVENT_SCHEMA,
    FORMAT_VERSION,
    HEADER_KEY,
    MAX_PROBLEMS,
    STEP_KEYS,
    STEP_OPS,
    Header,
    LogLineError,
    header_from,
)


# -- reading files ---------------------------------------------------------------------------
def read_jsonl(lines: Iterable[str | bytes], source: str) -> pa.Table:
    """Read a JSON Lines step log, all or nothing (InputError naming each bad line)."""
    problems: list[Problem] = []
    total = 0
    builder: Builder | None = None
    for number, raw in enumerate(lines, start=1):
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            problem = Problem(source, number, e.colno, f"malformed JSON: {e.msg}")
        else:
            try:
                if builder is None:
                    if isinstance(obj, dict) and HEADER_KEY in obj:
                        builder = Builder(header_from(obj))
                        continue
                    builder = Builder(Header())
                builder.step(obj)
                continue
            except LogLineError as e:
                problem = Problem(source, number, None, str(e))
        total += 1
        if len(problems) < MAX_PROBLEMS:
            problems.append(problem)
    if problems:
        raise InputError(
            f"{source}: {total} line(s) of the step log cannot be read; nothing was loaded",
            problems,
            total,
            hint="fix those lines (the format is in docs/replay.md)",
        )
    return (builder or Builder(Header())).table()


def read_log(path: str | os.PathLike[str] | IO[bytes]) -> pa.Table:
    """A step log as the event table, from JSON Lines (.jsonl, .json, .ndjson, or - / a
    stream), Parquet or Arrow IPC; header values in the schema metadata."""
    if not isinstance(path, str | os.PathLike):
        return read_jsonl(path, "<stdin>")
    p = Path(path)
    if str(path) == "-":
        import sys

        return read_jsonl(sys.stdin.buffer, "<stdin>")
    if not p.is_file():
        raise InputError(f"no step log at {p}", hint="give a .jsonl, .parquet or .arrow file")
    suffix = p.suffix.lower()
    if suffix in (".parquet", ".arrow", ".arrows", ".feather", ".ipc"):
        return read_events(p)
    with p.open("rb") as f:
        return read_jsonl(f, str(p))


def read_events(path: Path) -> pa.Table:
    """The flat event table from Parquet or Arrow IPC (validated later, in SQL)."""
    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path)
        else:
            import pyarrow.ipc as ipc

            with path.open("rb") as f:
                head = f.read(6)
            with path.open("rb") as f:
                reader = ipc.open_file(f) if head == b"ARROW1" else ipc.open_stream(f)
                table = reader.read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{path}: not a readable event table: {e}") from None
    return conform(table, str(path))


def conform(table: pa.Table, source: str) -> pa.Table:
    """Cast a flat event table to EVENT_SCHEMA, naming missing or mistyped columns."""
    missing = [n for n in EVENT_SCHEMA.names if n not in table.column_names]
    extra = [n for n in table.column_names if n not in EVENT_SCHEMA.names]
    if missing or extra:
        raise InputError(
            f"{source}: not a step-log event table"
            + (f"; missing column(s) {', '.join(missing)}" if missing else "")
            + (f"; unknown column(s) {', '.join(extra)}" if extra else ""),
            hint="the columns are listed in docs/replay.md (the event table)",
        )
    columns = []
    for f in EVENT_SCHEMA:
        col = table.column(f.name)
        if col.type != f.type:
            ok = (
                pa.types.is_integer(col.type)
                if f.type == pa.int64()
                else (
                    pa.types.is_string(col.type)
                    or pa.types.is_large_string(col.type)
                    or pa.types.is_dictionary(col.type)
                )
            )
            if not ok and not pa.types.is_null(col.type):
                raise InputError(f"{source}: column {f.name} is {col.type}, not {f.type}")
            col = col.cast(f.type)
        columns.append(col)
    meta = table.schema.metadata or {}
    header = meta.get(HEADER_KEY.encode())
    if header is None:
        meta_header = Header()
    else:
        try:
            meta_header = header_from(json.loads(header))
        except (LogLineError, json.JSONDecodeError) as e:
            raise InputError(f"{source}: bad step-log header in the schema metadata: {e}") from None
    return pa.Table.from_arrays(columns, schema=EVENT_SCHEMA).replace_schema_metadata(
        {HEADER_KEY: meta_header.to_json()}
    )


@dataclass(frozen=True)
class ParquetEvents:
    """An event table in a Parquet file, scanned by DuckDB in place (no copy through Arrow);
    its schema and header were checked by ``parquet_events``."""

    path: str
    header: Header


_GLOB = set("[]*?{}")


def parquet_events(path: Path) -> ParquetEvents | None:
    """The Parquet file as ParquetEvents, or None when DuckDB cannot read it by name (a
    path DuckDB would glob-expand): then pyarrow reads it."""
    if _GLOB & set(str(path)):
        return None
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{path}: not a readable event table: {e}") from None
    empty = pa.Table.from_batches([], schema=schema).replace_schema_metadata(schema.metadata)
    checked = conform(empty, str(path))
    return ParquetEvents(str(path), header_of(checked))


def header_of(table: pa.Table) -> Header:
    meta = (table.schema.metadata or {}).get(HEADER_KEY.encode())
    return header_from(json.loads(meta)) if meta else Header()


def write_events(table: pa.Table, path: str | os.PathLike[str]) -> None:
    """Write the event table as Parquet (.parquet) or Arrow IPC (any other suffix)."""
    p = Path(path)
    if p.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, p, compression="zstd")
    else:
        import pyarrow.ipc as ipc

        with ipc.new_file(str(p), table.schema) as w:
            w.write_table(table)


__all__ = [
    "EVENT_OPS",
    "EVENT_SCHEMA",
    "FORMAT_VERSION",
    "HEADER_KEY",
    "MAX_PROBLEMS",
    "STEP_KEYS",
    "STEP_OPS",
    "Builder",
    "Header",
    "LogLineError",
    "ParquetEvents",
    "Request",
    "conform",
    "header_from",
    "header_of",
    "parquet_events",
    "read_events",
    "read_jsonl",
    "read_log",
    "write_events",
]
