"""A synthetic step log: a small paged-KV engine simulated step by step (arrivals with shared
system prompts hitting the prefix cache, prefill, growth token by token, parallel-sampling
forks, finishes, eviction of cached blocks, swaps under memory pressure, the engine's own
counts now and then), with named faults planted at known steps.

The simulator is sound: a log without planted faults breaks no invariant, and each planted
fault is found by ``replay`` at its step."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from .. import compression, invariants
from ..errors import UsageError
from ..limits import MAX_BLOCK_SIZE
from .log import Builder, Header, events_format, write_events

# the faults and what each plants: the catalogue's (pagedkv_sql/invariants.py)
FAULTS = invariants.faults()
# those planted in the step's observation, after it is taken
_OBSERVED_FAULTS = invariants.observed_faults()


def fault_name(name: str) -> str:
    """A fault's name: its old name (``invariants.RENAMED_FAULTS``) still taken."""
    return invariants.RENAMED_FAULTS.get(name, name)


@dataclass(frozen=True)
class StepSynthConfig:
    steps: int = 1000
    block_size: int = 16
    num_gpu_blocks: int = 1024
    arrival_rate: float = 1.0  # new requests a step, on average
    max_running: int = 64
    prompt_tokens: int = 200
    output_tokens: int = 300
    prefix_groups: int = 8  # shared system prompts
    prefix_tokens: int = 96
    fork_fraction: float = 0.1
    fork_width: int = 2
    observe_every: int = 10
    seed: int = 0
    faults: tuple[tuple[str, int], ...] = ()
    hashes: bool = True  # the prefix cache's hashes: cache ops, and the hashes hits ask for

    def __post_init__(self) -> None:
        """Refuse a configuration whose log ``replay`` would refuse, or that the simulator
        cannot run (--arrival-rate nan, --block-size 0 or 300, a pool of 0 blocks,
        --steps -1, a fault past the last step), naming the option."""
        for name, (low, high) in _BOUNDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise UsageError(f"--{_option(name)} must be a number, not {value!r}")
            if not (math.isfinite(value) and low <= value <= high):
                raise UsageError(
                    f"--{_option(name)} {value} is outside [{low}, {high}]",
                    hint=_HINTS.get(name, ""),
                )
        object.__setattr__(self, "faults", tuple((fault_name(n), s) for n, s in self.faults))
        planted: dict[int, str] = {}
        for name, step in self.faults:
            if step in planted:  # one fault a step: the simulator plants one, not both
                raise UsageError(
                    f"--fault {name}@{step}: step {step} already has --fault "
                    f"{planted[step]}@{step}; only one fault is planted a step",
                    hint="plant each fault at a step of its own",
                )
            planted[step] = name
            if name not in FAULTS:
                raise UsageError(f"unknown fault '{name}'; faults: {', '.join(FAULTS)}")
            if not 0 <= step < self.steps:
                raise UsageError(
                    f"--fault {name}@{step} is past the log's last step {self.steps - 1} "
                    f"(--steps {self.steps}): it would not be planted",
                    hint="plant each fault at a step in [0, --steps)",
                )


# each number's range: what the simulator runs and the log's header accepts (replay/log.py)
_BOUNDS: dict[str, tuple[float, float]] = {
    "steps": (0, 10_000_000),
    "block_size": (1, MAX_BLOCK_SIZE),
    "num_gpu_blocks": (2, 2**31 - 1),
    "arrival_rate": (0.0, 1000.0),
    "max_running": (1, 1_000_000),
    "prompt_tokens": (1, 1_000_000),
    "output_tokens": (1, 1_000_000),
    "prefix_groups": (0, 1_000_000),
    "prefix_tokens": (0, 1_000_000),
    "fork_fraction": (0.0, 1.0),
    "fork_width": (1, 1000),
    "observe_every": (0, 10_000_000),
    "seed": (0, 2**63 - 1),
}
_HINTS = {
    "block_size": f"a step log's block size is 1..{MAX_BLOCK_SIZE} tokens (the spec's "
    "offset_in_block)",
    "num_gpu_blocks": "block 0 is reserved: a pool of N blocks hands out N - 1",
}


def _option(name: str) -> str:
    return name.replace("_", "-")


def prefix_hash(group: int, index: int) -> str:
    """The hash of block ``index`` of shared prompt ``group`` (64 bits, as a log writes it)."""
    return hashlib.blake2b(f"{group}:{index}".encode(), digest_size=8).hexdigest()


def parse_fault(text: str) -> tuple[str, int]:
    """``NAME@STEP`` -> (name, step)."""
    name, _, step = text.partition("@")
    name = fault_name(name)
    if name not in FAULTS or not step.isdigit():
        raise UsageError(
            f"bad --fault '{text}': give NAME@STEP with NAME one of {', '.join(FAULTS)}"
        )
    return name, int(step)


@dataclass
class _Req:
    rid: str
    blocks: list[int]
    tokens: int
    target: int
    group: int | None
    running: bool = True
    swapped: list[int] = field(default_factory=list)  # cpu addresses of swapped entries


class _Engine:
    """The simulated engine: a pool, a free list, a prefix cache of shared prompts."""

    def __init__(self, cfg: StepSynthConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.free: list[int] = list(range(cfg.num_gpu_blocks - 1, 0, -1))  # block 0 reserved
        self.ref: dict[int, int] = {}
        self.cached: OrderedDict[int, int] = OrderedDict()  # evictable: block -> group
        self.prefix: dict[int, list[int]] = {}  # group -> its cached prompt blocks
        self.reqs: dict[str, _Req] = {}
        self.finished: list[str] = []
        self.next_id = 0
        self.next_cpu = 1 << 32
        self.faults = {step: name for name, step in cfg.faults}
        self.late: str | None = None

    # -- the pool ----------------------------------------------------------------------
    def num_free(self) -> int:
        return self.cfg.num_gpu_blocks - 1 - sum(1 for n in self.ref.values() if n > 0)

    def take(self, ops: list[dict[str, Any]]) -> int | None:
        if not self.free:
            return None
        b = self.free.pop()
        self.ref[b] = 1
        return b

    def evict(self, ops: list[dict[str, Any]]) -> None:
        """Keep free blocks above a watermark by evicting the least recently cached ones
        (at the end of a step: the log applies ``ops`` after the step's allocations)."""
        evicted = []
        while len(self.free) < self.cfg.num_gpu_blocks // 8 and self.cached:
            b, group = self.cached.popitem(last=False)
            self.prefix.pop(group, None)
            self.free.append(b)
            evicted.append(b)
        if evicted:
            ops.append({"op": "evict", "blocks": evicted})

    def hold(self, b: int) -> None:
        self.ref[b] = self.ref.get(b, 0) + 1
        self.cached.pop(b, None)

    def drop(self, b: int) -> None:
        self.ref[b] -= 1
        if self.ref[b] == 0:
            del self.ref[b]
            if b >= self.cfg.num_gpu_blocks:
                return
            group = next((g for g, bl in self.prefix.items() if b in bl), None)
            if group is not None:
                self.cached[b] = group
            else:
                self.free.append(b)

    def fork_of(self, r: _Req, new: list[dict[str, Any]], ops: list[dict[str, Any]]) -> None:
        """A parallel sample of ``r``: a fork when its prompt fills whole blocks (nothing to
        copy on write), else a new request hitting its full blocks in the prefix cache."""
        bs = self.cfg.block_size
        child = f"req-{self.next_id}"
        self.next_id += 1
        tail: list[int] = []
        if r.tokens % bs == 0:
            blocks = list(r.blocks)
            ops.append({"op": "fork", "req": child, "parent": r.rid})
        else:
            blocks = r.blocks[: r.tokens // bs]
            fresh = self.take(ops)
            if fresh is None:
                return
            tail = [fresh]
            new.append(
                {
                    "req_id": child,
                    "block_ids": [[*blocks, *tail]],
                    "num_computed_tokens": len(blocks) * bs,
                    "num_scheduled_tokens": r.tokens - len(blocks) * bs,
                }
            )
        for b in blocks:
            self.hold(b)
        self.reqs[child] = _Req(child, [*blocks, *tail], r.tokens, r.target, r.group)

    def cpu(self) -> int:
        address = self.next_cpu
        self.next_cpu += 256 * self.cfg.block_size
        return address

    # -- one step ----------------------------------------------------------------------
    def step(self, n: int) -> dict[str, Any]:
        cfg, rng = self.cfg, self.rng
        out: dict[str, Any] = {"step": n}
        ops: list[dict[str, Any]] = []
        if self.late is not None:  # the block an unresolved_token fault held back
            late = self.reqs.get(self.late)
            b = self.take(ops)
            if late is not None and late.running and b is not None:
                ops.append({"op": "allocate", "req": late.rid, "blocks": [b]})
                late.blocks.append(b)
            self.late = None
        leaked = self.leak(n)
        finished = [r for r in self.reqs.values() if r.running and r.tokens >= r.target]
        if finished:
            out["finished"] = [r.rid for r in finished]
            for r in finished:
                for b in r.blocks:
                    self.drop(b)
                del self.reqs[r.rid]
                self.finished.append(r.rid)
        # arrivals, with prefix-cache hits on a shared system prompt
        new = []
        arrivals = int(cfg.arrival_rate) + (rng.random() < cfg.arrival_rate % 1)
        live = sum(1 for r in self.reqs.values() if r.running)
        if live >= cfg.max_running or any(not r.running for r in self.reqs.values()):
            arrivals = 0  # the swapped-out requests go first
        for _ in range(arrivals):
            group = rng.randrange(cfg.prefix_groups) if cfg.prefix_groups else None
            prompt = max(1, int(rng.expovariate(1 / cfg.prompt_tokens)))
            hit: list[int] = []
            if group is not None:
                prompt += cfg.prefix_tokens
                hit = list(self.prefix.get(group, []))
                hit = hit[: (prompt - 1) // cfg.block_size]
            need = -(-prompt // cfg.block_size) - len(hit)
            if len(self.free) - need < cfg.num_gpu_blocks // 16:
                break
            for b in hit:
                self.hold(b)
            fresh = [self.take(ops) for _ in range(need)]
            blocks = hit + [b for b in fresh if b is not None]
            rid = f"req-{self.next_id}"
            self.next_id += 1
            r = _Req(
                rid,
                blocks,
                prompt,
                prompt + max(1, int(rng.expovariate(1 / cfg.output_tokens))),
                group,
            )
            self.reqs[rid] = r
            if group is not None and group not in self.prefix:
                full = cfg.prefix_tokens // cfg.block_size
                self.prefix[group] = blocks[:full]
                if cfg.hashes and blocks[:full]:  # the engine caches the prompt's blocks
                    cached = blocks[:full]
                    hashes = [prefix_hash(group, i) for i in range(len(cached))]
                    ops.append({"op": "cache", "blocks": cached, "hashes": hashes})
            new.append(
                {
                    "req_id": rid,
                    "block_ids": [list(blocks)],
                    "num_computed_tokens": len(hit) * cfg.block_size,
                    "num_scheduled_tokens": prompt - len(hit) * cfg.block_size,
                }
            )
            if cfg.hashes and hit and group is not None:  # the hashes the hit asked for
                asked: list[str] = [prefix_hash(group, i) for i in range(len(hit))]
                new[-1]["hashes"] = asked
            if rng.random() < cfg.fork_fraction:
                for _ in range(cfg.fork_width - 1):
                    self.fork_of(r, new, ops)
        if new:
            out["new_requests"] = new
        # decode: one token each; a new block when the last one is full (a fork copies the
        # shared last block first: copy-on-write)
        running_rows = []
        arrived = {x["req_id"] for x in new} | {o["req"] for o in ops if o["op"] == "fork"}
        for r in list(self.reqs.values()):
            if not r.running or r.rid in arrived:
                continue
            new_blocks: list[int] = []
            if r.tokens % cfg.block_size == 0:
                b = self.take(ops)
                if b is None:
                    continue
                new_blocks = [b]
                r.blocks.append(b)
            running_rows.append(
                {
                    "req_id": r.rid,
                    "new_block_ids": [new_blocks],
                    "num_computed_tokens": r.tokens,
                    "num_scheduled_tokens": 1,
                }
            )
            r.tokens += 1
        if running_rows:
            out["running"] = running_rows
        # memory pressure: swap a request out; room again: swap one in
        running = [r for r in self.reqs.values() if r.running]
        if len(self.free) < cfg.num_gpu_blocks // 16 and len(running) > 1:
            victim = max(running, key=lambda r: len(r.blocks))
            addresses = [self.cpu() for _ in victim.blocks]
            ops.append({"op": "swap_out", "req": victim.rid, "cpu": list(addresses)})
            for b in victim.blocks:
                self.drop(b)
            victim.blocks, victim.swapped, victim.running = [], addresses, False
        else:
            waiting = [r for r in self.reqs.values() if not r.running]
            if waiting and len(self.free) >= len(waiting[0].swapped) + cfg.num_gpu_blocks // 8:
                r = waiting[0]
                blocks = [b for b in (self.take(ops) for _ in r.swapped) if b is not None]
                ops.append({"op": "swap_in", "req": r.rid, "blocks": list(blocks)})
                r.blocks, r.swapped, r.running = blocks, [], True
        if leaked is not None:  # its free, after the step's arrivals (its blocks were held)
            ops.append({"op": "free", "req": leaked.rid, "handed": leaked.blocks[:-1]})
            for b in leaked.blocks[:-1]:
                self.drop(b)
        self.evict(ops)
        if ops:
            out["ops"] = ops
        fault = self.faults.get(n)
        if fault is not None and fault not in (*_OBSERVED_FAULTS, "leak"):
            self.plant(fault, out)
        if cfg.observe_every and n % cfg.observe_every == 0:
            held = sorted(self.ref)
            sample = rng.sample(held, min(4, len(held)))
            out["observed"] = {
                "ref_cnt": {str(b): self.ref[b] for b in sorted(sample)},
                "num_free_blocks": self.num_free(),
            }
        if fault in _OBSERVED_FAULTS:
            self.plant(fault, out)
        return out

    # -- faults ------------------------------------------------------------------------
    def leak(self, n: int) -> _Req | None:
        """The ``leak`` fault's request, taken out of the step before it runs: freed at the
        step's end, its last block (held by it alone) kept back from the pool."""
        if self.faults.get(n) != "leak":
            return None
        alone = [
            r
            for r in self.reqs.values()
            if r.running and r.blocks and r.tokens and self.ref.get(r.blocks[-1]) == 1
        ]
        if not alone:
            raise UsageError(f"cannot plant leak at step {n}: no request holds a block alone")
        victim = alone[len(alone) // 2]
        del self.reqs[victim.rid]
        self.finished.append(victim.rid)
        return victim

    def plant(self, name: str, out: dict[str, Any]) -> None:
        """Add one fault to the step; the simulator's own state stays sound."""
        ops = out.setdefault("ops", [])
        holders = [r for r in self.reqs.values() if r.running and r.blocks]
        if not holders:
            raise UsageError(f"cannot plant {name} at step {out['step']}: no request holds a block")
        victim = holders[len(holders) // 2]
        block = victim.blocks[0]
        if name == "fresh_while_held":
            rid = f"req-{self.next_id}"
            self.next_id += 1
            ops.append({"op": "allocate", "req": rid, "blocks": [block]})
            self.reqs[rid] = _Req(rid, [block], 0, 8, None)
            self.hold(block)
        elif name == "double_free":
            other = next(b for b in range(1, self.cfg.num_gpu_blocks) if b not in victim.blocks)
            ops.append({"op": "release", "req": victim.rid, "blocks": [other]})
        elif name == "refcount_mismatch":
            obs = out.setdefault("observed", {})
            obs.setdefault("ref_cnt", {})[str(block)] = self.ref[block] + 1
        elif name == "free_count":
            out.setdefault("observed", {})["num_free_blocks"] = self.num_free() + 3
        elif name == "held_free_block":
            out.setdefault("observed", {}).setdefault("free_list", []).append(block)
        elif name == "free_list_duplicate":
            if not self.free:
                raise UsageError(f"cannot plant {name} at step {out['step']}: no free block")
            out.setdefault("observed", {}).setdefault("free_list", []).extend([self.free[-1]] * 2)
        elif name == "prefix_hash":  # a hit in the wrong order: another block's hash
            cached = sorted(g for g, bl in self.prefix.items() if bl)
            if not cached or not self.cfg.hashes:
                raise UsageError(f"cannot plant {name} at step {out['step']}: nothing cached")
            group = cached[0]
            rid = f"req-{self.next_id}"
            self.next_id += 1
            shared = self.prefix[group][0]
            wrong = prefix_hash(group, 1)
            ops.append({"op": "share", "req": rid, "blocks": [shared], "hashes": [wrong]})
            self.reqs[rid] = _Req(rid, [shared], 0, 8, None)
            self.hold(shared)
        elif name == "freed_request_referenced":
            if not self.finished:
                raise UsageError(f"cannot plant {name} at step {out['step']}: none finished yet")
            ops.append({"op": "append", "req": self.finished[-1], "tokens": 1})
        elif name == "unresolved_token":
            room = len(victim.blocks) * self.cfg.block_size - victim.tokens
            ops.append({"op": "append", "req": victim.rid, "tokens": room + 1})
            victim.tokens += room + 1
            self.late = victim.rid  # its block comes a step late
        elif name == "duplicate_block":
            ops.append({"op": "share", "req": victim.rid, "blocks": [block]})
            victim.blocks.append(block)
            self.hold(block)
        elif name == "evict_held":
            ops.append({"op": "evict", "blocks": [block]})
        elif name == "outside_pool":
            ops.append({"op": "allocate", "req": victim.rid, "blocks": [self.cfg.num_gpu_blocks]})
            victim.blocks.append(self.cfg.num_gpu_blocks)
            self.ref[self.cfg.num_gpu_blocks] = 1
        elif name == "unaligned_cpu_address":
            fresh = self.take(ops)
            if fresh is None:
                raise UsageError(f"cannot plant {name} at step {out['step']}: no free block")
            address = self.cpu() + 8
            ops.append({"op": "swap_out", "req": victim.rid, "blocks": [block], "cpu": [address]})
            ops.append({"op": "swap_in", "req": victim.rid, "blocks": [fresh], "indices": [0]})
            victim.blocks[0] = fresh
            self.drop(block)


def header(cfg: StepSynthConfig) -> Header:
    return Header("synth", cfg.block_size, 256, 0, cfg.num_gpu_blocks, (0,))


def steps(cfg: StepSynthConfig) -> Iterator[dict[str, Any]]:
    """The log's steps, one dict each (the header is ``header(cfg)``)."""
    engine = _Engine(cfg)
    for n in range(cfg.steps):
        yield engine.step(n)


def write(cfg: StepSynthConfig, path: str | os.PathLike[str]) -> pa.Table | int:
    """Write the log as JSON Lines (.jsonl) or as its event table (.parquet, .arrow), a
    .gz or .zst after that compressing it: the number of steps written, or the event table."""
    p = Path(path)
    if Path(compression.strip(p)[0]).suffix.lower() in (".jsonl", ".json", ".ndjson"):
        # whole or not at all: a fault that cannot be planted leaves no partial log
        with compression.output(p) as f:
            f.write((header(cfg).to_json() + "\n").encode())
            for s in steps(cfg):
                f.write((json.dumps(s, separators=(",", ":")) + "\n").encode())
        return cfg.steps
    events_format(p)  # a name no table is written as: refused before the work
    builder = Builder(header(cfg))
    for s in steps(cfg):
        builder.step(s)
    table = builder.table()
    write_events(table, p)
    return table
