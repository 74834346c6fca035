"""The fuzzer's throughput and reach (not a test), both engines in one run.

    .venv-engines/bin/python bench/fuzz.py --time 60 --limit 120
    .venv-engines/bin/python bench/fuzz.py --time 30 --kinds  # the KV-cache kinds only

For the real vLLM KVCacheManager and the real SGLang allocator + ReqToTokenPool +
RadixCache (the fuzzer's default knobs: 16 blocks of 4 tokens): a clean run of ``--time``
seconds gives examples a minute, states a second and the share of states that repeat
(memoized); its cost a state is split into the engine's own calls and the fuzzer's check
(capture, digest, and the fast check of each new state), and the fast check and the SQL
path (``load_engine`` + ``check``) are timed on the same sample of the run's distinct
states. Then each planted bug is fuzzed for at most ``--limit`` seconds: the time to find
and shrink it, and the shrunk schedule's length. Ratios are against the engine's step
measured in the same run; each of vLLM's KV-cache kinds (``--kind``) a clean run, its
examples a minute against full attention's.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

# the checkout beside this file, not another install, and the tier's torchvision stand-in
# (SGLang imports torchvision): sys.path changes, allowed among imports
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests/engines/real/standins"))

import pagedkv_sql
from pagedkv_sql.engines import check_snapshot
from pagedkv_sql.fuzz import core
from pagedkv_sql.fuzz import sglang as fuzz_sglang
from pagedkv_sql.fuzz import vllm as fuzz_vllm

SAMPLE = 30  # distinct states timed through both checks


def per_state_ms(fn: Any, states: list[Any]) -> float:
    """The median over the states of one call's ms."""
    times = []
    for s in states:
        t = time.perf_counter()
        fn(s)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def clean(name: str, module: ModuleType, seconds: float) -> list[str]:
    stats = core.Stats(keep=SAMPLE)
    machine = module.machine(16, 4, 0, 0, stats)
    with module.planted(None):
        out = core.run(machine, 10**9, 30, seconds, 0, stats)
    assert out.kind is None, out.message
    states = stats.kept
    fast = per_state_ms(check_snapshot, states)
    with pagedkv_sql.connect(":memory:") as db:
        db.load_engine(states[0])  # the views, created once
        sql = per_state_ms(lambda s: (db.load_engine(s), db.check()), states)
    engine_ms = stats.engine_seconds / stats.checks * 1000
    check_ms = stats.check_seconds / stats.checks * 1000
    repeat = 100 * (stats.checks - len(stats.seen)) / stats.checks
    rows = [
        f"## {name}: a clean run of {out.seconds:.0f} s",
        "",
        f"{stats.line()}",
        "",
        f"- examples a minute: {stats.examples / out.seconds * 60:.0f}; states a second: "
        f"{stats.checks / out.seconds:.0f}; {repeat:.0f}% of states repeat",
        "",
        "| what | ms a state | vs the engine's step |",
        "| --- | --- | --- |",
        f"| the engine's own calls (a step of the schedule) | {engine_ms:.3f} | 1.00x |",
        f"| the fuzzer's check, memoized (capture + digest, fast check of new states) "
        f"| {check_ms:.3f} | {check_ms / engine_ms:.1f}x |",
        f"| fast check of a distinct state (check_snapshot, median of {len(states)}) "
        f"| {fast:.3f} | {fast / engine_ms:.1f}x |",
        f"| SQL: load_engine + check of the same states (median) "
        f"| {sql:.3f} | {sql / engine_ms:.1f}x |",
        "",
    ]
    return rows


def planted(name: str, module: ModuleType, limit: float) -> list[str]:
    rows = [
        f"## {name}: time to find each planted bug (at most {limit:.0f} s each)",
        "",
        "| bug | found as | seconds (find + shrink) | examples run | shrunk to steps |",
        "| --- | --- | --- | --- | --- |",
    ]
    for bug in module.PLANTS:
        out = module.fuzz(examples=10**9, steps=30, seconds=limit, seed=0, plant=bug)
        kind = out.kind or "not found"
        rows.append(
            f"| {bug} | {kind} | {out.seconds:.1f} | {out.stats.examples} | {len(out.calls)} |"
        )
    rows.append("")
    return rows


def kinds(seconds: float) -> list[str]:
    """vLLM's KV-cache kinds under its real coordinator: a clean run of ``seconds`` each,
    examples a minute as a ratio to full attention's in the same run (full measured first
    and last: the machine's drift shows)."""
    rate: dict[str, list[float]] = {}
    order = ["full", *(k for k in fuzz_vllm.KINDS if k != "full"), "full"]
    for kind in order:
        out = fuzz_vllm.fuzz(examples=10**9, steps=30, seconds=seconds, seed=0, kind=kind)
        assert out.kind is None, out.message
        rate.setdefault(kind, []).append(out.stats.examples / out.seconds * 60)
    full = statistics.mean(rate["full"])
    rows = [
        f"## vLLM: examples a minute by KV-cache kind (clean runs of {seconds:.0f} s)",
        "",
        "| kind | examples a minute | vs full attention |",
        "| --- | --- | --- |",
    ]
    for kind, rates in rate.items():
        per = statistics.mean(rates)
        rows.append(f"| {kind} | {per:.0f} | {per / full:.2f}x |")
    rows.append("")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time", type=float, default=60.0, help="seconds of each clean run")
    ap.add_argument("--limit", type=float, default=120.0, help="seconds at most a planted bug")
    ap.add_argument("--kinds", action="store_true", help="only vLLM's KV-cache kinds")
    args = ap.parse_args()
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the engines import triton
    warnings.simplefilter("ignore")  # the engines' own import-time warnings
    import hypothesis
    import sglang
    import vllm

    out = [
        f"# fuzz: {platform.platform()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, vLLM {vllm.__version__}, SGLang {sglang.__version__}, "
        f"hypothesis {hypothesis.__version__}, load average {os.getloadavg()[0]:.1f} at start",
        f"# command: python bench/fuzz.py --time {args.time:g} --limit {args.limit:g}",
        "",
    ]
    out += kinds(args.time)
    for name, module in () if args.kinds else (("vLLM", fuzz_vllm), ("SGLang", fuzz_sglang)):
        out += clean(name, module, args.time)
        out += planted(name, module, args.limit)
    out.append(f"load average {os.getloadavg()[0]:.1f} at the end")
    print("\n".join(out))


if __name__ == "__main__":
    main()
