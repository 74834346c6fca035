"""The record-batch streams a Database hands out: each passed through with its fixed
schema, a DuckDB error made ours, and its reader and cursor ended when it is done."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from typing import Any

import duckdb
import pyarrow as pa

from .connection import first_line
from .errors import DatabaseError
from .relations import OUTPUT_SCHEMA


def close_quietly(handle: Any) -> None:
    """Close a reader, cursor or generator; one running in another thread is left to it."""
    with suppress(ValueError, duckdb.Error):
        handle.close()


def chained(
    batches: Iterator[pa.RecordBatch], what: str, end: Callable[[], None]
) -> Iterator[pa.RecordBatch]:
    """Pass batches through; a DuckDB error becomes a DatabaseError with it as cause."""
    try:
        yield from batches
    except duckdb.Error as e:
        raise DatabaseError(f"{what}: {first_line(e)}") from e
    finally:
        end()


def passthrough(
    reader: pa.RecordBatchReader, end: Callable[[], None], schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    try:
        for batch in reader:
            yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)
    finally:
        end()


def distinct_sorted(
    reader: Iterable[pa.RecordBatch], end: Callable[[], None] | None = None
) -> Iterator[pa.RecordBatch]:
    """Drop exact duplicates from sorted batches: they can only be neighbours."""
    import pyarrow.compute as pc  # here, not at the top: only reading the output needs it

    last: tuple[int, ...] | None = None
    try:
        for batch in reader:
            n = batch.num_rows
            if n == 0:
                continue
            first = tuple(c[0].as_py() for c in batch.columns)
            # a row differs from the one before it in some column
            differs = pa.array([first != last])
            # (a one-row batch compares empty slices: nothing to add)
            new = [pc.not_equal(c.slice(1), c.slice(0, n - 1)) for c in batch.columns]
            step = new[0]
            for other in new[1:]:
                step = pc.or_(step, other)
            differs = pa.concat_arrays([differs, step])
            last = tuple(c[n - 1].as_py() for c in batch.columns)
            if differs.false_count:
                batch = batch.filter(differs)
            yield pa.RecordBatch.from_arrays(batch.columns, schema=OUTPUT_SCHEMA)
    finally:
        if end is not None:
            end()
