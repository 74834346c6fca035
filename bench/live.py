"""KV-event benchmarks (not tests): ratios against baselines measured in the same run.

    nice -n 10 python bench/live.py --events 10000000 --rate 200000 --seconds 60

- `kv-events` (pagedkv_sql.live.check_stream) on a vLLM-shaped msgpack file of N events, in a
  subprocess each (its max RSS), at N/10 and N: events/s, RSS (flat in the file's size?),
  against the floor of any reader (msgpack.Unpacker skipping every object, no decoding) and
  against the old reader (the hand-written framer and a Python object an event, from git);
  with `--baseline REV`, REV's kv-events on the same files right after this tree's.
- `watch` subscribed to a synthetic publisher (pagedkv_sql.live.publisher, vLLM's wire
  protocol) sending RATE events/s for SECONDS: events received vs published, sequence gaps,
  and the latency of findings (a removal of an unknown hash planted every 1,000 batches:
  the time from the publisher's timestamp to the finding's line), p50 / p99 / max.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# events a batch; --per-batch sets it for this process and its children
PER_BATCH = int(os.environ.get("PAGEDKV_BENCH_PER_BATCH", "20"))


def event_batches(n: int, seed: int = 0) -> Any:
    """Batches of vLLM-shaped events, as its scheduler emits them a step: one BlockStored a
    request (of 64), its parent the request's previous block, stored in an earlier step; old
    blocks evicted so the cache holds at most ~50,000 (a healthy stream); PER_BATCH events."""
    from pagedkv_sql.live.publisher import BlockRemoved, BlockStored

    rng = random.Random(seed)
    live: list[int] = []  # stored, oldest first
    head = 0
    chains: dict[int, int] = {}  # request -> its last block
    owner: dict[int, int] = {}  # block -> request, while it is its chain's end
    nxt = 1
    tokens = list(range(16))
    made = 0
    while made < n:
        batch: list[Any] = []
        requests = iter(rng.sample(range(64), PER_BATCH))
        while len(batch) < PER_BATCH and made < n:
            if len(live) - head > 50_000 or (len(live) > head and rng.random() < 0.45):
                h = live[head]
                head += 1
                if head > 100_000:
                    del live[:head]
                    head = 0
                r = owner.pop(h, None)
                if r is not None:
                    del chains[r]
                batch.append(BlockRemoved([h], "GPU"))
            else:
                r = next(requests)
                parent = chains.get(r)
                if parent is not None:
                    owner.pop(parent, None)
                h = nxt
                nxt += 1
                chains[r] = h
                owner[h] = r
                live.append(h)
                batch.append(BlockStored([h], parent, tokens, 16, None, "GPU", None))
            made += 1
        yield batch


def write_file(path: Path, n: int, layout: str = "map") -> None:
    """`map`: vLLM 0.32's events (maps tagged by "type"); `array`: the tagged arrays of
    older vLLM releases (SGLang's share their first six fields)."""
    import msgspec

    from pagedkv_sql.live.publisher import BlockStored, EventBatch

    enc = msgspec.msgpack.Encoder()
    with path.open("wb") as f:
        for batch in event_batches(n):
            if layout == "array":
                events: list[Any] = [
                    ["BlockStored", e.block_hashes, e.parent_block_hash, e.token_ids,
                     e.block_size, e.lora_id, e.medium]
                    if isinstance(e, BlockStored) else ["BlockRemoved", e.block_hashes, e.medium]
                    for e in batch
                ]  # fmt: skip
                f.write(enc.encode([1.0, events, 0]))
            else:
                f.write(enc.encode(EventBatch(1.0, batch, 0)))


def child(mode: str, path: str, old: str | None) -> None:
    """Run one reader on a file and print its figures as JSON (its own process: its RSS)."""
    import msgpack

    import pagedkv_sql
    from pagedkv_sql.live import check_stream

    t = time.perf_counter()
    c = time.process_time()
    if mode == "new":
        with open(path, "rb") as f:
            r = check_stream(f, path)
        n, findings = r.events, r.total
    elif mode == "store":
        with pagedkv_sql.connect(path + ".duckdb") as db, open(path, "rb") as f:
            r = check_stream(f, path, db=db)
        n, findings = r.events, r.total
        os.unlink(path + ".duckdb")
    elif mode == "unpack":  # msgpack.Unpacker's pass: every object decoded, nothing checked
        with open(path, "rb") as f:
            k = sum(1 for _ in msgpack.Unpacker(f, max_buffer_size=1 << 31))
        n, findings = k * PER_BATCH, 0
    elif mode == "floor":
        u = msgpack.Unpacker(open(path, "rb"), max_buffer_size=1 << 31)  # noqa: SIM115
        k = 0
        while True:
            try:
                u.skip()
            except msgpack.OutOfData:
                break
            k += 1
        n, findings = k * PER_BATCH, 0
    else:  # the old reader, loaded from git
        import importlib.util

        spec = importlib.util.spec_from_file_location("pagedkv_sql.replay._old_kvevents", old)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # its dataclasses look themselves up there
        spec.loader.exec_module(mod)
        evs = mod.read_kv_events(path)
        rep = mod.check_kv_events(evs)
        n, findings = rep.events, len(rep.findings)
    wall = time.perf_counter() - t
    cpu = time.process_time() - c
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"events": n, "wall": wall, "cpu": cpu, "rss": rss, "findings": findings}))


def run_child(mode: str, path: Path, old: Path | None = None, tree: Path = ROOT) -> dict[str, Any]:
    """One reader in a process of its own; `tree`: the checkout whose code it runs."""
    argv = [sys.executable, str(tree / "bench" / "live.py"), "--child", mode, str(path)]
    if old is not None:
        argv.append(str(old))
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def checkout(rev: str, work: Path) -> Path:
    """The tree of git revision `rev` (its code and this bench as they were), for a baseline
    run beside this tree's in the same run."""
    tree = work / f"tree-{rev.replace('/', '_')}"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "pagedkv_sql", "bench"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def bench_file(n: int, work: Path, baseline: str | None = None) -> None:
    old = work / "old_kvevents.py"
    old.write_text(
        subprocess.run(
            ["git", "-C", str(ROOT), "show", "df6611b:pagedkv_sql/replay/kvevents.py"],
            check=True, capture_output=True, text=True,
        ).stdout.replace("from ..errors", "from pagedkv_sql.errors")
    )  # fmt: skip
    sizes = [n // 10, n]
    files = {}
    for k in sizes:
        files[k] = work / f"events-{k}.msgpack"
        t = time.perf_counter()
        write_file(files[k], k)
        print(f"wrote {files[k].name}: {k:,} events, {files[k].stat().st_size / 2**20:.0f} MiB "
              f"in {time.perf_counter() - t:.1f} s")  # fmt: skip
    small = work / "events-200000.msgpack"
    write_file(small, 200_000)
    base = checkout(baseline, work) if baseline else None
    rows = []
    based: list[tuple[int, dict[str, Any]]] = []
    for k in sizes:
        floor = run_child("floor", files[k])
        new = run_child("new", files[k])
        rows.append((k, floor, new))
        if base is not None:  # right after this tree's: the same load, as near as it gets
            based.append((k, run_child("new", files[k], tree=base)))
    store = run_child("store", files[sizes[0]])
    old_r = run_child("old", small, old)
    new_small = run_child("new", small)
    print("\n| events | reader | events/s (wall) | events/s (CPU) | max RSS | vs floor |")
    print("|---:|---|---:|---:|---:|---:|")

    def row(k: int, name: str, r: dict[str, Any], floor: dict[str, Any] | None = None) -> None:
        rate = r["events"] / r["wall"]
        vs = f"{rate / (floor['events'] / floor['wall']):.2f}" if floor else ""
        cpu = r["events"] / r["cpu"]
        print(f"| {k:,} | {name} | {rate:,.0f} | {cpu:,.0f} | {r['rss'] / 2**20:.0f} MiB | {vs} |")

    wases: list[dict[str, Any] | None] = [w for _, w in based] or [None] * len(rows)
    for (k, floor, new), was in zip(rows, wases, strict=True):
        row(k, "msgpack.Unpacker.skip (floor)", floor, floor)
        row(k, "kv-events (new)", new, floor)
        if was is not None:
            row(k, f"kv-events ({baseline})", was, floor)
    row(sizes[0], "kv-events --db (new, stored)", store)
    row(200_000, "old reader (git df6611b)", old_r)
    row(200_000, "kv-events (new)", new_small)
    a, b = rows[0][2], rows[1][2]
    grown = files[sizes[1]].stat().st_size / files[sizes[0]].stat().st_size
    ratio = b["rss"] / a["rss"]
    print(f"\nRSS at {sizes[1]:,} / at {sizes[0]:,} events: {ratio:.2f} (file {grown:.1f}x)")
    print(
        f"new / old reader (200,000 events, wall): "
        f"{(new_small['events'] / new_small['wall']) / (old_r['events'] / old_r['wall']):.0f}x"
    )
    print(f"findings: {[r[2]['findings'] for r in rows]} (a healthy stream: 0)")
    for (k, _, new), (_, was) in zip(rows, based, strict=False):
        us, us_was = new["cpu"] / new["events"] * 1e6, was["cpu"] / was["events"] * 1e6
        print(f"CPU an event at {k:,} events: {us:.3f} us, {baseline}: {us_was:.3f} us "
              f"({1 - us / us_was:.0%} less); findings {new['findings']} / "
              f"{was['findings']}")  # fmt: skip


def bench_unpack(n: int, work: Path, baseline: str | None = None, rounds: int = 3) -> None:
    """`kv-events` against msgpack.Unpacker's pass over the same bytes (every object
    decoded, nothing checked), CPU seconds, both layouts; REV's kv-events beside. The
    readers run in interleaved rounds (a noisy neighbour touches all alike), medians; the
    load average is the least and most seen over the rounds of a layout."""
    import statistics

    base = checkout(baseline, work) if baseline else None
    print(f"\n{PER_BATCH} events a batch, {os.cpu_count()} cores, median of {rounds} rounds")
    print("\n| layout | reader | CPU s | wall s | CPU vs Unpacker's pass | load average |")
    print("|---|---|---:|---:|---:|---|")
    for layout in ("map", "array"):
        path = work / f"events-{layout}-{n}.msgpack"
        write_file(path, n, layout)
        names = ["msgpack.Unpacker (every object)", "kv-events"]
        if base is not None:
            names.append(f"kv-events ({baseline})")
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        loads = [os.getloadavg()[0]]
        for _ in range(rounds):
            runs[names[0]].append(run_child("unpack", path))
            runs[names[1]].append(run_child("new", path))
            if base is not None:
                runs[names[2]].append(run_child("new", path, tree=base))
            loads.append(os.getloadavg()[0])
        cpu = {k: statistics.median(r["cpu"] for r in v) for k, v in runs.items()}
        wall = {k: statistics.median(r["wall"] for r in v) for k, v in runs.items()}
        load = f"{min(loads):.1f}-{max(loads):.1f}"
        for name in names:
            print(f"| {layout} | {name} | {cpu[name]:.2f} | {wall[name]:.2f} | "
                  f"{cpu[name] / cpu[names[0]]:.2f}x | {load} |")  # fmt: skip


def bench_stop(work: Path, publishers: int = 4, tries: int = 3) -> None:
    """How long `watch` takes to end after SIGINT while `publishers` flood it."""
    code = (
        "import sys, time\n"
        "from pagedkv_sql.live.publisher import Publisher, BlockStored\n"
        "p = Publisher(replay=False); print(p.endpoint, flush=True); h = 0\n"
        "while True:\n"
        "    p.publish([BlockStored([h], None, [], 16, None, None, None)], keep=False); h += 1\n"
    )
    for t in range(tries):
        pubs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                 cwd=ROOT) for _ in range(publishers)]  # fmt: skip
        try:
            ends = [p.stdout.readline().strip() for p in pubs if p.stdout is not None]
            argv = [sys.executable, "-m", "pagedkv_sql", "watch", *ends]
            w = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
            time.sleep(6)
            asked = time.monotonic()
            w.send_signal(2)
            w.communicate(timeout=120)
            took = time.monotonic() - asked
        finally:
            for p in pubs:
                p.kill()
                p.communicate()
        print(f"stop {t + 1}: watch of {publishers} flooding publishers ended {took:.2f} s "
              f"after SIGINT (exit {w.returncode})")  # fmt: skip


def bench_steplog(work: Path, steps: int) -> None:
    """`watch LOG` (checked window by window) against `replay LOG` (the whole log at once)
    on one synthetic log: seconds, CPU, max RSS, and the finding planted near its end."""
    log = work / "steps.jsonl"
    subprocess.run([sys.executable, "-m", "pagedkv_sql", "synth-log", str(log), "--steps",
                    str(steps), "--fault", f"double_free@{steps - 10}"], check=True, cwd=ROOT,
                   capture_output=True)  # fmt: skip
    print(f"\nstep log: {steps:,} steps, {log.stat().st_size / 2**20:.0f} MiB")
    print("| command | wall s | CPU s | max RSS | the planted finding |\n|---|---:|---:|---:|---|")
    for name, args in (("watch LOG", ["watch", str(log)]),
                       ("replay LOG --keep-going", ["replay", str(log), "--db", ":memory:",
                                                   "--keep-going"])):  # fmt: skip
        out = work / "out.txt"
        begun = time.monotonic()
        with out.open("w") as f:
            p = subprocess.Popen([sys.executable, "-m", "pagedkv_sql", *args], cwd=ROOT,
                                 stdout=f, stderr=subprocess.DEVNULL)  # fmt: skip
            _, _, usage = os.wait4(p.pid, 0)
        wall = time.monotonic() - begun
        found = [x for x in out.read_text().splitlines() if "double_free" in x][:1]
        cpu = usage.ru_utime + usage.ru_stime
        seen = found[0][-60:] if found else "none"
        print(f"| `{name}` | {wall:.1f} | {cpu:.1f} | {usage.ru_maxrss / 1024:.0f} MiB | {seen} |")


def publisher_main(rate: int, seconds: float, ready: str) -> None:
    """A process publishing RATE events/s for SECONDS; a planted fault every 1,000 batches."""
    from pagedkv_sql.live.publisher import BlockRemoved, Publisher

    pub = Publisher()
    Path(ready).write_text(json.dumps([pub.endpoint, pub.replay_endpoint]))
    # the watch subscribes, then asks the replay socket for what came before: start after
    # that (a fixed sleep let a watch slow to start on the loaded machine join late, past
    # the publisher's buffer: a gap, and its removals unverifiable)
    if not pub.asked.wait(120):
        raise SystemExit("no watch asked the replay socket in 120 s")
    time.sleep(0.5)  # its subscription reaches the PUB socket (ZeroMQ's slow joiner)
    gen = event_batches(10**12, seed=1)
    per_tick = max(1, rate // PER_BATCH // 100)  # batches every 10 ms
    start = time.monotonic()
    sent = batches = 0
    tick = 0
    while time.monotonic() - start < seconds:
        for _ in range(per_tick):
            evs = next(gen)
            if batches % 1000 == 999:
                evs.append(BlockRemoved([-1 - batches], "GPU"))  # a hash never stored
            pub.publish(evs)
            batches += 1
            sent += len(evs)
        tick += 1
        delay = start + tick * 0.01 - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    took = time.monotonic() - start
    time.sleep(1.0)
    print(json.dumps({"events": sent, "batches": batches, "seconds": took}))
    pub.close()


def bench_watch(rate: int, seconds: float, work: Path) -> None:
    ready = work / "endpoints.json"
    pub = subprocess.Popen(
        [sys.executable, __file__, "--publisher", str(rate), str(seconds), str(ready)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    while not ready.exists() or not ready.read_text():
        time.sleep(0.05)
    endpoint, replay = json.loads(ready.read_text())
    out = work / "watch.jsonl"
    with out.open("w") as f:
        w = subprocess.Popen(
            [sys.executable, "-m", "pagedkv_sql", "watch", endpoint, "--replay-endpoint", replay,
             "--format", "jsonl", "--duration", str(seconds + 6)],
            stdout=f, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        published = json.loads(pub.communicate(timeout=seconds + 60)[0].strip().splitlines()[-1])
        # the watch's own CPU time (its rusage at exit): what a rate costs it, whatever the
        # machine's load left it
        _, status, usage = os.wait4(w.pid, 0)
        w.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    if w.returncode not in (0, 1):
        raise SystemExit(f"watch failed ({w.returncode}): {w.stderr.read() if w.stderr else ''}")
    records = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    summary = records[-1]
    lat = sorted(
        (r["reported"] - r["ts"]) * 1000
        for r in records
        if r["type"] == "finding" and r["check"] == "unknown_removal"
    )
    planted = published["batches"] // 1000
    p = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]) if lat else (lambda q: float("nan"))
    print(f"\npublisher: {published['events']:,} events in {published['batches']:,} batches, "
          f"{published['seconds']:.1f} s ({published['events'] / published['seconds']:,.0f} "
          f"events/s)")  # fmt: skip
    print(f"watch: {summary['events']:,} events received "
          f"({summary['events'] / published['events']:.4f} of those published), "
          f"{summary['gaps']} sequence gap(s), {summary['problems']} problem(s), "
          f"findings {summary['findings']} ({planted} planted)")  # fmt: skip
    print(f"watch CPU: {cpu:.1f} s (user + system), {summary['events'] / cpu:,.0f} events a "
          f"CPU second; load average {os.getloadavg()[0]:.1f} at the end")  # fmt: skip
    print(
        f"finding latency (publisher's ts -> finding written), ms: p50 {p(0.5):.1f}, "
        f"p99 {p(0.99):.1f}, max {lat[-1] if lat else float('nan'):.1f} over {len(lat)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--rate", type=int, default=200_000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--only", choices=["file", "watch", "unpack", "stop", "steplog"])
    ap.add_argument("--steps", type=int, default=20_000, help="the step log's (--only steplog)")
    ap.add_argument("--baseline", help="a git revision whose kv-events runs beside (e.g. main)")
    ap.add_argument("--per-batch", type=int, help="events a batch (default 20)")
    ap.add_argument("--child", nargs="+")
    ap.add_argument("--publisher", nargs=3)
    a = ap.parse_args()
    if a.per_batch:
        global PER_BATCH
        PER_BATCH = a.per_batch
        os.environ["PAGEDKV_BENCH_PER_BATCH"] = str(a.per_batch)
    if a.child:
        child(a.child[0], a.child[1], a.child[2] if len(a.child) > 2 else None)
        return
    if a.publisher:
        publisher_main(int(a.publisher[0]), float(a.publisher[1]), a.publisher[2])
        return
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs, "
          f"{PER_BATCH} events a batch, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pagedkv-bench-live-") as d:
        work = Path(d)
        if a.only in (None, "file"):
            bench_file(a.events, work, a.baseline)
        if a.only in (None, "unpack"):
            bench_unpack(min(a.events, 2_000_000), work, a.baseline)
        if a.only in (None, "watch"):
            bench_watch(a.rate, a.seconds, work)
        if a.only in (None, "stop"):
            bench_stop(work)
        if a.only in (None, "steplog"):
            bench_steplog(work, a.steps)


if __name__ == "__main__":
    main()
