"""`fleet sim`'s cost a request (not a test): 8 replicas, each a real vLLM KVCacheManager,
over 2,000 generated requests behind Dynamo's RadixTree and the approximate router.

    .venv-engines/bin/python bench/fleet.py --replicas 8 --requests 2000

Prints seconds a request for the whole run (vLLM's import excluded), and splits it into
the replicas' own steps (vLLM's manager calls with the step recorder: the baseline, timed
in the same run), the routers (events fed, requests scored, indexes dumped) and the rest
(the files written, the decisions); each part as a ratio to the replicas' steps. Also
the directory's size, since a router's index is dumped at every step where it changed.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

# the checkout beside this file, not another install: sys.path changes, allowed among imports
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DYN_LOG", "error")

from pagedkv_sql.fleet import replica, routers
from pagedkv_sql.fleet.sim import Options, run

SPENT: dict[str, float] = defaultdict(float)


def timed(cls: Any, name: str, part: str) -> None:
    original = getattr(cls, name)

    def wrapper(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return original(*a, **kw)
        finally:
            SPENT[part] += time.perf_counter() - t

    setattr(cls, name, wrapper)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--index-every", type=int, default=1)
    args = p.parse_args()
    import vllm.v1.core.kv_cache_manager  # noqa: F401  # its import is not the run's

    timed(replica.Replica, "step", "replicas' steps (vLLM + recorder)")
    for cls in (routers.DynamoRouter, routers.ApproxRouter):
        for name in ("feed", "scores", "dump"):
            timed(cls, name, f"routers: {name}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "fleet"
        t = time.perf_counter()
        fleet = run(
            out,
            Options(
                replicas=args.replicas,
                requests=args.requests,
                seed=args.seed,
                index_every=args.index_every,
            ),
        )
        total = time.perf_counter() - t
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        index = sum(f.stat().st_size for f in out.glob("router=*/index.jsonl"))
    base = SPENT["replicas' steps (vLLM + recorder)"]
    n = fleet["requests"]
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cpus")
    print(
        f"fleet sim: {args.replicas} replicas, {n} requests, {fleet['stats']['steps']} steps, "
        f"index dumped every {args.index_every} step(s), "
        f"{fleet['stats']['preempted']} preemptions"
    )
    print(
        f"  whole run        {total:8.2f} s   {total / n * 1000:7.2f} ms a request   "
        f"{total / base:5.2f}x the replicas' steps"
    )
    rest = total - sum(SPENT.values())
    for part, s in [*sorted(SPENT.items()), ("the rest (files, decisions)", rest)]:
        print(f"  {part:34s} {s:8.2f} s   {s / n * 1000:7.2f} ms a request   {s / base:5.2f}x")
    print(f"  directory {size / 2**20:.1f} MiB, of it the routers' indexes {index / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
