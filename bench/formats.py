"""`resolve -f FORMAT -o FILE` against DuckDB's own `COPY ... TO` of the same rows, in the
same run: json, jsonl, csv, parquet and arrow, each a fresh process on one
read-only database, in interleaved rounds so that the machine's load hits all alike.

    .venv/bin/python bench/formats.py [--tokens 1000000] [--repeat 3]

Prints, per format, the median wall and child CPU seconds of ours and of the baseline, their
ratio, and the bytes each wrote. The baseline of `arrow` (DuckDB's COPY has no Arrow IPC
format) is DuckDB's Arrow reader written by pyarrow's IPC file writer.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUERY = "SELECT * FROM resolved_kv_address ORDER BY ALL"
COPY = {
    "json": "FORMAT json, ARRAY true",
    "jsonl": "FORMAT json",
    "csv": "FORMAT csv, HEADER true",
    "parquet": "FORMAT parquet",
}
BASELINE = f"""
import sys, duckdb
db, fmt, out = sys.argv[1:]
con = duckdb.connect(db, read_only=True)
if fmt == "startup":
    pass
elif fmt == "arrow":
    import pyarrow as pa
    reader = con.sql({QUERY!r}).to_arrow_reader(1 << 20)
    with pa.OSFile(out, "wb") as f, pa.ipc.new_file(f, reader.schema) as w:
        for batch in reader:
            w.write_batch(batch)
else:
    con.execute(f"COPY ({QUERY}) TO '{{out}}' ({{ {COPY!r}[fmt] }})")
con.close()
"""


def run(command: list[str]) -> tuple[float, float]:
    """Wall and child CPU (user + system) seconds of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--formats", default="json,jsonl,csv,parquet,arrow")
    args = parser.parse_args()
    # "startup": the fixed cost of each side (ours: the CLI's imports, the read-only open,
    # `sql 'SELECT 1'`; DuckDB's: importing duckdb and opening the file), to read the
    # formats' ratios net of it
    formats = ["startup", *args.formats.split(",")]
    cli = [sys.executable, "-m", "pagedkv_sql"]
    with tempfile.TemporaryDirectory(prefix="pagedkv-bench-formats-") as tmp:
        work = Path(tmp)
        db = str(work / "bench.duckdb")
        sequences = max(1, args.tokens // 1000)
        subprocess.run([*cli, "synth", str(work / "data"), "-s", str(sequences)], check=True)
        subprocess.run([*cli, "--db", db, "-q", "load", str(work / "data")], check=True)
        times: dict[tuple[str, str], list[tuple[float, float]]] = {}
        sizes: dict[tuple[str, str], int] = {}
        for _ in range(args.repeat):
            for fmt in formats:
                ours, theirs = work / f"ours.{fmt}", work / f"duckdb.{fmt}"
                command = ["resolve", "-f", fmt, "-o", str(ours)]
                if fmt == "startup":
                    command = ["sql", "SELECT 1", "-f", "csv", "-o", str(ours)]
                    theirs.write_bytes(b"")
                times.setdefault((fmt, "ours"), []).append(run([*cli, "--db", db, *command]))
                times.setdefault((fmt, "duckdb"), []).append(
                    run([sys.executable, "-c", BASELINE, db, fmt, str(theirs)])
                )
                sizes[(fmt, "ours")] = ours.stat().st_size
                sizes[(fmt, "duckdb")] = theirs.stat().st_size
                os.remove(ours)
                os.remove(theirs)
        rows = subprocess.run(
            [*cli, "--db", db, "sql", "SELECT count(*) FROM resolved_kv_address", "-f", "csv"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.splitlines()[1]
    print(
        f"# resolve -f FORMAT -o FILE vs DuckDB COPY, {int(rows):,} rows, median of {args.repeat}"
    )
    print(f"# load average {os.getloadavg()[0]:.1f}, Python {sys.version.split()[0]}")

    def medians(fmt: str, side: str) -> tuple[float, float]:
        got = times[(fmt, side)]
        return statistics.median(w for w, _ in got), statistics.median(c for _, c in got)

    ours_fixed, duckdb_fixed = medians("startup", "ours")[1], medians("startup", "duckdb")[1]
    head = ["format", "ours wall", "DuckDB wall", "ratio", "ours CPU", "DuckDB CPU", "ratio"]
    print("| " + " | ".join([*head, "net CPU ratio", "ours MB", "DuckDB MB"]) + " |")
    print("|" + " --- |" * 10)
    for fmt in formats:
        (ow, oc), (bw, bc) = medians(fmt, "ours"), medians(fmt, "duckdb")
        net = "-"
        if fmt != "startup" and bc > duckdb_fixed:
            net = f"{(oc - ours_fixed) / (bc - duckdb_fixed):.2f}x"
        print(
            f"| {fmt} | {ow:.2f} s | {bw:.2f} s | {ow / bw:.2f}x | {oc:.2f} s | {bc:.2f} s "
            f"| {oc / bc:.2f}x | {net} | {sizes[(fmt, 'ours')] / 1e6:.1f} | "
            f"{sizes[(fmt, 'duckdb')] / 1e6:.1f} |"
        )
    print("# net CPU ratio: each side's CPU less its startup row's (the fixed cost)")


if __name__ == "__main__":
    main()
