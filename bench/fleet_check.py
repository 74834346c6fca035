"""`fleet check` benchmark (not a test): ratio against a bare DuckDB script measured in the
same run.

    nice -n 10 python bench/fleet_check.py --events 10000000

A generated fleet directory (docs/fleet.md, "Layout"): REPLICAS replicas of a POOL-block
cache, each step storing 4 new blocks a replica and, once full, evicting its 4 oldest (so
8 event rows a replica a step), the step log of the same ops, one router whose index is
dumped every DUMP steps (then `--lag` is DUMP steps: the dumps' granularity is no finding).
Measured, each in a fresh process, each on the same files:

- ours: `pagedkv_sql.fleet.check(db, DIR, lag=...)`, everything (load, views, findings,
  summary);
- bare: one DuckDB script reading the same files with its JSON reader and doing the same
  interval work of the two stages (the events folded as a set against the step log's
  truth, the index's intervals against the events, each span where one side holds a hash
  the other does not), counting the spans longer than the lag; no causes, no decisions,
  no summary.

Printed: the sizes, both times, the ratio (goal: at most 1.5), cores and load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEP = 0.01
PER_STEP = 4


def generate(directory: Path, events: int, replicas: int, pool: int, dump_every: int) -> int:
    """Write the fleet; the number of event rows (one a hash) written."""
    steps = max(1, events // (replicas * 2 * PER_STEP))
    directory.mkdir(parents=True, exist_ok=True)
    meta = {
        "pagedkv_fleet": 1,
        "step_seconds": STEP,
        "block_size": 16,
        "hash": "vllm_last8",
        "replicas": [
            {"name": f"r{i}", "worker_id": i, "dp_rank": 0, "num_gpu_blocks": pool}
            for i in range(replicas)
        ],
        "routers": [{"name": "dynamo", "kind": "dynamo_radix_tree", "routed": True}],
    }
    (directory / "fleet.json").write_text(json.dumps(meta))
    held: dict[str, list[tuple[int, int]]] = {}
    rows = 0
    index_lines = []
    for i in range(replicas):
        name = f"r{i}"
        sub = directory / f"replica={name}"
        sub.mkdir(exist_ok=True)
        queue: list[tuple[int, int]] = []  # (block, hash), oldest first
        free = list(range(1, pool + 1))
        with (sub / "events.jsonl").open("w") as ev, (sub / "steps.jsonl").open("w") as st:
            st.write(
                json.dumps(
                    {
                        "pagedkv_step_log": 2,
                        "block_size": 16,
                        "num_gpu_blocks": pool + 1,
                        "reserved_blocks": [0],
                    }
                )
                + "\n"
            )
            for step in range(steps):
                ops, batch = [], []
                if len(free) < PER_STEP:
                    gone = queue[:PER_STEP]
                    del queue[:PER_STEP]
                    free += [b for b, _ in gone]
                    ops.append({"op": "evict", "blocks": [b for b, _ in gone]})
                    batch.append(["BlockRemoved", [h for _, h in gone], "GPU"])
                new = [(free.pop(), (i << 48) + step * PER_STEP + k + 1) for k in range(PER_STEP)]
                queue += new
                ops.append(
                    {
                        "op": "cache",
                        "blocks": [b for b, _ in new],
                        "hashes": [f"{h:016x}" for _, h in new],
                    }
                )
                batch.append(["BlockStored", [h for _, h in new], None, [], 16, None, "GPU"])
                rows += sum(len(e[1]) for e in batch)
                st.write(json.dumps({"step": step, "ops": ops}) + "\n")
                ev.write(
                    json.dumps(
                        {
                            "seq": step,
                            "ts": round(step * STEP, 9),
                            "data_parallel_rank": 0,
                            "events": batch,
                        }
                    )
                    + "\n"
                )
                if step % dump_every == 0 or step == steps - 1:
                    held.setdefault(name, [])
                    held[name] = list(queue)
                    if i == replicas - 1:
                        index_lines.append(step)
        held[name] = list(queue)
    # the router's dumps: what each replica held at the dump's step (regenerated cheaply:
    # the queue at step s is the hashes of the last pool // PER_STEP * PER_STEP stores)
    keep = (pool // PER_STEP) * PER_STEP
    sub = directory / "router=dynamo"
    sub.mkdir(exist_ok=True)
    with (sub / "index.jsonl").open("w") as f:
        for step in index_lines:
            dump = []
            for i in range(replicas):
                first = max(0, (step + 1) * PER_STEP - keep)
                hashes = [(i << 48) + n + 1 for n in range(first, (step + 1) * PER_STEP)]
                dump.append(
                    {
                        "worker_id": i,
                        "storage_tier": "device",
                        "dp_rank": 0,
                        "event": {
                            "event_id": 0,
                            "data": {
                                "stored": {
                                    "parent_hash": None,
                                    "start_position": None,
                                    "blocks": [{"block_hash": h, "tokens_hash": h} for h in hashes],
                                }
                            },
                        },
                    }
                )
            f.write(json.dumps({"t": round(step * STEP, 9), "dump": dump}) + "\n")
    return rows


BARE = """
CREATE TABLE ev AS
WITH l AS (SELECT filename AS f, json AS j FROM read_ndjson_objects('{d}/replica=*/events.jsonl', filename=true)),
e AS (SELECT regexp_extract(f, 'replica=([^/]+)', 1) AS replica, (j->>'$.seq')::BIGINT AS seq,
             (j->>'$.ts')::DOUBLE AS ts, unnest(json_extract(j, '$.events[*]')) AS e,
             generate_subscripts(json_extract(j, '$.events[*]'), 1) AS pos FROM l)
SELECT replica, seq, pos, ts, e->>'$[0]' AS kind, unnest(json_extract_string(e, '$[1][*]'))::HUGEINT AS h FROM e;
CREATE TABLE ops AS
WITH l AS (SELECT filename AS f, json AS j FROM read_ndjson_objects('{d}/replica=*/steps.jsonl', filename=true)),
o AS (SELECT regexp_extract(f, 'replica=([^/]+)', 1) AS replica, (j->>'$.step')::BIGINT AS step,
             unnest(json_extract(j, '$.ops[*]')) AS o FROM l WHERE j->>'$.step' IS NOT NULL)
SELECT replica, step, o->>'$.op' AS op,
       unnest(json_extract_string(o, '$.blocks[*]'))::BIGINT AS block,
       unnest(CASE WHEN o->>'$.op' = 'cache' THEN json_extract_string(o, '$.hashes[*]') ELSE [] END) AS hx
FROM o;
CREATE TABLE dump AS
WITH l AS (SELECT json AS j FROM read_ndjson_objects('{d}/router=*/index.jsonl')),
x AS (SELECT (j->>'$.t')::DOUBLE AS t, unnest(json_extract(j, '$.dump[*]')) AS e FROM l)
SELECT t, 'r' || (e->>'$.worker_id') AS replica,
       unnest(json_extract_string(e, '$.event.data.stored.blocks[*].block_hash'))::HUGEINT AS h FROM x;
CREATE TABLE truth AS
WITH c AS (SELECT replica, block, step, op, ('0x' || hx)::HUGEINT AS h,
                  lead(step, 1, (SELECT max(step) + 1 FROM ops)) OVER (PARTITION BY replica, block ORDER BY step, op DESC) AS nxt FROM ops)
SELECT replica, h, step * {step} AS t_from, nxt * {step} AS t_to FROM c WHERE op = 'cache';
CREATE TABLE claimed AS
SELECT replica, h, ts AS t_from, coalesce(lead(ts) OVER (PARTITION BY replica, h ORDER BY seq, pos), (SELECT max(ts) + {step} FROM ev)) AS t_to, kind
FROM ev;
CREATE TABLE belief AS
WITH times AS (SELECT t, lead(t, 1, (SELECT max(t) + {step} FROM dump)) OVER (ORDER BY t) AS nxt FROM (SELECT DISTINCT t FROM dump))
SELECT d.replica, d.h, d.t AS t_from, s.nxt AS t_to FROM dump d JOIN times s USING (t);
CREATE TABLE sides AS
SELECT 'engine' AS stage, replica, h, 1 AS ref, t_from, t_to FROM truth
UNION ALL SELECT 'engine', replica, h, 0, t_from, t_to FROM claimed WHERE kind = 'BlockStored'
UNION ALL SELECT 'router', replica, h, 1, t_from, t_to FROM claimed WHERE kind = 'BlockStored'
UNION ALL SELECT 'router', replica, h, 0, t_from, t_to FROM belief;
WITH d AS (
  SELECT stage, replica, h, t, sum(dr) AS dr, sum(dob) AS dob FROM (
    SELECT stage, replica, h, t_from AS t, ref AS dr, 1 - ref AS dob FROM sides
    UNION ALL SELECT stage, replica, h, t_to, -ref, ref - 1 FROM sides) GROUP BY ALL),
r AS (SELECT *, lead(t) OVER w AS t2, sum(dr) OVER w AS nr, sum(dob) OVER w AS nob FROM d
      WINDOW w AS (PARTITION BY stage, replica, h ORDER BY t))
SELECT count(*) FROM r WHERE t2 - t > {lag} AND (nr > 0) <> (nob > 0);
"""  # noqa: E501


def one(which: str, directory: str, lag: float) -> None:
    start = time.perf_counter()
    if which == "ours":
        import pagedkv_sql
        from pagedkv_sql import fleet

        with pagedkv_sql.connect(":memory:") as db:
            report = fleet.check(db, directory, lag=lag)
        found = len(report.findings)
    else:
        import duckdb

        con = duckdb.connect()
        *body, last = [
            s for s in BARE.format(d=directory, step=STEP, lag=lag).split(";\n") if s.strip()
        ]
        for stmt in body:
            con.execute(stmt)
        found = con.execute(last).fetchall()[0][0]
    print(json.dumps({"seconds": time.perf_counter() - start, "found": found}))


def measure(which: str, directory: Path, lag: float) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--one", which, str(directory), "--lag", str(lag)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000, help="event rows (one a hash)")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--pool", type=int, default=128, help="blocks a replica")
    p.add_argument("--dump-every", type=int, default=1000, help="steps between index dumps")
    p.add_argument("--one", nargs=2, metavar=("WHICH", "DIR"), help=argparse.SUPPRESS)
    p.add_argument("--lag", type=float, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        one(a.one[0], a.one[1], a.lag)
        return
    lag = a.dump_every * STEP
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "fleet"
        t0 = time.perf_counter()
        rows = generate(directory, a.events, a.replicas, a.pool, a.dump_every)
        size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
        print(
            f"# fleet check: {platform.platform()}, {os.cpu_count()} cores, load average "
            f"{os.getloadavg()[0]:.1f} at start"
        )
        print(
            f"fleet: {a.replicas} replicas, {rows:,} event rows, {size / 1e6:,.0f} MB, "
            f"generated in {time.perf_counter() - t0:.1f} s; lag {lag:g} s"
        )
        ours = measure("ours", directory, lag)
        bare = measure("bare", directory, lag)
    print(f"ours (fleet.check): {ours['seconds']:.2f} s, {ours['found']} finding(s)")
    print(f"bare DuckDB script: {bare['seconds']:.2f} s, {bare['found']} span(s)")
    print(
        f"ratio ours / bare: {ours['seconds'] / bare['seconds']:.2f}x (goal <= 1.5x); "
        f"load average {os.getloadavg()[0]:.1f} at the end"
    )


if __name__ == "__main__":
    main()
