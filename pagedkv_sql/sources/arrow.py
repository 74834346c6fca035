"""The Arrow family: Parquet and Arrow IPC files, Python objects with the Arrow interface
(scanned by DuckDB in place), and the facts of a .dl file once parsed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from ..errors import InputError, UsageError
from ..relations import INPUT_RELATIONS, arrow_schema
from .base import Source, column_problems, source_serial


@dataclass
class ArrowSource(Source):
    """Anything DuckDB scans as Arrow (Table, RecordBatchReader, PyCapsule stream, Dataset)
    or a Parquet file. Integer columns of any width are cast to BIGINT when they fit."""

    data: Any = None
    parquet: Path | None = None
    schema: pa.Schema = field(default_factory=pa.schema)
    name: str = ""

    def __post_init__(self) -> None:
        self.name = f"_pagedkv_src_{next(source_serial)}"
        columns = INPUT_RELATIONS[self.relation]
        names = list(self.schema.names)
        problems = column_problems(columns, names)
        if len(set(names)) < len(names):  # a repeated column: its type is not one
            raise InputError(
                f"{self.label}: {self.relation}: {'; '.join(problems)}",
                hint=f"give each of the columns {', '.join(columns)} once",
            )
        for f in self.schema:
            if f.name in columns and not pa.types.is_integer(f.type):
                kind = "null (every value is missing)" if pa.types.is_null(f.type) else f.type
                problems.append(f"column {f.name} has type {kind}, not an integer type")
        if problems:
            raise InputError(
                f"{self.label}: {self.relation}: {'; '.join(problems)}",
                hint=f"give integer columns named {', '.join(columns)} "
                "(any width; values must fit in a signed 64-bit integer)",
            )

    def _column_sql(self, column: str) -> str:
        typ = self.schema.field(column).type
        c = f'"{column}"'
        where = f"column {column}"
        checks = f"WHEN {c} IS NULL THEN error('pagedkv: {where} holds a null') "
        if typ in (pa.uint64(),):
            checks += (
                f"WHEN {c} > 9223372036854775807 THEN error('pagedkv: {where} holds ' || "
                f"{c} || ', beyond the signed 64-bit range') "
            )
        return f"CASE {checks}ELSE CAST({c} AS BIGINT) END AS {column}"

    def scan_sql(self, con: duckdb.DuckDBPyConnection) -> str:
        if self.parquet is not None:
            table = f"read_parquet({self.duckdb_path(self.parquet)})"
        else:
            con.register(self.name, self.data)
            table = self.name
        select = ", ".join(self._column_sql(c) for c in INPUT_RELATIONS[self.relation])
        return f"SELECT {select} FROM {table}"

    def locate(
        self, con: duckdb.DuckDBPyConnection, rows: set[tuple[int, ...]]
    ) -> dict[tuple[int, ...], list[str]]:
        if self.parquet is None and not isinstance(self.data, pa.Table):
            return {}
        table = pq_read(self.parquet) if self.parquet is not None else self.data
        columns = INPUT_RELATIONS[self.relation]
        arrays = [table.column(c).cast(pa.int64()).to_pylist() for c in columns]
        found: dict[tuple[int, ...], list[str]] = {}
        for i, key in enumerate(zip(*arrays, strict=True)):
            if key in rows:
                found.setdefault(key, []).append(f"{self.label} row {i + 1}")
        return found

    def close(self) -> None:
        self.data = None
        super().close()


def pq_read(path: Path) -> pa.Table:
    import pyarrow.parquet as pq

    return pq.read_table(path)


@dataclass
class DatalogRows(Source):
    """The facts of one relation from a .dl file, already parsed (with their lines)."""

    rows: list[tuple[int, ...]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    inner: ArrowSource | None = None

    def __post_init__(self) -> None:
        columns = INPUT_RELATIONS[self.relation]
        table = pa.Table.from_arrays(
            [pa.array([r[i] for r in self.rows], pa.int64()) for i in range(len(columns))],
            schema=arrow_schema(self.relation),
        )
        self.inner = ArrowSource(self.relation, self.label, data=table, schema=table.schema)

    def scan_sql(self, con: duckdb.DuckDBPyConnection) -> str:
        assert self.inner is not None
        return self.inner.scan_sql(con)

    def locate(
        self, con: duckdb.DuckDBPyConnection, rows: set[tuple[int, ...]]
    ) -> dict[tuple[int, ...], list[str]]:
        found: dict[tuple[int, ...], list[str]] = {}
        for row, line in zip(self.rows, self.lines, strict=True):
            if row in rows:
                found.setdefault(row, []).append(f"{self.label}:{line}")
        return found


def arrow_source(relation: str, data: Any, label: str) -> ArrowSource:
    """An ArrowSource for any Arrow-shaped Python object, scanned without copying."""
    reusable = True
    if isinstance(data, Mapping):  # column name -> array: numpy, torch (CUDA copied once)...
        from ..arrays import columns_table

        data = columns_table(data, label)
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        schema = data.schema
    elif isinstance(data, pa.RecordBatchReader):
        schema, reusable = data.schema, False
    elif all(hasattr(type(data), a) for a in ("scanner", "to_batches", "schema")):
        # a pyarrow.dataset.Dataset, DuckDB scans it lazily (asked of its type: an object's
        # attribute may be a property that computes, as a polars LazyFrame's schema does)
        schema = data.schema
    elif hasattr(type(data), "__arrow_c_stream__"):
        data = pa.RecordBatchReader.from_stream(data)
        schema, reusable = data.schema, False
    else:
        lazy = hasattr(type(data), "collect")  # a query (polars LazyFrame), not its rows
        raise UsageError(
            f"cannot load a {type(data).__name__} as {relation}: give a pyarrow Table, "
            "RecordBatch, RecordBatchReader, Dataset, an object with __arrow_c_stream__ or a "
            "dict of column name -> array",
            hint="collect() it first: it is a query, not its rows" if lazy else "",
        )
    return ArrowSource(relation, label, reusable=reusable, data=data, schema=schema)
