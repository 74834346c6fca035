"""Resolve a stream of token batches against the stored block tables without storing the
tokens."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import duckdb
import pyarrow as pa

from .check import staged_violations
from .dbutil import run
from .errors import ConstraintError, InputError
from .relations import OUTPUT_SCHEMA
from .sources import arrow_source, problem_from_duckdb

_RESOLVE = (
    "SELECT DISTINCT * FROM (SELECT * FROM pagedkv_resolve_gpu('_pagedkv_tokens') "
    "UNION ALL SELECT * FROM pagedkv_resolve_cpu('_pagedkv_tokens'))"
)


def resolve_stream(
    con: duckdb.DuckDBPyConnection, token_batches: Any, *, distinct: bool = True
) -> Iterator[pa.RecordBatch]:
    """Yield, for each batch of virtual_token rows, its resolved addresses (sorted). With
    ``distinct`` (the default) a row already yielded for an earlier batch is not yielded
    again, so the union of the output is exactly ``resolve()`` over all the tokens; that
    keeps the rows yielded so far in a temporary table. Without it memory stays bounded
    and only duplicates inside one batch collapse."""
    cursor = con.cursor()
    try:
        if distinct:
            run(
                cursor,
                "CREATE TEMP TABLE _pagedkv_seen "
                "(seq_id BIGINT, token_pos BIGINT, physical_address BIGINT)",
            )
        for number, batch in enumerate(_batches(token_batches), start=1):
            label = f"<token batch {number}>"
            source = arrow_source("virtual_token", batch, label)
            try:
                run(
                    cursor,
                    f"CREATE OR REPLACE TEMP TABLE _pagedkv_tokens AS {source.scan_sql(cursor)}",
                )
            except duckdb.Error as e:
                raise InputError(f"{label}: refused", [problem_from_duckdb(label, e)]) from None
            bad, violations = staged_violations(
                cursor,
                "virtual_token",
                "_pagedkv_tokens",
                100,
                partial(_located_at, label),
            )
            if bad:
                raise ConstraintError(
                    f"{label}: {bad} token(s) violate the spec's integrity constraints",
                    violations,
                    bad,
                )
            if distinct:
                run(cursor, f"CREATE OR REPLACE TEMP TABLE _pagedkv_out AS {_RESOLVE}")
                query = (
                    "SELECT * FROM _pagedkv_out ANTI JOIN _pagedkv_seen "
                    "USING (seq_id, token_pos, physical_address) ORDER BY ALL"
                )
                out = cursor.sql(query).to_arrow_table()
                run(cursor, "INSERT INTO _pagedkv_seen SELECT * FROM _pagedkv_out")
            else:
                out = cursor.sql(f"{_RESOLVE} ORDER BY ALL").to_arrow_table()
            for piece in out.to_batches():
                yield pa.RecordBatch.from_arrays(piece.columns, schema=OUTPUT_SCHEMA)
            if out.num_rows == 0:
                yield pa.RecordBatch.from_pylist([], schema=OUTPUT_SCHEMA)
    finally:
        cursor.close()


def _located_at(label: str, keys: set[tuple[int, ...]]) -> dict[tuple[int, ...], list[str]]:
    return {key: [label] for key in keys}


def _batches(data: Any) -> Iterator[Any]:
    """Accept an iterable of batches/tables, or one reader / Arrow stream object."""
    if isinstance(data, pa.RecordBatchReader):
        yield from data
    elif isinstance(data, pa.Table):
        yield from data.to_batches()
    elif hasattr(data, "__arrow_c_stream__") and not isinstance(data, pa.RecordBatch):
        yield from pa.RecordBatchReader.from_stream(data)
    else:
        yield from data
