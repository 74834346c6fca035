"""`spark fleet check` benchmark (not a test): Spark against DuckDB's `fleet check` on the
same generated fleet, in the same run.

    nice -n 10 python bench/spark_fleet_check.py --events 1000000

The fleet is bench/fleet_check.py's (REPLICAS replicas, 8 event rows a replica a step, one
router dumped every DUMP steps, `--lag` DUMP steps). Measured in one process, each on the
same files: DuckDB (`pagedkv_sql.fleet.check`: load, views, findings, summary), then Spark
(`pagedkv_sql.spark.fleet.check`: the same load, the Parquet hand-over, the views on a
local session started before the clock, `local[N]`). Printed: both times, the ratio, whether
the findings and the summary agree (doubles to 12 digits), cores and load average.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _norm(summary: list[dict[str, object]]) -> list[dict[str, object]]:
    return [
        {k: float(f"{v:.12g}") if isinstance(v, float) else v for k, v in s.items()}
        for s in summary
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000, help="event rows (one a hash)")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--pool", type=int, default=128, help="blocks a replica")
    p.add_argument("--dump-every", type=int, default=1000, help="steps between index dumps")
    p.add_argument("--master", default="local[2]")
    a = p.parse_args()
    import pagedkv_sql
    from bench.fleet_check import STEP, generate
    from pagedkv_sql import fleet
    from pagedkv_sql.spark import fleet as spark_fleet
    from pagedkv_sql.spark.session import session

    lag = a.dump_every * STEP
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "fleet"
        rows = generate(directory, a.events, a.replicas, a.pool, a.dump_every)
        print(
            f"# spark fleet check: {os.cpu_count()} cores, load average "
            f"{os.getloadavg()[0]:.1f} at start; {a.replicas} replicas, {rows:,} event rows, "
            f"lag {lag:g} s, master {a.master}"
        )
        t0 = time.perf_counter()
        with pagedkv_sql.connect(":memory:") as db:
            duck = fleet.check(db, directory, lag=lag)
        t_duck = time.perf_counter() - t0
        spark = session(a.master)
        t0 = time.perf_counter()
        ours = spark_fleet.check(spark, directory, lag=lag)
        t_spark = time.perf_counter() - t0
        spark.stop()
    same = ours.findings == duck.findings and _norm(ours.summary) == _norm(duck.summary)
    print(f"DuckDB fleet check: {t_duck:.2f} s, {len(duck.findings)} finding(s)")
    print(f"spark fleet check:  {t_spark:.2f} s, {len(ours.findings)} finding(s)")
    print(
        f"ratio spark / duckdb: {t_spark / t_duck:.2f}x; same findings and summary: {same}; "
        f"load average {os.getloadavg()[0]:.1f} at the end"
    )


if __name__ == "__main__":
    main()
