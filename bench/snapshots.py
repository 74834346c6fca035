"""What the vLLM plugin's snapshots cost the engine's step (not a test).

    .venv-engines/bin/python bench/snapshots.py --pools 100000,400000 --steps 300

vLLM's real KVCacheManager (full attention, 16-token blocks, prefix caching) of each pool
size, driven as its scheduler drives it: ``new_step_starts``, then ``allocate_slots`` for
each running request (decode; prefill in chunks for a new one, its prompt sharing a prefix
with an earlier one), finished requests freed and replaced, a request preempted at times.
Runs without snapshots and with ``PAGEDKV_SNAPSHOT_EVERY=1`` (the plugin's ``Snapshots``,
with a writer thread of their own, as for a model whose step log is refused), interleaved,
the same seed; each engine step timed whole (p50, p99), and the snapshot's own part of it
(what ``take`` does in the engine's thread) timed directly. The baseline is the full copy
of the pool the step made before (``copy_state``), timed on the same manager in the same
run. Ratios are against the run without snapshots; the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# the checkout beside this file, not another install (sys.path changes, among imports)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pagedkv_sql.plugins.vllm_snapshots import Snapshots, copy_state

BLOCK = 16


def manager(num_blocks: int) -> Any:
    import torch
    from vllm.v1 import kv_cache_interface as spec_mod
    from vllm.v1.core import kv_cache_manager

    spec = spec_mod.FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float16
    )
    groups = [spec_mod.KVCacheGroupSpec(["model.layers.0.attn"], spec)]
    config = spec_mod.KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
    )
    return kv_cache_manager.KVCacheManager(
        config,
        max_model_len=1 << 16,
        scheduler_block_size=BLOCK,
        hash_block_size=BLOCK,
        enable_caching=True,
    )


class Engine:
    """A scheduler's step over the manager: ``running`` requests decoding, each new one
    prefilled in chunks of 512 tokens, its prompt (256-4096 tokens) sharing a prefix with
    an earlier one at times; finished ones freed and replaced; one preempted at times."""

    def __init__(self, m: Any, running: int, seed: int) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.request import Request, RequestStatus

        kv_cache_utils.init_none_hash(sha256)
        self.hasher = kv_cache_utils.get_request_block_hasher(BLOCK, sha256)
        self.Request, self.Params, self.Status = Request, SamplingParams, RequestStatus
        self.m, self.rnd, self.target = m, random.Random(seed), running
        self.requests: dict[str, Any] = {}
        self.done: list[Any] = []
        self.prompts: list[list[int]] = []
        self.n = 0

    def admit(self) -> None:
        self.n += 1
        if self.prompts and self.rnd.random() < 0.5:
            base = self.rnd.choice(self.prompts)
            prompt = base[: self.rnd.randint(1, len(base))] + [self.n] * self.rnd.randint(1, 64)
        else:
            prompt = [100_000 + self.n * 8192 + i for i in range(self.rnd.randint(256, 4096))]
            self.prompts.append(prompt)
        rid = f"r{self.n}"
        self.requests[rid] = self.Request(
            rid, prompt, self.Params(max_tokens=1 << 14), None, block_hasher=self.hasher
        )

    def step(self) -> None:
        m = self.m
        m.new_step_starts()
        for r in self.done:
            m.free(r)
        self.done = []
        while len(self.requests) < self.target:
            self.admit()
        for rid, r in list(self.requests.items()):
            hit, num_hit = None, 0
            if r.num_computed_tokens == 0:
                hit, num_hit, _ = m.get_computed_blocks(r)
            todo = min(512, r.num_tokens - r.num_computed_tokens - num_hit) or 1
            if m.allocate_slots(r, todo, num_hit, hit) is None:
                m.free(r)  # preempted: it starts again
                r.num_computed_tokens = 0
                continue
            r.num_computed_tokens += num_hit + todo
            if r.num_computed_tokens >= r.num_tokens:
                r.append_output_token_ids(7)
            if r.num_output_tokens > self.rnd.randint(16, 400):
                r.status = self.Status.FINISHED_STOPPED
                self.done.append(self.requests.pop(rid))
        if self.rnd.random() < 0.02 and self.requests:  # a preemption
            r = self.requests[self.rnd.choice(list(self.requests))]
            m.free(r)
            r.num_computed_tokens = 0


def run(num_blocks: int, steps: int, running: int, snap: bool, out: Path) -> dict[str, Any]:
    m = manager(num_blocks)
    engine = Engine(m, running, seed=1)
    own: list[float] = []
    snapshots = None
    if snap:
        scheduler = SimpleNamespace(kv_cache_manager=m, requests=engine.requests)
        snapshots = Snapshots(scheduler, out / f"{num_blocks}.jsonl", 1, 2, 16 << 20)
        snapshots.attach_alone()
        take = snapshots.take

        def timed(step: int) -> None:
            t = time.perf_counter()
            take(step)
            own.append(time.perf_counter() - t)

        snapshots.take = timed  # type: ignore[method-assign]
    for _ in range(20):  # warm up: the pool filling
        engine.step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    held = sum(len(b) for b in m.coordinator.single_type_managers[0].req_to_blocks.values())
    copy = []
    for _ in range(5):
        t = time.perf_counter()
        copy_state(m, engine.requests)
        copy.append(time.perf_counter() - t)
    result = {"times": times, "own": own[20:], "copy": min(copy), "held": held}
    if snapshots is not None:
        snapshots.close(120.0)
        result["skipped"] = snapshots.skipped
        result["taken"] = len(own) - snapshots.skipped
    return result


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


def report(n: int, runs: dict[bool, list[dict[str, Any]]]) -> None:
    bare = [t for r in runs[False] for t in r["times"]]
    snap = [t for r in runs[True] for t in r["times"]]
    own = [t for r in runs[True] for t in r["own"]]
    copy = min(r["copy"] for r in runs[True]) * 1000
    b50, b99, s50, s99 = pct(bare, 0.5), pct(bare, 0.99), pct(snap, 0.5), pct(snap, 0.99)
    o50, o99 = pct(own, 0.5), pct(own, 0.99)
    print(f"{n:>7} blocks ({runs[True][-1]['held']} held at the end):")
    print(f"  engine step without snapshots    p50 {b50:7.2f} ms  p99 {b99:7.2f} ms")
    print(f"  engine step, a snapshot a step   p50 {s50:7.2f} ms  p99 {s99:7.2f} ms"
          f"  (ratio p50 {s50 / b50:.2f}, p99 {s99 / b99:.2f})")  # fmt: skip
    print(f"  the snapshot's part of the step  p50 {o50:7.3f} ms  p99 {o99:7.3f} ms"
          f"  max {max(own) * 1000:.3f} ms")  # fmt: skip
    print(f"  baseline: the whole pool's copy the step made before {copy:7.2f} ms"
          f"  (the part now / it, p50 {o50 / copy:.4f})")  # fmt: skip
    taken = sum(r["taken"] for r in runs[True])
    skipped = sum(r["skipped"] for r in runs[True])
    print(f"  snapshots handed to the writer {taken}, skipped (the writer busy) {skipped}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pools", default="100000,400000")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--running", type=int, default=64, help="requests running at once")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each mode, interleaved")
    args = ap.parse_args()
    import vllm

    print(f"# bench/snapshots.py: vLLM {vllm.__version__}, Python {platform.python_version()}")
    print(
        f"# {args.steps} engine steps a run, {args.running} requests running, {args.repeat} "
        f"runs a mode interleaved; load average {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.pools.split(",")):
            runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
            for _ in range(args.repeat):
                for snap in (False, True):
                    runs[snap].append(run(n, args.steps, args.running, snap, Path(tmp)))
            report(n, runs)
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
