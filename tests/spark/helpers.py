"""The Spark tier's data: fleets of replicas written as `export parquet` lays them out, and
the rows of DuckDB's and Spark's answers as sets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import pagedkv_sql
from pagedkv_sql.check import all_checks, run_checks
from pagedkv_sql.relations import INPUT_RELATIONS

from ..helpers import arrow_table

Facts = dict[str, list[tuple[int, ...]]]
Row = tuple[Any, ...]
PART = "replica"


def frozen(value: Any) -> Any:
    """A row value that can go in a set (lists become tuples)."""
    return tuple(value) if isinstance(value, list) else value


def rows_of(table: pa.Table) -> set[Row]:
    return {tuple(frozen(v) for v in r.values()) for r in table.to_pylist()}


def write_fleet(root: Path, cases: list[Facts], *, partitioned: bool = True) -> Path:
    """Each case as one partition value (replica=0, 1, ...) of a Parquet data set laid out
    as `pagedkv-sql export parquet` lays it out; exact duplicates kept as given."""
    for relation in INPUT_RELATIONS:
        tables = []
        for i, case in enumerate(cases):
            table = arrow_table(relation, case.get(relation, []))
            if partitioned:
                table = table.append_column(PART, pa.array([str(i)] * table.num_rows, pa.string()))
            tables.append(table)
        data = pa.concat_tables(tables)
        if partitioned:
            pq.write_to_dataset(data, root / relation, partition_cols=[PART])
            # a replica without rows of this relation has no directory: Spark sees no
            # rows for it, as DuckDB sees an empty table
        else:
            (root / relation).mkdir(parents=True)
            pq.write_table(data, root / relation / "part-0.parquet")
    return root


def duckdb_answers(case: Facts, block_size: int) -> dict[str, set[Row]]:
    """resolved_kv_address and every check's rows, from DuckDB, for valid facts."""
    with pagedkv_sql.connect(":memory:") as db:
        for relation, rows in case.items():
            db.load_arrow(relation, arrow_table(relation, rows), diagnostics=False)
        out = {"resolved_kv_address": rows_of(db.resolve().read_all())}
        for r in run_checks(db.con, block_size=block_size, limit=None):
            out[r.name] = rows_of(r.rows)
    return out


def duckdb_spec_rows(case: Facts) -> dict[str, set[Row]]:
    """The spec checks' rows on facts that violate them (which a load refuses): the same
    macros, run on tables without the CHECK clauses."""
    import duckdb

    from pagedkv_sql.sqlfiles import statement

    con = duckdb.connect()
    try:
        for check in all_checks():
            if check.severity == "error":
                con.execute(statement(f"macro_{check.name}"))
        for relation in INPUT_RELATIONS:
            staged = arrow_table(relation, case.get(relation, []))  # noqa: F841 (scanned)
            con.execute(f"CREATE TABLE stage_{relation} AS SELECT * FROM staged")
        out = {}
        for check in all_checks():
            if check.severity == "error":
                found = con.sql(f"SELECT * FROM pagedkv_{check.name}('stage_{check.relation}')")
                out[check.name] = rows_of(found.to_arrow_table())
        return out
    finally:
        con.close()


def spark_rows(table: pa.Table, partitioned: bool = True) -> dict[str, set[Row]]:
    """Rows of a Spark result (partition column first) grouped by partition value."""
    by: dict[str, set[Row]] = {}
    for row in table.to_pylist():
        values = [frozen(v) for v in row.values()]
        key = values.pop(0) if partitioned else ""
        by.setdefault(key, set()).add(tuple(values))
    return by
