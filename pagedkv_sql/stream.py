"""Resolve a stream of token batches against the stored block tables without storing the
tokens.

Each batch is resolved as ``resolve`` resolves the stored tokens: both rules as a bag,
sorted, exact duplicates dropped as neighbours (no hash of the output). Across batches
(``distinct``) a row can repeat one given before only if its key (seq_id, token_pos) is
at most the largest key given so far, the *watermark*: in sorted output those rows are a
prefix of the batch, and only that prefix is checked against the rows given before. A
stream in key order (the usual case: an engine's tokens by sequence) has no such prefix,
so it is never joined. The rows given are kept for that check batch by batch, sorted and
lz4-compressed in memory, each with its key range (docs/performance.md).
"""

from __future__ import annotations

import contextlib
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
    "SELECT * FROM (SELECT * FROM pagedkv_resolve_gpu('_pagedkv_tokens') "
    "UNION ALL SELECT * FROM pagedkv_resolve_cpu('_pagedkv_tokens')) ORDER BY ALL"
)
Key = tuple[int, int]


def resolve_stream(
    con: duckdb.DuckDBPyConnection, token_batches: Any, *, distinct: bool
) -> Iterator[pa.RecordBatch]:
    """Yield, for each batch of virtual_token rows, its resolved addresses (sorted). With
    ``distinct`` (the default) a row already yielded for an earlier batch is not yielded
    again, so the union of the output is exactly ``resolve()`` over all the tokens; that
    keeps the rows yielded so far (lz4-compressed). Without it memory stays bounded by a
    batch and only duplicates inside one batch collapse."""
    cursor = con.cursor()
    seen: _Seen | None = None
    try:
        if distinct:
            seen = _Seen(cursor)
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
            finally:
                _unregister(cursor, source.name)  # let the batch go: it has been copied
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
            out = distinct_sorted(cursor.sql(_RESOLVE).to_arrow_table())
            if seen is not None:
                out = seen.new_rows(out)
            for piece in out.to_batches():
                yield pa.RecordBatch.from_arrays(piece.columns, schema=OUTPUT_SCHEMA)
            if out.num_rows == 0:
                yield pa.RecordBatch.from_pylist([], schema=OUTPUT_SCHEMA)
    finally:
        if seen is not None:
            seen.close()
        cursor.close()


def distinct_sorted(table: pa.Table) -> pa.Table:
    """A sorted table without exact duplicates: in sorted rows they can only be
    neighbours, so one vectorised compare with the row before finds them."""
    n = table.num_rows
    if n < 2:
        return table
    import numpy as np  # numpy, not pyarrow.compute on slices: that crashes pyarrow 15

    keep = np.zeros(n, bool)
    keep[0] = True
    for c in table.columns:  # the output's columns: int64 without nulls
        values = c.to_numpy()
        keep[1:] |= values[1:] != values[:-1]
    if keep.all():
        return table
    return table.filter(pa.array(keep))


class _Seen:
    """The rows a distinct stream has given, batch by batch, each kept sorted and
    compressed (Arrow IPC, lz4: about a sixth of the size) with its first and last key;
    and the watermark, the largest (seq_id, token_pos) given so far."""

    def __init__(self, cursor: duckdb.DuckDBPyConnection) -> None:
        self.cursor = cursor
        self.watermark: Key | None = None
        self.given: list[tuple[Key, Key, pa.Buffer]] = []  # (first key, last key, rows)

    def new_rows(self, out: pa.Table) -> pa.Table:
        """``out`` (sorted, no duplicates) less the rows given before; remembered as
        given."""
        if out.num_rows == 0:
            return out
        if self.watermark is not None and _key(out, 0) <= self.watermark:
            out = self._unseen(out, _prefix(out, self.watermark))
        if out.num_rows:
            self._remember(out)
            last = _key(out, out.num_rows - 1)
            self.watermark = last if self.watermark is None else max(self.watermark, last)
        return out

    def _unseen(self, out: pa.Table, prefix: int) -> pa.Table:
        """``out`` less the rows given before, among its first ``prefix`` rows (the
        rest are new by the watermark): they are joined with each earlier batch whose
        key range meets theirs, one batch at a time."""
        head, tail = out.slice(0, prefix), out.slice(prefix)
        first, last = _key(head, 0), _key(head, prefix - 1)
        joined = False
        for low, high, rows in self.given:
            if high < first or low > last or head.num_rows == 0:
                continue
            self.cursor.register("_pagedkv_head", head)
            self.cursor.register("_pagedkv_given", pa.ipc.open_stream(rows).read_all())
            try:
                head = self.cursor.sql(
                    "SELECT * FROM _pagedkv_head ANTI JOIN _pagedkv_given "
                    "USING (seq_id, token_pos, physical_address)"
                ).to_arrow_table()
            finally:
                _unregister(self.cursor, "_pagedkv_head")
                _unregister(self.cursor, "_pagedkv_given")
            joined = True
        if joined:  # a join does not keep the order
            head = head.sort_by([(c, "ascending") for c in head.column_names])
        head = pa.Table.from_batches(head.to_batches(), schema=out.schema)
        return pa.concat_tables([head, tail])

    def _remember(self, out: pa.Table) -> None:
        sink = pa.BufferOutputStream()
        options = pa.ipc.IpcWriteOptions(compression="lz4")
        with pa.ipc.new_stream(sink, out.schema, options=options) as writer:
            writer.write_table(out)
        self.given.append((_key(out, 0), _key(out, out.num_rows - 1), sink.getvalue()))

    def close(self) -> None:
        self.given.clear()


def _prefix(out: pa.Table, watermark: Key) -> int:
    """How many leading rows of sorted ``out`` have a key at most ``watermark``."""
    import pyarrow.compute as pc

    seq, pos = watermark
    s, p = out.column("seq_id"), out.column("token_pos")
    above = pc.or_(pc.greater(s, seq), pc.and_(pc.equal(s, seq), pc.greater(p, pos)))
    # sorted: the rows above the watermark are a suffix
    return int(out.num_rows - (pc.sum(above).as_py() or 0))


def _unregister(cursor: duckdb.DuckDBPyConnection, name: str) -> None:
    with contextlib.suppress(duckdb.Error):  # never registered: the scan failed before
        cursor.unregister(name)


def _key(table: pa.Table, i: int) -> Key:
    return (table.column("seq_id")[i].as_py(), table.column("token_pos")[i].as_py())


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
