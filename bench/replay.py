"""Replay benchmarks (not tests): ratios against baselines measured in the same run.

    python bench/replay.py --steps 100000 --repeat 3

- replay of a synthetic step log (Parquet event table) vs one scan of its events;
- the witness of format version 2: the same workload's log with the prefix cache's hashes
  (cache ops, the hashes hits ask for) vs without: its bytes (JSON Lines and Parquet) and
  its replay's time, as ratios (goal: at most 1.3x the bytes, 1.2x the time);
- KV-cache groups: the same workload's log with its tables in two groups (a second group,
  a sliding window wider than any request, whose blocks are the first's offset by the
  pool) vs in one: replay's time a step, as a ratio (goal: at most 2x);
- ``replay --at`` (the state at a step into the spec's tables) vs loading that state as facts;
- ``Database.apply`` of 100- and 1,000-event steps on 1M- and 10M-token states.
The log is generated once and kept (``--log``); a fault is planted at the middle step and the
benchmark checks that replay names it there.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb

# the checkout beside this file, not another install: a sys.path change, allowed among imports
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pagedkv_sql
from pagedkv_sql.replay import synth


def timed(fn: Any, repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def timed_cpu(fn: Any, repeat: int) -> tuple[float, float, Any]:
    """Median wall seconds and median CPU seconds of this process (all of DuckDB's
    threads): the CPU figure moves less than the wall one on a shared machine."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus), out


def make_log(steps: int, path: Path, *, hashes: bool = True) -> None:
    """The benchmark's synthetic log at ``path`` (.parquet or .jsonl), made once."""
    if path.exists():
        return
    cfg = synth.StepSynthConfig(
        steps=steps,
        num_gpu_blocks=8192,
        max_running=96,
        seed=0,
        faults=(("fresh_while_held", steps // 2),),
        hashes=hashes,
    )
    synth.write(cfg, path)


def bench_replay(log: Path, steps: int, repeat: int) -> dict[str, float]:
    con = duckdb.connect()
    events = con.execute(f"SELECT count(*) FROM read_parquet('{log}')").fetchall()[0][0]

    def scan() -> None:
        con.sql(
            f"SELECT count(*), min(COLUMNS(*)), max(COLUMNS(*)) FROM read_parquet('{log}')"
        ).fetchall()

    def replay() -> Any:
        with pagedkv_sql.connect(":memory:") as db:
            return db.replay(log, keep_going=True)

    load_before = os.getloadavg()[0]
    t_scan, c_scan, _ = timed_cpu(scan, repeat)
    t_replay, c_replay, report = timed_cpu(replay, repeat)
    first = report.findings[0]
    assert (first.check, first.step) == ("fresh_while_held", steps // 2), first
    print(
        f"replay: {steps} steps, {events} events: scan {t_scan:.2f} s, replay (every "
        f"invariant, every step) {t_replay:.2f} s, ratio {t_replay / t_scan:.1f}x; "
        f"CPU {c_scan:.2f} s vs {c_replay:.2f} s, ratio {c_replay / c_scan:.1f}x; "
        f"planted fault found at step {first.step}; load average "
        f"{load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    return {"events": events, "scan": t_scan, "replay": t_replay}


def bench_witness(log: Path, steps: int, repeat: int) -> None:
    """The same workload with and without the prefix cache's hashes (``log`` is the one
    with them): bytes of both forms, replay time of the Parquet one, in this run."""
    bare = log.with_name(log.stem + "-nohash.parquet")
    make_log(steps, bare, hashes=False)
    sizes = {}
    for name, path in (("hashes", log), ("no hashes", bare)):
        lines = path.with_suffix(".jsonl")
        make_log(steps, lines, hashes=name == "hashes")
        sizes[name] = (lines.stat().st_size, path.stat().st_size)

    def replay(path: Path) -> Any:
        with pagedkv_sql.connect(":memory:") as db:
            return db.replay(path, keep_going=True)

    times = {}
    for name, path in (("no hashes", bare), ("hashes", log)):  # interleaved, repeated
        t, c, report = timed_cpu(lambda path=path: replay(path), repeat)
        first = report.findings[0]
        assert (first.check, first.step) == ("fresh_while_held", steps // 2), first
        times[name] = (t, c)
    (j1, p1), (j0, p0) = sizes["hashes"], sizes["no hashes"]
    (t1, c1), (t0, c0) = times["hashes"], times["no hashes"]
    print(
        f"witness: {steps} steps, without / with the prefix cache's hashes: JSON Lines "
        f"{j0 / 1e6:.1f} / {j1 / 1e6:.1f} MB ({j1 / j0:.2f}x), Parquet {p0 / 1e6:.1f} / "
        f"{p1 / 1e6:.1f} MB ({p1 / p0:.2f}x); replay {t0:.2f} / {t1:.2f} s ({t1 / t0:.2f}x), "
        f"CPU {c0:.2f} / {c1:.2f} s ({c1 / c0:.2f}x); goal: at most 1.3x the bytes, 1.2x "
        "the time"
    )


def bench_at(log: Path, step: int, repeat: int) -> None:
    """``--at`` against loading the same state: as facts (the issue's words: the four
    relations as Souffle fact files, ``load``-ed as a user would, with its default checks)
    and as bare Arrow tables (``load_arrow`` without diagnostics: the floor)."""
    with pagedkv_sql.connect(":memory:") as db:
        db.replay(log)
        t_at, done = timed(lambda: db.replay_at(step), repeat)
        facts = {r: db.sql(f"SELECT * FROM {r}").to_arrow_table() for r in done.rows}
        with tempfile.TemporaryDirectory() as tmp:
            for r in done.rows:
                db.con.execute(
                    f"COPY (SELECT * FROM {r}) TO '{tmp}/{r}.facts' (DELIMITER '\t', HEADER false)"
                )

            def load_facts() -> None:
                with pagedkv_sql.connect(":memory:") as fresh:
                    fresh.load(tmp)

            t_facts, _ = timed(load_facts, repeat)

    def load(diagnostics: bool) -> None:
        with pagedkv_sql.connect(":memory:") as fresh:
            for relation, table in facts.items():
                fresh.load_arrow(relation, table, diagnostics=diagnostics)

    t_load, _ = timed(lambda: load(False), repeat)
    rows = ", ".join(f"{r} {n}" for r, n in done.rows.items())
    print(
        f"--at {step} ({rows}): {t_at:.3f} s; loading that state as facts (load of the "
        f"four .facts files) {t_facts:.3f} s (ratio {t_at / t_facts:.2f}x); as bare Arrow "
        f"tables (load_arrow, no diagnostics) {t_load:.3f} s (ratio {t_at / t_load:.2f}x)"
    )


def live_state(db: pagedkv_sql.Database, tokens: int, per_request: int = 500) -> int:
    """A state of ``tokens`` tokens: requests of ``per_request`` tokens, own blocks."""
    n = tokens // per_request
    blocks = -(-per_request // 16)
    con = db.con
    con.execute(
        "CREATE TABLE replay_request AS SELECT range + 1 AS seq_id, 'r' || (range + 1) AS "
        "request_id, 0::BIGINT AS arrive_step, NULL::BIGINT AS free_step FROM range(?)",
        [n],
    )
    con.execute("INSERT INTO root_table SELECT seq_id, seq_id FROM replay_request")
    con.execute(
        "INSERT INTO block_table_entry SELECT seq_id, i, (seq_id * ? + i) * 256, 1 "
        "FROM replay_request, range(?) t(i)",
        [blocks, blocks],
    )
    con.execute(
        "INSERT INTO virtual_token SELECT seq_id, p, p // 16, p % 16 "
        "FROM replay_request, range(?) t(p) ORDER BY seq_id, p",
        [per_request],
    )
    con.execute("INSERT OR REPLACE INTO pagedkv_settings VALUES ('apply_last_step', 0)")
    return n


def bench_apply(repeat: int) -> None:
    rng = random.Random(0)
    results: dict[tuple[int, int], float] = {}
    for tokens in (1_000_000, 10_000_000):
        with pagedkv_sql.connect(":memory:") as db:
            n = live_state(db, tokens)
            step = 0
            for size in (10, 100, 1000):
                times = []
                for _ in range(repeat):
                    step += 1
                    reqs = rng.sample(range(1, n + 1), size)
                    ops = [{"op": "append", "req": f"r{r}", "tokens": 1} for r in reqs]
                    t = time.perf_counter()
                    change = db.apply({"step": step, "ops": ops})
                    times.append(time.perf_counter() - t)
                    assert change.added.num_rows == size
                results[(tokens, size)] = statistics.median(times)
    for (tokens, size), t in results.items():
        print(f"apply: {size}-event step on a {tokens // 1_000_000}M-token state: {t:.3f} s")
    print(
        "apply: 10M/1M state, 10-event steps: "
        f"{results[(10_000_000, 10)] / results[(1_000_000, 10)]:.2f}x"
    )
    print(
        "apply: 10M/1M state, 1,000-event steps: "
        f"{results[(10_000_000, 1000)] / results[(1_000_000, 1000)]:.2f}x; "
        "1,000/100 events on 10M: "
        f"{results[(10_000_000, 1000)] / results[(10_000_000, 100)]:.2f}x"
    )


def two_groups(source: Path, target: Path) -> None:
    """``source`` (a one-group JSON Lines log) with every table in a second group too: the
    second group's blocks are the first's + the pool's size (a pool twice as large, its
    null block reserved too), every block-naming op and observation repeated for them."""
    import json

    def both(ids: list[int]) -> list[list[int]]:
        return [ids, [b + pool for b in ids]]

    with source.open() as src, target.open("w") as out:
        header = json.loads(src.readline())
        pool = int(header["num_gpu_blocks"])
        header["num_gpu_blocks"] = 2 * pool
        header["reserved_blocks"] = [*header["reserved_blocks"], pool]
        window = {"kind": "sliding_window", "block_size": header["block_size"]}
        header["groups"] = [
            {"kind": "full_attention", "block_size": header["block_size"]},
            {**window, "sliding_window": 1 << 30},
        ]
        out.write(json.dumps(header) + "\n")
        for line in src:
            step = json.loads(line)
            for new in step.get("new_requests", []):
                new["block_ids"] = both(new["block_ids"][0])
            for run in step.get("running", []):
                run["new_block_ids"] = both(run["new_block_ids"][0])
            ops = []
            for op in step.get("ops", []):
                ops.append(op)
                if op["op"] in ("allocate", "share", "release", "window_free"):
                    ops.append({**op, "group": 1, "blocks": both(op["blocks"])[1]})
                elif op["op"] in ("cache", "evict"):
                    ops.append({**op, "blocks": both(op["blocks"])[1]})
                if "handed" in op:
                    op["handed"] = [b for x in both(op["handed"]) for b in x]
            if ops:
                step["ops"] = ops
            observed = step.get("observed")
            if observed:
                refs = observed.get("ref_cnt", {})
                refs.update({str(int(b) + pool): n for b, n in list(refs.items())})
                if "free_list" in observed:
                    observed["free_list"] = [b for x in both(observed["free_list"]) for b in x]
                if "num_free_blocks" in observed:
                    observed["num_free_blocks"] *= 2
            out.write(json.dumps(step) + "\n")


def bench_groups(steps: int, repeat: int) -> None:
    """Replay of the same workload in one KV-cache group and in two, interleaved."""
    one = Path(f"/tmp/pagedkv-bench-groups-{steps}.jsonl")
    make_log(steps, one)
    two = one.with_name(one.stem + "-two.jsonl")
    if not two.exists():
        two_groups(one, two)

    def replay(path: Path) -> Any:
        with pagedkv_sql.connect(":memory:") as db:
            return db.replay(path, keep_going=True)

    times = {}
    for name, path in (("one", one), ("two", two)):
        t, c, report = timed_cpu(lambda path=path: replay(path), repeat)
        first = report.findings[0]
        assert (first.check, first.step) == ("fresh_while_held", steps // 2), first
        times[name] = (t, c, report.events)
    (t1, c1, e1), (t2, c2, e2) = times["one"], times["two"]
    print(
        f"groups: {steps} steps, one / two KV-cache groups: {e1:,} / {e2:,} events; replay "
        f"{t1:.2f} / {t2:.2f} s ({t2 / t1:.2f}x), {1e3 * t1 / steps:.3f} / "
        f"{1e3 * t2 / steps:.3f} ms a step; CPU {c1:.2f} / {c2:.2f} s ({c2 / c1:.2f}x); "
        "goal: at most 2x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--log", type=Path, help="where the generated log is kept")
    parser.add_argument("--only", help="comma-separated: replay, witness, groups, at, apply")
    args = parser.parse_args()
    everything = {"replay", "witness", "groups", "at", "apply"}
    only = set(args.only.split(",")) if args.only else everything
    log = args.log or Path(f"/tmp/pagedkv-bench-replay-{args.steps}.parquet")
    if only & {"replay", "witness", "at"}:
        make_log(args.steps, log)
    if "replay" in only:
        bench_replay(log, args.steps, args.repeat)
    if "witness" in only:
        bench_witness(log, args.steps, args.repeat)
    if "groups" in only:
        bench_groups(args.steps, args.repeat)
    if "at" in only:
        bench_at(log, args.steps - 1, args.repeat)
    if "apply" in only:
        bench_apply(args.repeat)


if __name__ == "__main__":
    main()
