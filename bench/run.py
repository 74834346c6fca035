"""Benchmarks (not tests): each figure is a ratio against a baseline measured in the same
run, medians of several runs, each measurement in a fresh process (peak RSS included).

    python bench/run.py --sizes 1000000,10000000 --repeat 3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa

UNION_ALL = (
    "SELECT seq_id, token_pos, physical_address FROM (SELECT * FROM resolved_kv_address_gpu "
    "UNION ALL SELECT * FROM resolved_kv_address_cpu) ORDER BY ALL"
)
ANTI_JOIN = (
    "SELECT count(*) FROM virtual_token ANTI JOIN ("
    "SELECT r.seq_id, b.block_index FROM root_table r "
    "JOIN block_table_entry b ON b.block_table_id = r.block_table_ptr UNION ALL "
    "SELECT r.seq_id, s.block_index FROM root_table r "
    "JOIN swapped_block s ON s.block_table_id = r.block_table_ptr) USING (seq_id, block_index)"
)
COLUMNS = {
    "root_table": ["seq_id", "block_table_ptr"],
    "block_table_entry": ["block_table_id", "block_index", "physical_block_base", "refcount"],
    "virtual_token": ["seq_id", "token_pos", "block_index", "offset_in_block"],
    "swapped_block": ["block_table_id", "block_index", "cpu_base_address"],
}


BARE_SCRIPT = """
import duckdb, sys
data, out = sys.argv[1], sys.argv[2]
con = duckdb.connect()
columns = {columns!r}
for rel, cols in columns.items():
    spec = "{{" + ", ".join(f"'{{c}}': 'BIGINT'" for c in cols) + "}}"
    con.execute(
        f"CREATE TABLE {{rel}} AS SELECT * FROM read_csv('{{data}}/{{rel}}.facts', "
        f"delim='\\t', header=false, auto_detect=false, columns={{spec}})"
    )
con.execute(f\"\"\"COPY (
    SELECT v.seq_id, v.token_pos, b.physical_block_base + v.offset_in_block
    FROM virtual_token v JOIN root_table r ON r.seq_id = v.seq_id
    JOIN block_table_entry b ON b.block_table_id = r.block_table_ptr
                            AND b.block_index = v.block_index
    UNION
    SELECT v.seq_id, v.token_pos, s.cpu_base_address + v.offset_in_block
    FROM virtual_token v JOIN root_table r ON r.seq_id = v.seq_id
    JOIN swapped_block s ON s.block_table_id = r.block_table_ptr
                        AND s.block_index = v.block_index
) TO '{{out}}' (DELIMITER '\\t', HEADER false)\"\"\")
"""
SCALE_MEMORY_LIMIT = "4GB"
SCALING: list[tuple[int, dict[str, dict[str, float]]]] = []  # (tokens, figures) per size
SPEC = Path(__file__).resolve().parent.parent.parent / "shared" / "spec" / "paged_attention.dl"


def peak_mb() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss, not inherited from the
    parent across fork and exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def reset_peak() -> None:
    """Start VmHWM again from the current resident memory (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def token_batches(path: Path, rows: int, counted: list[int]):  # type: ignore[no-untyped-def]
    """The tokens of an Arrow IPC file as batches of ``rows`` rows, read one file batch at
    a time (``counted[0]``: the tokens given so far)."""
    reader = pa.ipc.open_file(pa.OSFile(str(path)))
    pending: list[pa.RecordBatch] = []
    held = 0
    for i in range(reader.num_record_batches):
        batch = reader.get_batch(i)
        pending.append(batch)
        held += batch.num_rows
        while held >= rows or (held and i == reader.num_record_batches - 1):
            table = pa.Table.from_batches(pending).combine_chunks()
            take = min(rows, held)
            counted[0] += take
            yield table.slice(0, take).combine_chunks().to_batches()[0]
            rest = table.slice(take)
            pending, held = rest.to_batches(), rest.num_rows


def has_report_extra() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None  # report needs none (issue 29)


def scan_inputs(con: duckdb.DuckDBPyConnection) -> None:
    """One scan of the inputs: count(*) and sum of every column of every input table."""
    for rel, cols in COLUMNS.items():
        con.execute(f"SELECT count(*), {', '.join(f'sum({c})' for c in cols)} FROM {rel}")
        con.fetchall()


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

        config = {"memory_limit": os.environ.get("PAGEDKV_BENCH_MEMORY_LIMIT", SCALE_MEMORY_LIMIT)}
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
        export_parquet(d.con, work / "parquet")
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


def measure(name: str, data: Path, db: Path, work: Path, fresh_db: bool) -> dict[str, float]:
    if fresh_db:
        for p in (db, Path(str(db) + ".wal")):
            p.unlink(missing_ok=True)
    run = subprocess.run(
        [
            sys.executable,
            __file__,
            "--one",
            name,
            "--data",
            str(data),
            "--db",
            str(db),
            "--work",
            str(work),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(run.stdout))


def main() -> None:
    global SCALE_MEMORY_LIMIT
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--one")
    parser.add_argument("--data", type=Path)
    parser.add_argument("--db", type=Path)
    parser.add_argument("--work", type=Path)
    parser.add_argument("--only", help="comma-separated measurement names (default: all)")
    parser.add_argument(
        "--memory-limit", default=SCALE_MEMORY_LIMIT, help="DuckDB memory_limit of scale_*"
    )
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.data, args.db, args.work)))
        return
    SCALE_MEMORY_LIMIT = os.environ["PAGEDKV_BENCH_MEMORY_LIMIT"] = args.memory_limit

    import pagedkv_sql
    from pagedkv_sql.synth import SynthConfig, synthesize, write

    print(
        f"# pagedkv-sql benchmarks: {platform.platform()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, duckdb {duckdb.__version__}, "
        f"pyarrow {pa.__version__}, pagedkv-sql {pagedkv_sql.__version__}"
    )
    flag = f" --only {args.only}" if args.only else ""
    if args.memory_limit != "4GB":
        flag += f" --memory-limit {args.memory_limit}"
    print(f"# command: python bench/run.py --sizes {args.sizes} --repeat {args.repeat}{flag}")
    only = set(args.only.split(",")) if args.only else None
    for size in [int(s) for s in args.sizes.split(",")]:
        work = Path(tempfile.mkdtemp(prefix="pagedkv-bench-"))
        try:
            bench_size(size, args.repeat, work, only, SynthConfig, synthesize, write)
        finally:
            shutil.rmtree(work)
    print_scaling()


def print_scaling() -> None:
    """How cost grows with the tokens: time per token and peak RSS of load (with its default
    diagnostics), resolve to Parquet and check, each under a memory_limit of 4 GB, and the
    growth of the time per token from one size to the next."""
    if not SCALING:
        return
    print(f"\n## Scaling (memory_limit {SCALE_MEMORY_LIMIT}; spill directories left: ", end="")
    print(f"{sum(r[p]['left_over'] for _, r in SCALING for p in SCALE_PHASES if p in r):.0f})\n")
    print(
        "| tokens | phase | seconds | ns per token | vs the size before | CPU ns per token "
        "| vs the size before | peak RSS | spilled |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    cpu_before: dict[str, float] = {}
    before: dict[str, float] = {}
    for tokens, r in SCALING:
        for phase in SCALE_PHASES:
            if phase not in r:
                continue
            per = r[phase]["seconds"] / tokens * 1e9
            growth = f"{per / before[phase]:.2f}x" if phase in before else ""
            before[phase] = per
            cpu = r[phase].get("cpu", 0.0) / tokens * 1e9
            cpu_growth = f"{cpu / cpu_before[phase]:.2f}x" if cpu_before.get(phase) else ""
            cpu_before[phase] = cpu
            print(
                f"| {tokens:,} | {phase.removeprefix('scale_')} | {r[phase]['seconds']:.2f} | "
                f"{per:.0f} | {growth} | {cpu:.0f} | {cpu_growth} | "
                f"{r[phase]['peak_mb']:.0f} MB | {'yes' if r[phase].get('spilled') else 'no'} |"
            )


SCALE_PHASES = ("scale_load", "scale_resolve", "scale_check")


def flashinfer_inputs(size: int, work: Path) -> None:
    """A FlashInfer snapshot of ``size`` tokens (sequences of about 1000, pages of 16 in a
    shuffled pool), and the relations it maps to as Arrow IPC files, for the import
    benchmark."""
    import numpy as np

    import pagedkv_sql
    from pagedkv_sql.engines import flashinfer

    rng = np.random.default_rng(1)
    lengths = rng.integers(500, 1500, size=max(1, size // 1000))
    lengths[-1] += size - lengths.sum()  # exactly `size` tokens
    lengths = np.maximum(lengths, 1)
    pages = -(-lengths // 16)
    indptr = np.zeros(pages.size + 1, dtype=np.int32)
    indptr[1:] = np.cumsum(pages)
    indices = rng.permutation(int(indptr[-1])).astype(np.int32)
    last = (lengths - (pages - 1) * 16).astype(np.int32)
    flashinfer.snapshot(indptr, indices, last, 16).save(work / "flashinfer.npz")
    with pagedkv_sql.connect(":memory:") as d:
        d.load_engine(work / "flashinfer.npz", diagnostics=False)
        for rel in COLUMNS:
            table = d.sql(f"SELECT * FROM {rel}").to_arrow_table()
            with pa.ipc.new_file(str(work / f"fi_{rel}.arrow"), table.schema) as w:
                w.write_table(table)


OUTPUT_FORMATS = (
    "resolve_tsv",
    "resolve_json",
    "resolve_jsonl",
    "resolve_table",
    "duckdb_copy_json",
    "duckdb_copy_jsonl",
)


def bench_size(size: int, repeat: int, work: Path, only, SynthConfig, synthesize, write) -> None:  # type: ignore[no-untyped-def]
    tables = synthesize(
        SynthConfig(sequences=max(1, size // 1000), mean_length=1000, missing_fraction=0.01, seed=1)
    )
    data = work / "data"
    write(tables, data, "facts")

    def wanted(*names: str) -> bool:  # inputs only some measurements read (GBs at 100M)
        return only is None or any(n in only for n in names)

    if wanted("load_crlf"):
        crlf = work / "data_crlf"
        crlf.mkdir(exist_ok=True)
        for f in data.iterdir():
            text = f.read_bytes().replace(b"\n", b"\r\n")
            (crlf / f.name).write_bytes(text.replace(b"\r\n", b"\n", 1))  # mixed line ends
    arrow_inputs = ("load_arrow", "load_arrow_file", "load_arrow_alone", "load_arrow_bare")
    if wanted(*arrow_inputs, "resolve_stream", "resolve_stream_distinct"):
        with pa.ipc.new_file(str(work / "tokens.arrow"), tables["virtual_token"].schema) as w:
            w.write_table(tables["virtual_token"], max_chunksize=1 << 20)  # read a batch at a time
    tokens = tables["virtual_token"].num_rows
    del tables  # the measurements run in processes of their own: free the synth's memory
    if only is None or any(n.startswith("flashinfer") for n in only):
        flashinfer_inputs(size, work)
    db, bare_db = work / "bench.duckdb", work / "bare.duckdb"

    def med(name: str, target: Path, fresh: bool) -> dict[str, float]:
        runs = [measure(name, data, target, work, fresh) for _ in range(repeat)]
        return {k: statistics.median(r[k] for r in runs) for k in runs[0]}

    souffle = shutil.which("souffle")
    names = [
        ("bare_load", bare_db, True),
        ("load_with_diagnostics", db, True),
        ("load_crlf", work / "crlf.duckdb", True),
        ("load", db, True),  # leaves db loaded for what follows
        *(
            (name, db, False)
            for name in (
                "bare_union_all_tsv",
                "union_view_tsv",
                *OUTPUT_FORMATS,
                "bare_union_all_arrow",
                "resolve_arrow",
                "resolve_parquet",
                "scan",
                "scan_and_anti_join",
                "check",
                "stats",
                *(("map", "report") if has_report_extra() else ()),
                "load_arrow",
                "load_arrow_file",
                "load_arrow_alone",
                "load_arrow_bare",
                "resolve_stream",
                "resolve_stream_distinct",
                "bare_script",
                "flashinfer_import",
                "flashinfer_arrow",
                "flashinfer_import_diagnostics",
                "flashinfer_arrow_diagnostics",
            )
        ),
        ("end_to_end", work / "e2e.duckdb", True),
        ("scale_load", work / "scale.duckdb", True),
        ("scale_resolve", work / "scale.duckdb", False),
        ("scale_check", work / "scale.duckdb", False),
    ]
    if souffle and SPEC.exists():
        subprocess.run(
            ["souffle", "-o", str(work / "souffle_bin"), str(SPEC)], check=True, cwd=work
        )
        names += [("souffle_interpreted", db, False), ("souffle_compiled", db, False)]
    names += [(name, db, False) for name in (*SPARK_JOBS, "spark_warm", "duckdb_warm")]
    r = {}
    scale_only = only is not None and all(n.startswith("scale_") for n in only)
    # the output formats are held against each other: measured in interleaved rounds, so a
    # change in the machine's load in the middle hits all of them alike
    rounds = [n for n in OUTPUT_FORMATS if only is None or n in only]
    for name, target, fresh in names:
        # `load` fills the database the rest read; the scale_* phases load their own
        if only is not None and name not in only and (name != "load" or scale_only):
            continue
        if name in rounds:
            if name == rounds[0]:
                runs: dict[str, list[dict[str, float]]] = {n: [] for n in rounds}
                for _ in range(repeat):
                    for n in rounds:
                        runs[n].append(measure(n, data, target, work, fresh))
                for n, got in runs.items():
                    r[n] = {k: statistics.median(x[k] for x in got) for k in got[0]}
            continue
        if name in SPARK_JOBS or name.endswith("_warm"):
            if shutil.which("java") is None or importlib.util.find_spec("pyspark") is None:
                continue  # the spark extra or Java is missing: said below
            if not (work / "parquet").exists():
                export_for_spark(db, work)
        r[name] = med(name, target, fresh)

    rows = [
        ("load .facts (validated, no diagnostics) vs bare read_csv", "load", "bare_load"),
        ("load .facts with diagnostics vs bare read_csv", "load_with_diagnostics", "bare_load"),
        ("load with CRLF/mixed line ends vs load of the same LF files", "load_crlf", "load"),
        ("resolve to TSV vs bare UNION ALL + ORDER BY, COPY", "resolve_tsv", "bare_union_all_tsv"),
        ("resolve --format json (array) vs to TSV (facts)", "resolve_json", "resolve_tsv"),
        ("resolve --format jsonl vs to TSV (facts)", "resolve_jsonl", "resolve_tsv"),
        ("resolve --format table vs to TSV (facts)", "resolve_table", "resolve_tsv"),
        (
            "resolve --format json vs DuckDB's COPY (FORMAT json, ARRAY true), same bytes",
            "resolve_json",
            "duckdb_copy_json",
        ),
        (
            "resolve --format jsonl vs DuckDB's COPY (FORMAT json)",
            "resolve_jsonl",
            "duckdb_copy_jsonl",
        ),
        (
            "plain UNION view to TSV vs bare UNION ALL (why we avoid it)",
            "union_view_tsv",
            "bare_union_all_tsv",
        ),
        ("resolve to Arrow vs bare UNION ALL to Arrow", "resolve_arrow", "bare_union_all_arrow"),
        ("check (all views) vs one scan of the inputs", "check", "scan"),
        ("stats vs check", "stats", "check"),
        ("map (PNG) vs check", "map", "check"),
        ("report (HTML) vs check", "report", "check"),
        ("report (HTML) vs check + stats, the two it runs", "report", "check_stats"),
        (
            "check vs one scan + the bare anti-join of the tokens (its floor)",
            "check",
            "scan_and_anti_join",
        ),
        (
            "resolve_stream (1M-token batches) vs resolve() on stored tokens",
            "resolve_stream",
            "resolve_arrow",
        ),
        (
            "resolve_stream, distinct across batches, vs resolve()",
            "resolve_stream_distinct",
            "resolve_arrow",
        ),
        (
            "`load` + `resolve -o` (two CLI runs, db file) vs bare in-memory script",
            "end_to_end",
            "bare_script",
        ),
        (
            "import of a FlashInfer snapshot (.npz) vs load_arrow of the same relations",
            "flashinfer_import",
            "flashinfer_arrow",
        ),
        (
            "the same, each followed by every check (import's default)",
            "flashinfer_import_diagnostics",
            "flashinfer_arrow_diagnostics",
        ),
        ("`load` + `resolve -o` vs Soufflé interpreted", "end_to_end", "souffle_interpreted"),
        ("`load` + `resolve -o` vs Soufflé compiled (-o)", "end_to_end", "souffle_compiled"),
        (
            f"`spark resolve` ({SPARK}) vs `load` + `resolve -o x.parquet`, Parquet in and out",
            "spark_resolve_job",
            "duckdb_resolve_job",
        ),
        (f"`spark check` ({SPARK}) vs `load` + `check`", "spark_check_job", "duckdb_check_job"),
        (
            f"Spark ({SPARK}, session running) vs DuckDB: resolve, Parquet in and out",
            "spark_warm",
            "duckdb_warm",
        ),
    ]
    if "check" in r and "stats" in r:
        r["check_stats"] = {
            k: r["check"][k] + r["stats"][k]
            if k == "seconds"
            else max(r["check"][k], r["stats"][k])
            for k in ("seconds", "peak_mb")
        }
    if "scale_load" in r:
        SCALING.append((tokens, r))
    resolved = f" ({r['resolve_tsv']['rows']:,.0f} resolved rows)" if "resolve_tsv" in r else ""
    print(f"\n## {tokens:,} tokens{resolved}, median of {repeat}\n")
    print("| what | ours | baseline | ratio | our peak RSS | baseline peak RSS |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, name, base in rows:
        if name in r and base in r:
            a, b = r[name], r[base]
            print(
                f"| {label} | {a['seconds']:.2f} s | {b['seconds']:.2f} s | "
                f"{a['seconds'] / b['seconds']:.2f}x | {a['peak_mb']:.0f} MB | "
                f"{b['peak_mb']:.0f} MB |"
            )
    print()
    arrow_loads = [
        ("load_arrow", "into :memory:, no diagnostics"),
        ("load_arrow_file", "into a database file holding the block tables, diagnostics on"),
        ("load_arrow_alone", "alone into a new file, diagnostics on (every token unresolved)"),
        ("load_arrow_bare", "bare DuckDB CREATE TABLE AS into a new file"),
    ]
    if any(n in r for n, _ in arrow_loads):
        first = next(r[n] for n, _ in arrow_loads if n in r)
        print(
            f"load_arrow of the token table ({first['arrow_mb']:.0f} MB of Arrow in memory): "
            "peak memory growth / Arrow size"
        )
        for n, what in arrow_loads:
            if n in r:
                la = r[n]
                print(
                    f"- {what}: +{la['growth_mb']:.0f} MB, "
                    f"{la['growth_mb'] / la['arrow_mb']:.2f}x; {la['seconds']:.2f} s"
                )
    if "resolve_parquet" in r:
        rp = r["resolve_parquet"]
        print(
            f"resolve() streamed to Parquet: result {rp['result_mb']:.0f} MB as int64, "
            f"peak resident memory {rp['peak_mb']:.0f} MB; {rp['seconds']:.2f} s."
        )
    if "resolve_stream" in r and "resolve_arrow" in r:
        st = r["resolve_stream"]
        print(
            f"resolve_stream: {st['tokens'] / st['seconds'] / 1e6:.1f} M tokens/s; resolve() "
            f"on stored tokens: {tokens / r['resolve_arrow']['seconds'] / 1e6:.1f} M tokens/s."
        )
    if "map" in r and "report" in r:
        print(
            f"map.png {r['map']['file_mb']:.2f} MB; report.html {r['report']['file_mb']:.1f} MB "
            "(plotly.js's cartesian bundle inlined: about 1.5 MB of it)."
        )
    elif not has_report_extra():
        print("map, report: the report extra (matplotlib) is not installed here.")
    if "spark_warm" in r and "duckdb_warm" in r:
        sw, dw = r["spark_warm"], r["duckdb_warm"]
        print(
            f"Spark ({SPARK}): session start-up {sw['startup']:.1f} s; check (all views) "
            f"{sw['check_seconds']:.2f} s vs DuckDB {dw['check_seconds']:.2f} s "
            f"({sw['check_seconds'] / dw['check_seconds']:.1f}x)."
        )
    elif only is None or any(n in only for n in (*SPARK_JOBS, "spark_warm")):
        print(
            "Spark: not measured (needs Java and the spark extra: make test-spark installs both)."
        )
    if "souffle_compiled" in r and "end_to_end" in r:
        print(same_output(work / "e2e.tsv", work / "souffle_compiled.out"))
    if souffle is None:
        print("Soufflé: not on PATH here, so not measured (docs/benchmarks.md says why).")
    elif not SPEC.exists():
        print(f"Soufflé: found, but the spec is not at {SPEC}, so not measured.")


if __name__ == "__main__":
    main()
