"""The `spark` command group and `export parquet`: thin commands over pagedkv_sql.spark.

Nothing here imports pyspark or sqlglot at import time: the CLI lists these commands, and
only running one of them loads Spark (or says how to install it).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..errors import PagedKVError
from ..formats import ReportFormat
from ..paths import DEFAULT_DB
from . import common
from .common import guard

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from ..spark.kv import SparkKV
    from ..spark.progress import Progress

SPARK_HELP = (
    "Resolve and check on Apache Spark: Parquet in, Parquet out, one partition value "
    "(a replica, a snapshot) at a time. Needs the spark extra and Java 17+."
)


class FleetFormat(str, Enum):
    text = "text"
    json = "json"


SPARK_FLEET_HELP = (
    "A fleet behind a KV-aware router checked on Spark: the views of `fleet check`, "
    "the same rows (docs/fleet.md, 'On Spark')."
)
SPARK_DB_HINT = (
    "drop --db: Spark reads Parquet (--input); to take a database there, export it first: "
    "`pagedkv-sql export parquet --db DB DIR`, then `--input DIR`"
)


def register(app: typer.Typer) -> None:
    spark = common.group(app, "spark", help=SPARK_HELP)
    spark.command("resolve")(spark_resolve)
    spark.command("check")(spark_check)
    fleet = common.group(spark, "fleet", help=SPARK_FLEET_HELP)
    fleet.command("check")(spark_fleet_check)
    common.group(app, "export").command("parquet")(export_parquet)


InputOption = typer.Option(
    ...,
    "--input",
    "-i",
    metavar="DIR",
    help="Directory with root_table/ block_table_entry/ virtual_token/ swapped_block/ "
    "(Parquet; the layout of `pagedkv-sql export parquet`).",
    show_default=False,
)
PartitionOption = typer.Option(
    None,
    "--partition-by",
    "-p",
    metavar="COLUMN",
    help="Resolve and check each value of COLUMN on its own (a replica=... or "
    "snapshot=... directory level, or a column in the files); output is partitioned by it.",
    show_default=False,
)
MasterOption = typer.Option(
    None,
    "--master",
    metavar="URL",
    help="Spark master: local[N], spark://HOST:PORT, yarn, k8s://... (default local[2]).",
    show_default=False,
)
ConfOption = typer.Option(
    None,
    "--conf",
    metavar="KEY=VALUE",
    help="A Spark setting; repeat for more.",
    show_default=False,
)
OverwriteOption = common.overwrite_option(
    "Replace existing output (partitioned: only the partition values written now)."
)


@contextmanager
def _running(
    master: str | None, settings: dict[str, str]
) -> Iterator[tuple[SparkSession, Progress]]:
    from ..spark.progress import Progress
    from ..spark.session import log_path, remove_log, require, session

    require()
    log = log_path()  # a private new directory: never a guessable name in /tmp
    try:
        from pyspark.sql import SparkSession

        # a session already running in this process (a notebook, a test) is used, not stopped
        mine = SparkSession.getActiveSession() is None
        spark = session(master, settings, log=str(log))
        try:
            # -q: Spark's progress goes nowhere (errors still reach stderr)
            stream = io.StringIO() if common.quiet() else sys.stderr
            yield spark, Progress(spark.sparkContext, stream, tty=stream.isatty())
        finally:
            if mine:
                spark.stop()
    except PagedKVError as e:
        if log.exists() and log.stat().st_size:
            e.hint = (e.hint + "; " if e.hint else "") + f"Spark's own log: {log}"
        else:
            remove_log(log)
        raise
    except BaseException:
        remove_log(log)
        raise
    else:
        remove_log(log)


def _read_input(
    spark: SparkSession,
    progress: Progress,
    input_dir: str,
    partition_by: str | None,
    block_size: int | None = None,
) -> SparkKV:
    from ..spark.kv import SparkKV

    with progress.step("reading the input"):
        return SparkKV.from_parquet(
            spark, input_dir, partition_by=partition_by, block_size=block_size
        )


def _target(output_dir: str, name: str, overwrite: bool) -> str:
    from ..errors import UsageError

    target = f"{output_dir.rstrip('/')}/{name}"
    local = Path(target)
    if "://" not in target and local.exists() and any(local.iterdir()) and not overwrite:
        raise UsageError(
            f"{target} already holds data",
            hint="pass --overwrite to replace it (partitioned: only the values written now)",
        )
    return target


def _write_frame(kv: SparkKV, frame: DataFrame, target: str) -> None:
    writer = frame.write.mode("overwrite").option("compression", "zstd")
    if kv.partition_by:
        kv.spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
        writer = writer.partitionBy(kv.partition_by)
    writer.parquet(target)


def spark_resolve(
    input_dir: str = InputOption,
    output_dir: str = typer.Option(
        ...,
        "--output",
        "-o",
        metavar="DIR",
        help="Write DIR/resolved_kv_address/ (Parquet, partitioned like the input).",
        show_default=False,
    ),
    partition_by: str | None = PartitionOption,
    master: str | None = MasterOption,
    conf: list[str] | None = ConfOption,
    overwrite: bool = OverwriteOption,
    max_errors: int = common.max_errors_option("Offending rows listed (0: all).", 20),
    db: str | None = common.unused_db_option(),
) -> None:
    """Check the spec's constraints (refusing violating input, naming rows), then write
    resolved_kv_address: the same set DuckDB's `resolve` gives, per partition value."""
    from ..relations import OUTPUT_RELATION
    from ..spark.layout import check_input_dir
    from ..spark.session import parse_conf, require, spark_errors

    with guard(max_errors):
        common.refuse_db(db, "spark resolve", SPARK_DB_HINT)
        settings = parse_conf(conf)
        require()  # the extra first: without it nothing else can be said
        check_input_dir(input_dir)
        target = _target(output_dir, OUTPUT_RELATION, overwrite)
        with _running(master, settings) as (spark, progress):
            kv = _read_input(spark, progress, input_dir, partition_by)
            with progress.step("checking the spec's constraints"):
                kv.validate(limit=max_errors or 1_000_000)
            with progress.step("resolving"), spark_errors("resolve failed"):
                _write_frame(kv, kv.resolve(), target)
            with progress.step("counting the output"), spark_errors("reading the output"):
                written = spark.read.parquet(target)
                if kv.partition_by:
                    parts = written.groupBy(kv.partition_by).count().collect()
                    rows, values = sum(int(r["count"]) for r in parts), len(parts)
                else:
                    rows, values = written.count(), 1
        where = f" in {values} {kv.partition_by} value(s)" if kv.partition_by else ""
        typer.echo(f"wrote {rows} resolved address(es){where} to {target}", err=True)


def spark_check(
    input_dir: str = InputOption,
    output_dir: str | None = typer.Option(
        None,
        "--output",
        "-o",
        metavar="DIR",
        help="Also write every check's offending rows to DIR/<check>/ (Parquet, partitioned "
        "like the input).",
        show_default=False,
    ),
    partition_by: str | None = PartitionOption,
    master: str | None = MasterOption,
    conf: list[str] | None = ConfOption,
    overwrite: bool = OverwriteOption,
    strict: bool = common.strict_option("Count warnings as errors (exit 1)."),
    fmt: ReportFormat | None = common.format_option(
        "text (default; alias table), json (one document), or the summary (one row a check) as "
        "jsonl, csv, tsv, arrow, arrows or parquet (default: from the --report extension, "
        "else text), as `pagedkv-sql check` writes them."
    ),
    report_file: str | None = typer.Option(
        None,
        "--report",
        "-r",
        metavar="FILE",
        help="Write the report to FILE (complete or not at all) instead of standard output "
        "(-o is the directory of the checks' rows).",
        show_default=False,
    ),
    limit: int = common.limit_option(20, "Offending rows shown per check (0: all)."),
    block_size: int | None = common.block_size_option(
        "Block size in tokens (default: the input's pagedkv_settings/, else 16)."
    ),
    db: str | None = common.unused_db_option(),
) -> None:
    """Run the spec's constraints (errors) and the diagnostics (warnings) on Spark: the
    same rows as DuckDB's `check`, each with its partition value; exit 1 on errors."""
    from ..check import all_checks
    from ..spark.layout import check_input_dir
    from ..spark.session import parse_conf, require, spark_errors

    with guard():
        report_as = common.report_format(report_file, fmt, "--report")
        common.refuse_db(db, "spark check", SPARK_DB_HINT)
        settings = parse_conf(conf)
        require()  # the extra first: without it nothing else can be said
        check_input_dir(input_dir)
        targets = {}
        if output_dir is not None:
            targets = {c.name: _target(output_dir, c.name, overwrite) for c in all_checks()}
        with _running(master, settings) as (spark, progress):
            kv = _read_input(spark, progress, input_dir, partition_by, block_size)

            def write(name: str, frame: DataFrame) -> DataFrame:
                if name not in targets:
                    return frame
                _write_frame(kv, frame, targets[name])
                # with the schema given: a check without rows wrote no file to infer it from
                stored = spark.read.schema(frame.schema).parquet(targets[name])
                return stored.select(*frame.columns)

            with progress.step("checking"), spark_errors("check failed"):
                report = kv.check(limit=limit or None, write=write)
        common.write_check(report, report_file, report_as)
    if not report.ok(strict):
        raise typer.Exit(1)


def export_parquet(
    out_dir: Path | None = typer.Argument(
        None, metavar="DIR", help="Directory to write.", show_default=False
    ),
    output: Path | None = common.output_option("The same as DIR.", metavar="DIR"),
    db: str | None = common.db_option(f"Database file (default: {DEFAULT_DB} here)."),
    partition: str | None = typer.Option(
        None,
        "--partition",
        metavar="COLUMN=VALUE",
        help="Write the relations as this partition value (e.g. replica=7): "
        "DIR/<relation>/replica=7/data.parquet.",
        show_default=False,
    ),
    overwrite: bool = common.overwrite_option(
        "Replace the relations (or that partition) if present."
    ),
) -> None:
    """The stored relations as Parquet, one directory a relation: the input of
    `pagedkv-sql spark` (DuckDB writes it; Spark is not needed)."""
    from ..errors import UsageError
    from ..spark.layout import export_parquet as write
    from ..spark.layout import parse_partition

    with guard():
        if (out_dir is None) == (output is None):
            raise UsageError("give the directory to write once: DIR or --output DIR")
        target = out_dir or output
        assert target is not None
        part = parse_partition(partition)
        with common.open_read_only(db) as database, common.progress(database, "export parquet"):
            written = write(database, target, part, overwrite=overwrite)
    typer.echo(f"wrote {len(written)} relation(s) to {target}", err=True)


def spark_fleet_check(
    directory: str = typer.Argument(..., metavar="DIR", help="A fleet directory (docs/fleet.md)."),
    fmt: FleetFormat = typer.Option(FleetFormat.text, "--format", "-f", help="text or json."),
    lag: float = typer.Option(
        0.0,
        "--lag",
        metavar="SECONDS",
        min=0.0,
        help="Tolerate a residency mismatch up to this long (as `fleet check --lag`).",
    ),
    parquet: str | None = typer.Option(
        None,
        "--parquet",
        metavar="DIR",
        help="Keep the fleet's input tables as Parquet in DIR, one directory a table "
        "(default: a temporary directory, removed after).",
        show_default=False,
    ),
    master: str | None = MasterOption,
    conf: list[str] | None = ConfOption,
) -> None:
    """`fleet check` on Spark: the directory read as `fleet check` reads it (DuckDB's
    reader, its input tables handed to Spark as Parquet), every view and check of
    sql/fleet.sql run on Spark, translated; the same summary and findings. Exit 0: clean;
    1: findings; 2: the directory cannot be read."""
    import json

    from ..fleet.output import report_json, report_text
    from ..spark.session import parse_conf, require

    with guard():
        settings = parse_conf(conf)
        require()
        from ..fleet.tables import meta
        from ..spark.fleet import check

        meta(Path(directory))  # a directory that is no fleet refused before Spark starts
        with _running(master, settings) as (spark, progress), progress.step("checking the fleet"):
            report = check(spark, directory, lag=lag, parquet=parquet)
        if fmt == FleetFormat.json:
            sys.stdout.write(json.dumps(report_json(report), indent=2) + "\n")
        else:
            sys.stdout.write(report_text(report) + "\n")
    if report.findings:
        raise typer.Exit(1)
