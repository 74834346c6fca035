"""The engine checks' cost a state (not a test): the fast in-memory check against
the SQL views, and both against the real engine's own step, measured in the same run.

    .venv-engines/bin/python bench/fastcheck.py --repeat 7

A real vLLM 0.32.0 KVCacheManager (1,024 blocks of 16 tokens, 64 running requests sharing
prefixes, prefix caching on) and the real SGLang 0.5.21 allocator + ReqToTokenPool +
RadixCache (1,024 pages of 16, 64 rows) are driven into a state, then each measurement
runs on that state: the engine's step (every running request's next token, as the
scheduler's KV calls make it), capture, the fast check, and the SQL paths (`load_engine`,
which derives the spec's relations and runs every check, and the cheaper engine-tables-only
write plus the engine checks as one query). Figures: median (and best) over ``--repeat``
rounds of the mean of ``--number`` calls, in ms a state; ratios of the medians. Needs the
engines venv (`make .venv-engines/.installed`).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

# the checkout beside this file, not another install: a sys.path change, allowed among imports
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pagedkv_sql
from pagedkv_sql.engines import check_snapshot, check_state, digest, engine
from pagedkv_sql.engines.fastcheck import check_sql
from pagedkv_sql.engines.tables import (
    create_schema,
    create_views,
    write_engine_tables,
)

warnings.simplefilter("ignore")  # the engines' import-time deprecations, not ours
BEST: dict[float, float] = {}  # median -> best round, for the table


def ms(fn: Callable[[], Any], repeat: int, number: int) -> float:
    """The median round's ms a call (and, in BEST, the best round's: what the code costs
    when the shared machine lets it run)."""
    rounds = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        rounds.append((time.perf_counter() - t) / number * 1000)
    median = statistics.median(rounds)
    BEST[median] = min(rounds)
    return median


def vllm_state(num_blocks: int, requests: int) -> tuple[Any, Callable[[], Any], Callable[[], None]]:
    from tests.engines.real.vllm_driver import Scheduler

    e = Scheduler(num_blocks=num_blocks, block_size=16)
    prefixes = [list(range(p * 1000, p * 1000 + 64)) for p in range(8)]
    for i in range(requests):  # 64 shared + 100..120 own tokens: 11-12 blocks each
        prompt = [*prefixes[i % 8], *range(10_000 + i * 200, 10_000 + i * 200 + 100 + i % 21)]
        assert e.admit(f"req-{i}", prompt) is not None, "pool too small"
    ids = list(e.requests)

    def step() -> None:  # one scheduler step's KV calls: every request's sampled token
        for rid in ids:
            e.step(rid)

    def capture() -> Any:
        from pagedkv_sql.engines import vllm

        return vllm.capture(e.manager, e.requests)

    return e, capture, step


def sglang_state(num_pages: int, rows: int) -> tuple[Any, Callable[[], Any], Callable[[], None]]:
    from tests.engines.real.sglang_driver import Scheduler

    e = Scheduler(num_pages=num_pages, rows=rows, page_size=16)
    prefixes = [list(range(p * 1000, p * 1000 + 64)) for p in range(8)]
    for i in range(rows):
        tokens = [*prefixes[i % 8], *range(10_000 + i * 200, 10_000 + i * 200 + 100 + i % 21)]
        e.schedule(f"req-{i}", tokens)
        if i < 8:
            e.cache_prefix(f"req-{i}", 64)
    ids = list(e.running)
    counter = [0]

    def step() -> None:  # every row's next token: a slot, a new page at a boundary
        for rid in ids:
            counter[0] += 1
            e.decode(rid, 50_000 + counter[0])

    def capture() -> Any:
        from pagedkv_sql.engines import sglang

        return sglang.capture(
            e.rtt, e.allocator, e.tree, seq_lens=e.seq_lens(), request_ids=e.request_ids()
        )

    return e, capture, step


def measure(name: str, build: Any, size: int, reqs: int, repeat: int, number: int) -> list[str]:
    _, capture, step = build(size, reqs)
    snap = capture()
    assert check_snapshot(snap) == [], check_snapshot(snap)[:3]
    state = engine(snap.engine).to_state(snap)
    engine_ms = ms(step, repeat, 1)  # the state grows a token a request per step
    snap = capture()
    state = engine(snap.engine).to_state(snap)
    capture_ms = ms(capture, repeat, number)
    fast_ms = ms(lambda: check_snapshot(snap), repeat, number)
    fast_state_ms = ms(lambda: check_state(state), repeat, number)
    digest_ms = ms(lambda: digest(snap), repeat, number)
    with pagedkv_sql.connect(":memory:") as db:
        db.load_engine(snap)  # views created once
        load_ms = ms(lambda: (db.load_engine(snap), db.check()), repeat, 1)
        create_schema(db.con)

        def cheap() -> Any:
            write_engine_tables(db.con, engine(snap.engine).to_state(snap), "bench")
            create_views(db.con)
            return check_sql(db.con)

        assert cheap() == []
        cheap_ms = ms(cheap, repeat, 1)
    held = int(state.block_table.num_rows)
    rows = [
        f"## {name}: {size:,} blocks, {reqs} requests, {held:,} held block-list entries",
        "",
        "| what | ms a state (median) | best round | vs the engine's step | vs the fast check |",
        "| --- | --- | --- | --- | --- |",
    ]

    def row(what: str, value: float) -> None:
        rows.append(
            f"| {what} | {value:.3f} | {BEST[value]:.3f} | {value / engine_ms:.2f}x "
            f"| {value / fast_ms:.2f}x |"
        )

    row(f"engine step ({reqs} requests' next token: the KV manager's calls)", engine_ms)
    row("capture (attributes of the live manager into a Snapshot)", capture_ms)
    row("check_snapshot (fast: to_state + every invariant in numpy)", fast_ms)
    row("check_state (fast, the state already mapped)", fast_state_ms)
    row("digest (to memoize repeated states)", digest_ms)
    row("SQL: engine tables only + the engine checks as one query", cheap_ms)
    row("SQL: load_engine + check (spec relations, every check)", load_ms)
    rows.append("")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--number", type=int, default=20)
    ap.add_argument("--blocks", type=int, default=1024)
    ap.add_argument("--requests", type=int, default=64)
    args = ap.parse_args()
    import duckdb
    import numpy

    load = os.getloadavg()[0]
    out = [
        f"# engine checks a state: {platform.platform()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, numpy {numpy.__version__}, "
        f"duckdb {duckdb.__version__}, load average {load:.1f} at start",
        f"# command: python bench/fastcheck.py --repeat {args.repeat} --number {args.number}",
        "",
    ]
    out += measure("vLLM 0.32.0", vllm_state, args.blocks, args.requests, args.repeat, args.number)
    out += measure(
        "SGLang 0.5.21", sglang_state, args.blocks, args.requests, args.repeat, args.number
    )
    out.append(f"load average {os.getloadavg()[0]:.1f} at the end")
    print("\n".join(out))


if __name__ == "__main__":
    main()
