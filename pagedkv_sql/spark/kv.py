"""The spec's relations, resolution and checks on a SparkSession.

``SparkKV`` registers the four input relations (from Parquet directories or existing
Spark tables) as temporary views with the spec's names, then every view of ``sql/``
translated to Spark SQL (``translate.py``): ``resolved_kv_address``, its two rules, the
``spec_*`` checks and the ``diag_*`` diagnostics. Spark has no CHECK constraints, so the
spec's constraints run as validation queries: ``validate()`` raises naming the
offending rows, as a DuckDB load refuses them.

Semantics are DuckDB's: sets (every view is DISTINCT or a UNION), signed 64-bit
numbers, and ANSI mode pinned on, so an overflow raises as in DuckDB; the one addition
that must wrap (a CPU address within 255 of 2^63) wraps explicitly in the SQL itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from ..check import CheckReport, CheckResult, all_checks
from ..dbutil import check_block_size
from ..errors import InputError, PagedKVError, Problem, UsageError
from ..invariants import Check
from ..relations import INPUT_RELATIONS, OUTPUT_COLUMNS, OUTPUT_RELATION
from .layout import check_input_dir
from .session import require, spark_errors
from .translate import SETTINGS, check_partition_column, spark_views

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DEFAULT_BLOCK_SIZE = 16
# the session settings every run pins, whatever the session had
PINNED = {
    "spark.sql.ansi.enabled": "true",
    # a partition value is a string whatever it looks like ("007" stays "007")
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
}
_INTEGER_TYPES = ("ByteType", "ShortType", "IntegerType", "LongType")
UINT64 = "decimal(20,0)"  # how Spark reads a Parquet uint64 column
INT64_MAX = 2**63 - 1


class SpecViolationError(PagedKVError):
    """The input violates the spec's constraints; nothing was resolved or written."""


@dataclass(frozen=True)
class SparkCheckResult:
    """One check on Spark: its rows as a DataFrame (lazy), the count and first rows."""

    check: Check
    frame: DataFrame


class SparkKV:
    """The spec's relations and views on one SparkSession, optionally per partition value
    of a column every relation carries (``partition_by``)."""

    def __init__(
        self,
        spark: SparkSession,
        relations: Mapping[str, DataFrame],
        *,
        partition_by: str | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> None:
        check_block_size(block_size)  # the bound every reader of a block size keeps
        require()
        self.spark = spark
        self.partition_by = check_partition_column(partition_by) if partition_by else None
        self.block_size = block_size
        for key, value in PINNED.items():
            spark.conf.set(key, value)
        missing = [r for r in INPUT_RELATIONS if r not in relations]
        if missing:
            raise UsageError(f"no data given for {', '.join(missing)}")
        with spark_errors("cannot register the relations"):
            for name, columns in INPUT_RELATIONS.items():
                frame = _typed(relations[name], name, columns, self.partition_by)
                frame.createOrReplaceTempView(name)
            settings = spark.createDataFrame(
                [("schema_version", 1), ("block_size", int(block_size))],
                "name STRING, value BIGINT",
            )
            settings.createOrReplaceTempView(SETTINGS)
            for view in spark_views(self.partition_by):
                spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {view.name} AS {view.sql}")

    # -- construction ------------------------------------------------------------------
    @classmethod
    def from_parquet(
        cls,
        spark: SparkSession,
        path: str | os.PathLike[str],
        *,
        partition_by: str | None = None,
        block_size: int | None = None,
    ) -> SparkKV:
        """Read ``path/<relation>/`` for each input relation: Parquet files, laid out as
        ``<relation>/<partition_by>=<value>/*.parquet`` when partitioned (the layout of
        ``pagedkv-sql export parquet`` and of Spark's ``partitionBy``). A relation with
        no directory is empty. ``block_size`` defaults to ``pagedkv_settings/`` there,
        else 16."""
        root = str(path)
        check_input_dir(root)
        for key, value in PINNED.items():
            spark.conf.set(key, value)
        relations = {}
        with spark_errors(f"cannot read {root}"):
            for name, columns in INPUT_RELATIONS.items():
                relations[name] = _read(spark, root, name, columns, partition_by)
            if block_size is None:
                block_size = _stored_block_size(spark, root, partition_by)
        return cls(spark, relations, partition_by=partition_by, block_size=block_size)

    @classmethod
    def from_tables(
        cls,
        spark: SparkSession,
        tables: Mapping[str, str] | str,
        *,
        partition_by: str | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> SparkKV:
        """Existing Spark tables: a mapping relation -> table name, or a database (or
        ``catalog.database``) holding tables with the spec's names."""
        if isinstance(tables, str):
            tables = {r: f"{tables}.{r}" for r in INPUT_RELATIONS}
        relations = {}
        for name in INPUT_RELATIONS:
            if name not in tables:
                raise UsageError(f"no table given for {name}")
            with spark_errors(f"cannot read table {tables[name]} for {name}"):
                relations[name] = spark.table(tables[name])
        return cls(spark, relations, partition_by=partition_by, block_size=block_size)

    # -- reading -----------------------------------------------------------------------
    @property
    def columns(self) -> tuple[str, ...]:
        """The partition column, if any: the first column of every view."""
        return (self.partition_by,) if self.partition_by else ()

    def table(self, name: str) -> DataFrame:
        """Any registered relation or view as a DataFrame."""
        return self.spark.table(name)

    def resolve(self) -> DataFrame:
        """``resolved_kv_address``: a set, with the partition column first when given."""
        return self.spark.table(OUTPUT_RELATION).select(*self.columns, *OUTPUT_COLUMNS)

    def checks(self, severity: str | None = None) -> list[SparkCheckResult]:
        """Every check (or those of ``severity``) as a lazy DataFrame of offending rows."""
        return [
            SparkCheckResult(c, self.spark.table(c.name))
            for c in all_checks()
            if severity is None or c.severity == severity
        ]

    def check(
        self,
        *,
        severity: str | None = None,
        limit: int | None = 100,
        write: Callable[[str, DataFrame], DataFrame] | None = None,
    ) -> CheckReport:
        """Run the checks: each one's count and first ``limit`` rows (all when None),
        sorted, as the DuckDB ``check`` reports them. ``write(name, frame)`` may store a
        check's rows first and return what to read them back from."""
        self.refuse_nulls()
        results = []
        for result in self.checks(severity):
            frame = result.frame
            with spark_errors(f"{result.check.name} failed"):
                if write is not None:
                    frame = write(result.check.name, frame)  # then read back from there
                ordered = frame.orderBy(*frame.columns)
                if limit is None:
                    rows = ordered.toArrow()
                    total = rows.num_rows
                else:
                    rows = ordered.limit(limit).toArrow()
                    total = frame.count() if rows.num_rows == limit else rows.num_rows
            results.append(CheckResult(result.check, total, rows))
        return CheckReport(results)

    def refuse_nulls(self) -> None:
        """Raise InputError naming rows with a NULL: a fact of the spec has none (DuckDB's
        NOT NULL columns refuse them on load). One Spark job for the four relations."""
        wanted = self.columns
        parts = [
            f"SELECT '{name}' AS relation, to_json(struct(*), map('ignoreNullFields', 'false'))"
            f" AS row FROM {name} WHERE " + " OR ".join(f"{c} IS NULL" for c in (*wanted, *columns))
            for name, columns in INPUT_RELATIONS.items()
        ]
        with spark_errors("cannot read the relations"):
            rows = self.spark.sql(" UNION ALL ".join(parts) + " LIMIT 20").collect()
        if rows:
            raise InputError(
                "the input has NULL values; the spec's facts have none",
                [Problem(r.relation, None, None, r.row) for r in rows],
                hint="drop or fill those rows",
            )

    def validate(self, limit: int = 20) -> None:
        """Raise SpecViolationError naming the offending rows when the data violates one of
        the spec's constraints (Spark has no CHECK clauses to refuse them on the way in)."""
        self.refuse_nulls()
        details: list[str] = []
        total = 0
        for result in self.checks("error"):
            with spark_errors(f"{result.check.name} failed"):
                frame = result.frame
                rows = frame.orderBy(*frame.columns).limit(limit).collect()
                if not rows:
                    continue
                found = frame.count() if len(rows) == limit else len(rows)
            total += found
            for row in rows:
                values = ", ".join(f"{k} {v}" for k, v in row.asDict().items() if k != "reason")
                details.append(
                    f"{result.check.name}: {result.check.relation}({values}): {row.reason}"
                )
        if total:
            error = SpecViolationError(
                f"{total} row(s) violate the spec's constraints; nothing was resolved",
                details,
                hint="fix or drop those rows in the input; `pagedkv-sql spark check` lists all",
            )
            error.total = total  # type: ignore[attr-defined]
            raise error


# -- reading the inputs ---------------------------------------------------------------


def _hive_columns(path: Path) -> set[str]:
    """The partition columns of a local hive layout (``col=value`` directories)."""
    found: set[str] = set()
    level = [path]
    for _ in range(4):
        nxt = []
        for d in level:
            for child in d.iterdir() if d.is_dir() else ():
                if child.is_dir() and "=" in child.name and not child.name.startswith(("_", ".")):
                    found.add(child.name.split("=", 1)[0])
                    nxt.append(child)
        if not nxt:
            break
        level = nxt[:1]
    return found


def _read(
    spark: SparkSession, root: str, name: str, columns: tuple[str, ...], partition_by: str | None
) -> DataFrame:
    local = "://" not in root
    where = f"{root.rstrip('/')}/{name}"

    def schema(unsigned: Collection[str] = ()) -> str:
        typed = ", ".join(f"{c} {UINT64 if c in unsigned else 'BIGINT'}" for c in columns)
        return typed + (f", {partition_by} STRING" if partition_by else "")

    if local:
        path = Path(where)
        if not path.exists() or not any(
            p.is_file() and not p.name.startswith(("_", ".")) for p in path.rglob("*")
        ):
            return spark.createDataFrame([], schema())
        hive = _hive_columns(path)
        extra = hive - {partition_by}
        if extra:
            column = sorted(extra)[0]
            raise InputError(
                f"{where} is partitioned by {column} ({column}=... directories) but "
                + ("no --partition-by was given" if not partition_by else f"not by {partition_by}"),
                hint=f"pass --partition-by {column}, so that each {column} is resolved on its "
                "own and no two are mixed",
            )
        if partition_by in hive or not partition_by:
            # the types checked from the files' footers here, Spark reads with a given
            # schema instead of running a job to infer one (uint64 as Spark reads it)
            unsigned = _check_file_types(where, name, columns)
            return spark.read.schema(schema(unsigned)).parquet(where)
    return spark.read.parquet(where)


def _check_file_types(where: str, name: str, columns: tuple[str, ...]) -> set[str]:
    """Refuse a column that is not an integer type; return the uint64 ones (their values
    are checked to fit in int64 once read, by _refuse_beyond_int64)."""
    import pyarrow.dataset as ds

    try:
        schema = ds.dataset(where, format="parquet", partitioning="hive").schema
    except (OSError, ValueError, pa.ArrowException) as e:
        raise InputError(f"cannot read {where}: {str(e).splitlines()[0]}") from None
    unsigned = set()
    for c in columns:
        if c not in schema.names:
            continue  # _typed names what is missing
        kind = schema.field(c).type
        if kind == pa.uint64():
            unsigned.add(c)
        elif not pa.types.is_integer(kind):
            raise InputError(
                f"{name}.{c} is {kind} in {where}, not a signed 64-bit integer",
                hint="every attribute of the spec is a signed 64-bit integer; write it as "
                "int64 (or a narrower integer)",
            )
    return unsigned


def _typed(
    frame: DataFrame, name: str, columns: tuple[str, ...], partition_by: str | None
) -> DataFrame:
    """The relation's columns as BIGINT (and the partition column as STRING), refusing a
    missing column, a non-integer type or a NULL."""
    from pyspark.sql import functions as F

    types = {f.name: type(f.dataType).__name__ for f in frame.schema.fields}
    unsigned = [
        f.name
        for f in frame.schema.fields
        if f.name in columns and f.dataType.simpleString() == UINT64
    ]
    wanted = (*columns, partition_by) if partition_by else columns
    missing = [c for c in wanted if c not in types]
    if missing:
        hint = (
            f"lay the files out as {name}/{partition_by}=VALUE/*.parquet, or keep a "
            f"{partition_by} column in them"
            if partition_by in missing
            else f"{name} has the columns {', '.join(columns)}"
        )
        raise InputError(
            f"{name} has no column {', '.join(missing)} (it has: {', '.join(types) or 'none'})",
            hint=hint,
        )
    for c in columns:
        if types[c] not in _INTEGER_TYPES and c not in unsigned:
            raise InputError(
                f"{name}.{c} is {types[c].removesuffix('Type').lower()}, not an integer type",
                hint="every attribute of the spec is a signed 64-bit integer; write it as "
                "int64 (or a narrower integer)",
            )
    if unsigned:
        _refuse_beyond_int64(frame, name, unsigned)
    selected = [F.col(c).cast("bigint").alias(c) for c in columns]
    if partition_by:
        selected.insert(0, F.col(partition_by).cast("string").alias(partition_by))
    return frame.select(*selected)


def _refuse_beyond_int64(frame: DataFrame, name: str, unsigned: list[str], limit: int = 20) -> None:
    """A uint64 column is taken when every value fits in a signed 64-bit integer, as the
    DuckDB load takes it; else an InputError names the column, file and row (1-based, as
    the load names rows) of each value beyond, nothing read. One Spark job, which only
    inputs with a uint64 column pay."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    beyond = [F.col(c) > F.lit(INT64_MAX) for c in unsigned]
    condition = beyond[0]
    for more in beyond[1:]:
        condition = condition | more
    found = frame.where(condition)
    try:  # where each row is: Parquet's hidden file metadata (a file source only)
        located = found.select("_metadata.file_path", "_metadata.row_index", *unsigned)
        located = located.orderBy("file_path", "row_index").limit(limit)
        rows = [(f"{_local(r[0])} row {r[1] + 1}", r[2:]) for r in located.collect()]
    except AnalysisException:  # a table without file metadata: the row's values
        others = [c for c in frame.columns if c not in unsigned]
        ordered = found.select(*others, *unsigned).orderBy(*others, *unsigned)
        shown = ordered.limit(limit).collect()
        rows = [
            (f"{name} row ({', '.join(f'{c} {r[c]}' for c in others)})", r[len(others) :])
            for r in shown
        ]
    if not rows:
        return
    total = found.count() if len(rows) == limit else len(rows)
    problems = [
        Problem(where, None, None, f"column {c} holds {v}, beyond the signed 64-bit range")
        for where, values in rows
        for c, v in zip(unsigned, values, strict=True)
        if v > INT64_MAX
    ]
    raise InputError(
        f"{name}: {total} row(s) with a uint64 value beyond the signed 64-bit range; "
        "nothing was read",
        problems,
        total,
        hint="every attribute of the spec is a signed 64-bit integer: fix or drop those rows "
        "(a uint64 column whose values all fit is read as it is)",
    )


def _local(uri: str) -> str:
    """A file's path as the user wrote it: ``file:///tmp/x`` -> ``/tmp/x``."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme == "file" else uri


def _stored_block_size(spark: SparkSession, root: str, partition_by: str | None) -> int:
    where = f"{root.rstrip('/')}/{SETTINGS}"
    if "://" in root:
        try:
            rows = spark.read.parquet(where).where("name = 'block_size'").collect()
        except Exception:
            return DEFAULT_BLOCK_SIZE
        sizes = sorted({int(r.value) for r in rows})
    else:
        if not Path(where).exists():
            return DEFAULT_BLOCK_SIZE
        import pyarrow.dataset as ds

        try:
            table = ds.dataset(where, format="parquet", partitioning="hive").to_table(
                columns=["name", "value"]
            )
        except (OSError, ValueError, pa.ArrowException) as e:
            raise InputError(f"cannot read {where}: {e}") from None
        values = table.to_pydict()
        sizes = sorted(
            {
                int(v)
                for n, v in zip(values["name"], values["value"], strict=True)
                if n == "block_size"
            }
        )
    if len(sizes) > 1:
        raise UsageError(
            f"the partitions of {root} have different block sizes ({', '.join(map(str, sizes))})",
            hint="pass --block-size, or check each block size's partitions in a run of its own",
        )
    return sizes[0] if sizes else DEFAULT_BLOCK_SIZE
