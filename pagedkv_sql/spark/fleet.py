"""`spark fleet check`: the views of sql/fleet.sql on Spark, translated, never copied.

A fleet directory is read by DuckDB (``fleet.tables.load``: the same reader, checks and
errors as `fleet check`) and its input tables are written as Parquet, one directory a
table (``export``); Spark reads those and runs every statement of ``fleet_views``
translated from DuckDB SQL by sqlglot, each table materialized once (a local checkpoint),
then the UPDATE ``fleet_inherit_cause`` as a join until nothing changes, then the check
statements; ``fleet.checker.assemble`` turns their rows into the same ``FleetReport`` as
DuckDB's. Differences of dialect are mapped here: DuckDB's ``hash`` (a key of the sweep)
becomes ``xxhash64`` (64 bits, as DuckDB's), ``quantile_cont(x, q)`` ``percentile(x, q)``
(the same linear interpolation)."""

from __future__ import annotations

import os
import tempfile
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlglot
from sqlglot import exp

from ..fleet import tables
from ..fleet.checker import DEFAULT_LAG, FleetReport, assemble, check_lag
from .session import spark_errors

if TYPE_CHECKING:
    import duckdb
    from pyspark.sql import SparkSession

ROW_ID = "_pkv_row"
CHECKS = (
    "fleet_check_false_residency",
    "fleet_check_missed_residency",
    "fleet_check_prefix_false_hit",
    "fleet_check_misroute",
    "fleet_summary",
)
PINNED = {"spark.sql.ansi.enabled": "true"}  # overflow raises, as in DuckDB


@cache
def input_tables() -> tuple[str, ...]:
    """The fleet's input tables (sql/fleet_load.sql's fleet_tables), in order."""
    trees = sqlglot.parse(tables.sql()["fleet_tables"], read="duckdb")
    return tuple(t.this.this.name for t in trees if isinstance(t, exp.Create))


def export(cur: duckdb.DuckDBPyConnection, out: Path) -> None:
    """Each loaded input table as Parquet: ``out/<table>/data.parquet``."""
    for name in input_tables():
        (out / name).mkdir(parents=True, exist_ok=True)
        target = str(out / name / "data.parquet").replace("'", "''")
        cur.execute(f"COPY {name} TO '{target}' (FORMAT PARQUET)")


def _spark_dialect(node: exp.Expr) -> exp.Expr:
    if isinstance(node, exp.Anonymous) and node.name.lower() == "hash":
        return exp.Anonymous(this="xxhash64", expressions=node.expressions)
    if isinstance(node, exp.PercentileCont) and node.expression:  # quantile_cont(x, q)
        return exp.Anonymous(this="percentile", expressions=[node.this, node.expression])
    return node


def to_spark(tree: exp.Expr) -> str:
    """A DuckDB statement's tree as Spark SQL."""
    return tree.transform(_spark_dialect).sql(dialect="spark")


def spark_query(sql: str) -> str:
    """One DuckDB query of sql/fleet.sql as Spark SQL."""
    return to_spark(sqlglot.parse_one(sql, read="duckdb"))


@cache
def view_statements() -> tuple[tuple[str, bool, str], ...]:
    """fleet_views as (name, materialized, Spark SQL query), in order."""
    out = []
    for tree in sqlglot.parse(tables.sql()["fleet_views"], read="duckdb"):
        assert isinstance(tree, exp.Create), tree
        kind = str(tree.args.get("kind") or "").upper()
        out.append((tree.this.name, kind == "TABLE", to_spark(tree.expression)))
    return tuple(out)


def inherit_query(columns: list[str]) -> tuple[str, str]:
    """fleet_inherit_cause (an UPDATE ... FROM) as two Spark queries: the rows it sets
    (by ``_pkv_row``, the smallest new values where several match) and the table after."""
    tree = sqlglot.parse_one(tables.sql()["fleet_inherit_cause"], read="duckdb")
    assert isinstance(tree, exp.Update)
    target = tree.this.name
    sets = {e.this.name: e.expression for e in tree.expressions}
    values = ", ".join(f"'{c}', {to_spark(v)}" for c, v in sets.items())
    froms = [tree.args["from_"].this, *(tree.args.get("joins") or [])]
    sources = ", ".join(to_spark(f.this if isinstance(f, exp.Join) else f) for f in froms)
    where = to_spark(tree.args["where"].this)
    changed = (
        f"SELECT {target}.{ROW_ID}, min(named_struct({values})) AS _pkv_new "
        f"FROM {target}, {sources} WHERE {where} GROUP BY {target}.{ROW_ID}"
    )
    cols = ", ".join(
        f"CASE WHEN u.{ROW_ID} IS NULL THEN t.{c} ELSE u._pkv_new.{c} END AS {c}"
        if c in sets
        else f"t.{c}"
        for c in columns
    )
    after = f"SELECT {cols} FROM {target} t LEFT JOIN _pkv_changed u ON u.{ROW_ID} = t.{ROW_ID}"
    return changed, after


def _materialize(spark: SparkSession, name: str, query: str) -> None:
    frame = spark.sql(query).localCheckpoint(eager=True)
    frame.createOrReplaceTempView(name)


def run(spark: SparkSession, parquet: Path, report: FleetReport) -> None:
    """The fleet's input tables from ``parquet`` (``export``'s layout) on ``spark``, every
    view and check of sql/fleet.sql run there, ``report`` filled."""
    for key, value in PINNED.items():
        spark.conf.set(key, value)
    for name in input_tables():
        spark.read.parquet(str(parquet / name)).createOrReplaceTempView(name)
    for name, materialized, query in view_statements():
        if name == "fleet_residency":  # a row id: the UPDATE's rows found by it
            query = f"SELECT *, monotonically_increasing_id() AS {ROW_ID} FROM ({query})"
        if materialized:
            _materialize(spark, name, query)
        else:
            spark.sql(query).createOrReplaceTempView(name)
    columns = spark.table("fleet_residency").columns
    changed_sql, after_sql = inherit_query(columns)
    for _ in range(1000):  # a chain of stores onto a dropped parent, a link a pass
        changed = spark.sql(changed_sql).localCheckpoint(eager=True)
        if changed.isEmpty():
            break
        changed.createOrReplaceTempView("_pkv_changed")
        _materialize(spark, "fleet_residency", after_sql)
    for name in ("fleet_event", "fleet_truth", "fleet_belief", "fleet_decision"):
        report.counts[name] = spark.table(name).count()
    report.misroute_checked = spark.table("fleet_request_hash").count() > 0
    statements = tables.sql()

    def rows(name: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        frame = spark.sql(spark_query(statements[name]))
        return frame.columns, [tuple(r) for r in frame.collect()]

    assemble(report, rows)


def check(
    spark: SparkSession,
    directory: str | os.PathLike[str],
    *,
    lag: float = DEFAULT_LAG,
    parquet: str | os.PathLike[str] | None = None,
) -> FleetReport:
    """`fleet check` on Spark: the directory read as `fleet check` reads it, its tables
    written as Parquet (to ``parquet``, else a temporary directory), the views run on
    ``spark``; the same ``FleetReport`` as ``pagedkv_sql.fleet.check`` gives."""
    import duckdb

    lag = check_lag(lag)
    path = Path(directory)
    report = FleetReport(str(path), lag)
    with tempfile.TemporaryDirectory(prefix="pagedkv-fleet-") as tmp:
        out = Path(parquet) if parquet is not None else Path(tmp)
        with duckdb.connect(":memory:") as con:
            tables.load(con, path)
            con.execute("DELETE FROM fleet_lag")
            con.execute("INSERT INTO fleet_lag VALUES (?)", [lag])
            export(con, out)
        with spark_errors("spark fleet check failed"):
            run(spark, out, report)
    return report
