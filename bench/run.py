"""Benchmarks (not tests): each figure is a ratio against a baseline measured in the same
run, medians of several runs, each measurement in a fresh process (peak RSS included).

    python bench/run.py --sizes 1000000,10000000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
from pathlib import Path

import duckdb
import pyarrow as pa
from runs import common
from runs.measurements import one
from runs.suite import bench_size, print_scaling


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000000")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--one")
    parser.add_argument("--data", type=Path)
    parser.add_argument("--db", type=Path)
    parser.add_argument("--work", type=Path)
    parser.add_argument("--only", help="comma-separated measurement names (default: all)")
    parser.add_argument(
        "--memory-limit", default=common.SCALE_MEMORY_LIMIT, help="DuckDB memory_limit of scale_*"
    )
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.data, args.db, args.work)))
        return
    common.SCALE_MEMORY_LIMIT = os.environ["PAGEDKV_BENCH_MEMORY_LIMIT"] = args.memory_limit

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


if __name__ == "__main__":
    main()
