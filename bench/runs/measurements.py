"""Each measurement of the main benchmark, as `bench/run.py --one NAME` runs it in a fresh
process (so that its peak memory is its own): ours and the baselines (bare DuckDB, the
whole commands, Soufflé, Spark), and the command lines and comparisons they need."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow as pa

from . import common
from .common import (
    ANTI_JOIN,
    BARE_SCRIPT,
    COLUMNS,
    SPEC,
    UNION_ALL,
    peak_mb,
    reset_peak,
    rss_mb,
    scan_inputs,
    token_batches,
)


# -- one measurement, in its own process -------------------------------------------------
def one(name: str, data: Path, db: Path, work: Path) -> dict[str, float]:
    import pagedkv_sql
    from pagedkv_sql.output import write_batches

    out: dict[str, float] = {}
    started = time.perf_counter()
    if name == "bare_load":
        con = duckdb.connect(str(db))
        for rel, cols in COLUMNS.items():
            spec = "{" + ", ".join(f"'{c}': 'BIGINT'" for c in cols) + "}"
            con.execute(
                f"CREATE TABLE {rel} AS SELECT * FROM read_csv('{data}/{rel}.facts', "
                f"delim='\t', header=false, auto_detect=false, columns={spec})"
            )
        con.close()
    elif name in ("load", "load_with_diagnostics"):
        with pagedkv_sql.connect(db) as d:
            d.load(data, diagnostics=name != "load")
    elif name == "load_crlf":  # the same facts with CRLF line ends, one LF among them
        with pagedkv_sql.connect(db) as d:
            d.load(work / "data_crlf", diagnostics=False)
    elif name == "bare_union_all_tsv":
        con = duckdb.connect(str(db), read_only=True)
        con.execute(f"COPY ({UNION_ALL}) TO '{work}/bare.tsv' (DELIMITER '\t', HEADER false)")
        con.close()
    elif name == "union_view_tsv":
        con = duckdb.connect(str(db), read_only=True)
        con.execute(
            "COPY (SELECT * FROM resolved_kv_address ORDER BY ALL) TO "
            f"'{work}/union.tsv' (DELIMITER '\t', HEADER false)"
        )
        con.close()
    elif name == "resolve_tsv":  # Soufflé's format: `resolve`'s default, `facts`
        with pagedkv_sql.connect(db, read_only=True) as d, open(work / "r.tsv", "wb") as f:
            out["rows"] = write_batches(d.resolve(), "facts", f)
    elif name in ("resolve_json", "resolve_jsonl", "resolve_table"):
        fmt = name.removeprefix("resolve_")
        with pagedkv_sql.connect(db, read_only=True) as d, open(work / f"r.{fmt}", "wb") as f:
            out["rows"] = write_batches(d.resolve(), fmt, f)
    elif name in ("duckdb_copy_json", "duckdb_copy_jsonl"):  # DuckDB's own JSON writer
        array = ", ARRAY true" if name == "duckdb_copy_json" else ""
        con = duckdb.connect(str(db), read_only=True)
        con.execute(
            "COPY (SELECT * FROM resolved_kv_address ORDER BY ALL) TO "
            f"'{work}/copy.json' (FORMAT json{array})"
        )
        con.close()
    elif name == "bare_union_all_arrow":
        con = duckdb.connect(str(db), read_only=True)
        reader = con.sql(UNION_ALL).to_arrow_reader(1 << 20)
        out["rows"] = sum(b.num_rows for b in reader)
        con.close()
    elif name == "resolve_arrow":
        with pagedkv_sql.connect(db, read_only=True) as d:
            out["rows"] = sum(b.num_rows for b in d.resolve())
    elif name == "resolve_parquet":
        with pagedkv_sql.connect(db, read_only=True) as d, open(work / "r.parquet", "wb") as f:
            out["rows"] = write_batches(d.resolve(), "parquet", f)
        out["result_mb"] = out["rows"] * 24 / 2**20
    elif name == "scan":
        con = duckdb.connect(str(db), read_only=True)
        scan_inputs(con)
        con.close()
    elif name == "scan_and_anti_join":
        # the least a check of unresolved tokens can do: one scan, plus every token probed
        # against the located blocks (no reasons, no other checks)
        con = duckdb.connect(str(db), read_only=True)
        scan_inputs(con)
        con.execute(ANTI_JOIN)
        con.fetchall()
        con.close()
    elif name == "check":
        with pagedkv_sql.connect(db, read_only=True) as d:
            d.check()
    elif name.startswith("scale_"):  # how cost grows: each phase under a 4 GB memory_limit
        from pagedkv_sql import spill

        config = {
            "memory_limit": os.environ.get("PAGEDKV_BENCH_MEMORY_LIMIT", common.SCALE_MEMORY_LIMIT)
        }
        with pagedkv_sql.connect(db, read_only=name != "scale_load", config=config) as d:
            if name == "scale_load":
                d.load(data)
            elif name == "scale_resolve":
                with open(work / "scale.parquet", "wb") as f:
                    out["rows"] = write_batches(d.resolve(), "parquet", f)
            else:
                d.check()
            # DuckDB makes the directory on its first spill and removes it on close
            out["spilled"] = float(Path(spill.spill_directory(str(db))).exists())
        usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread's CPU time: on a
        out["cpu"] = usage.ru_utime + usage.ru_stime  # shared machine, less noisy than wall
        out["left_over"] = len(list(db.parent.glob(f"{db.name}.*.tmp")))  # spill dirs left
    elif name == "stats":
        with pagedkv_sql.connect(db, read_only=True) as d:
            d.stats()
    elif name in ("map", "report"):  # pagedkv_sql.report: map needs matplotlib
        from pagedkv_sql.report import api

        with pagedkv_sql.connect(db, read_only=True) as d:
            if name == "map":
                written = api.save_map(d, work / "map.png")
            else:
                written = api.save_report(d, work / "report.html")
        out["file_mb"] = written.bytes / 2**20
    elif name.startswith("load_arrow"):
        # 10M tokens from Arrow in memory. load_arrow: into :memory: without diagnostics
        # (DuckDB keeps an in-memory table uncompressed); _file: into a database file that
        # holds the block tables, with load_arrow's default diagnostics; _alone: alone into
        # a new file, diagnostics on (no block tables: every token is unresolved, the
        # diagnostics' worst case); _bare: DuckDB's CREATE TABLE AS into a new file
        # read into memory, not mapped: a mapped file's pages would become resident (and
        # count as growth) only as DuckDB reads them; combine_chunks() of the one-chunk
        # table copied nothing, so the growth measured before this included the input
        tokens = pa.ipc.open_file(pa.OSFile(str(work / "tokens.arrow"))).read_all()
        target = ":memory:" if name == "load_arrow" else str(work / f"{name}.duckdb")
        for p in (Path(target), Path(f"{target}.wal")):
            p.unlink(missing_ok=True)
        if name == "load_arrow_file":
            blocks = ("root_table", "block_table_entry", "swapped_block")
            with pagedkv_sql.connect(target) as d:
                d.load(*(data / f"{r}.facts" for r in blocks), diagnostics=False)
        before = rss_mb()
        reset_peak()
        started = time.perf_counter()
        if name == "load_arrow_bare":
            con = duckdb.connect(target)
            con.execute("CREATE TABLE virtual_token AS SELECT * FROM tokens")
            con.close()
        else:
            with pagedkv_sql.connect(target) as d:
                d.load_arrow("virtual_token", tokens, diagnostics=name != "load_arrow")
        out["seconds"] = time.perf_counter() - started
        out["growth_mb"] = peak_mb() - before
        out["arrow_mb"] = tokens.nbytes / 2**20
        out["peak_mb"] = peak_mb()
        return out
    elif name in ("resolve_stream", "resolve_stream_distinct"):
        # a stream: 1M-token batches read from the Arrow file one at a time (not mapped),
        # so the tokens in memory are the batches in flight, as with a producer's stream
        with pagedkv_sql.connect(db, read_only=True) as d:
            started = time.perf_counter()
            counted = [0]
            batches = token_batches(work / "tokens.arrow", 1 << 20, counted)
            stream = d.resolve_stream(batches, distinct=name.endswith("distinct"))
            out["rows"] = sum(b.num_rows for b in stream)
        out["tokens"] = counted[0]
    elif name.startswith("flashinfer_import"):  # the engine snapshot, checked and mapped
        with pagedkv_sql.connect(":memory:") as d:
            d.load_engine(work / "flashinfer.npz", diagnostics=name.endswith("diagnostics"))
    elif name.startswith("flashinfer_arrow"):  # the same relations, from Arrow IPC files
        with pagedkv_sql.connect(":memory:") as d:
            for rel in COLUMNS:
                table = pa.ipc.open_file(pa.memory_map(str(work / f"fi_{rel}.arrow"))).read_all()
                d.load_arrow(rel, table, diagnostics=False)
            if name.endswith("diagnostics"):
                d.check()
    elif name in ("spark_warm", "duckdb_warm"):
        return spark_or_duckdb_warm(name, work)
    elif name in (
        "end_to_end",
        "bare_script",
        "souffle_interpreted",
        "souffle_compiled",
        *SPARK_JOBS,
    ):
        # whole commands, each a fresh process, timed from outside like a user would
        for command in commands(name, data, db, work):
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        out["seconds"] = time.perf_counter() - started
        out["peak_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        return out
    else:
        raise SystemExit(f"unknown measurement {name}")
    out["seconds"] = time.perf_counter() - started
    out["peak_mb"] = peak_mb()
    return out


SPARK = "local[2]"
SPARK_JOBS = ("spark_resolve_job", "duckdb_resolve_job", "spark_check_job", "duckdb_check_job")


def spark_or_duckdb_warm(name: str, work: Path) -> dict[str, float]:
    """Resolve (Parquet in, Parquet out, the spec checked first) and check, on the same
    Parquet data, in a running Spark session or a DuckDB database: engine time only."""
    import pagedkv_sql

    out: dict[str, float] = {}
    parquet = work / "parquet"
    if name == "spark_warm":
        from pagedkv_sql.spark import SparkKV, session

        started = time.perf_counter()
        spark = session(SPARK)
        out["startup"] = time.perf_counter() - started
        started = time.perf_counter()
        kv = SparkKV.from_parquet(spark, parquet)
        kv.validate()
        kv.resolve().write.mode("overwrite").parquet(str(work / "warm_spark_out"))
        out["seconds"] = time.perf_counter() - started
        started = time.perf_counter()
        kv.check()
        out["check_seconds"] = time.perf_counter() - started
        spark.stop()
    else:
        from pagedkv_sql.output import write_batches

        started = time.perf_counter()
        with pagedkv_sql.connect(":memory:") as d:
            d.load(*[work / "flat" / f"{rel}.parquet" for rel in COLUMNS], diagnostics=False)
            with open(work / "warm_duckdb.parquet", "wb") as f:
                write_batches(d.resolve(), "parquet", f)
            out["seconds"] = time.perf_counter() - started
            started = time.perf_counter()
            d.check()
            out["check_seconds"] = time.perf_counter() - started
        out["startup"] = 0.0
    out["peak_mb"] = peak_mb()
    return out


def export_for_spark(db: Path, work: Path) -> None:
    """The loaded database as `pagedkv-sql export parquet` writes it (Spark's input), and
    the same files flat (<relation>.parquet) for DuckDB's `load`: the same data for both."""
    import pagedkv_sql
    from pagedkv_sql.spark.layout import export_parquet

    with pagedkv_sql.connect(db, read_only=True) as d:
        export_parquet(d, work / "parquet")
    (work / "flat").mkdir(exist_ok=True)
    for rel in COLUMNS:
        (work / "flat" / f"{rel}.parquet").symlink_to(work / "parquet" / rel / "data.parquet")


def commands(name: str, data: Path, db: Path, work: Path) -> list[list[str]]:
    """The command lines of the whole-job measurements."""
    if name == "end_to_end":  # the README's main job, with the output written to a file
        cli = str(Path(sys.executable).with_name("pagedkv-sql"))
        return [
            [cli, "load", str(data), "--db", str(db)],
            [cli, "resolve", "--db", str(db), "--output", str(work / "e2e.tsv")],
        ]
    cli = str(Path(sys.executable).with_name("pagedkv-sql"))
    parquet, flat = str(work / "parquet"), work / "flat"
    if name == "spark_resolve_job":
        out_dir = work / "spark_out"
        shutil.rmtree(out_dir, ignore_errors=True)
        return [[cli, "spark", "resolve", "-i", parquet, "-o", str(out_dir), "--master", SPARK]]
    if name == "spark_check_job":
        return [[cli, "spark", "check", "-i", parquet, "--master", SPARK]]
    if name in ("duckdb_resolve_job", "duckdb_check_job"):
        fresh = work / "from_parquet.duckdb"
        fresh.unlink(missing_ok=True)
        files = [str(flat / f"{rel}.parquet") for rel in COLUMNS]
        last = (
            [cli, "resolve", "--db", str(fresh), "-o", str(work / "d.parquet")]
            if name == "duckdb_resolve_job"
            else [cli, "check", "--db", str(fresh)]
        )
        return [[cli, "load", *files, "--db", str(fresh), "--no-diagnostics"], last]
    if name == "bare_script":
        script = BARE_SCRIPT.format(columns=COLUMNS)
        return [[sys.executable, "-c", script, str(data), str(work / "bare_script.tsv")]]
    out = work / f"{name}.out"
    out.mkdir(exist_ok=True)
    if name == "souffle_interpreted":
        return [["souffle", "-F", str(data), "-D", str(out), str(SPEC)]]
    # compiled: the binary is built once, outside the timing (see bench_size)
    return [[str(work / "souffle_bin"), "-F", str(data), "-D", str(out)]]


def same_output(ours: Path, souffle_dir: Path) -> str:
    """Compare our resolve output with Soufflé's, as sets."""
    theirs = souffle_dir / "resolved_kv_address.csv"
    con = duckdb.connect()
    spec = "{'a': 'BIGINT', 'b': 'BIGINT', 'c': 'BIGINT'}"

    def scan(path: Path) -> str:
        return f"SELECT * FROM read_csv('{path}', delim='\t', header=false, columns={spec})"

    def count(query: str) -> int:
        return int(con.sql(f"SELECT count(*) FROM ({query})").fetchall()[0][0])

    only_ours = count(f"{scan(ours)} EXCEPT {scan(theirs)}")
    only_theirs = count(f"{scan(theirs)} EXCEPT {scan(ours)}")
    rows = count(scan(ours))
    con.close()
    if only_ours == only_theirs == 0:
        return f"Soufflé's output and ours: the same set ({rows:,} rows)."
    return (
        f"Soufflé's output and ours DIFFER: {only_ours} rows only ours, {only_theirs} only theirs."
    )
