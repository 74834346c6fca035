"""Hand-built fleet directories (docs/fleet.md, "Layout") for the fleet tests: a tiny
scripted scenario told once, written as each replica's truth (a step log of `cache` and
`evict` ops), its KV events (one KVEventBatch a step), each router's index dumps (a set of
the events it applied, as Dynamo's dump_tree_as_events elements), decisions and outcomes.
Faults are told as what each side saw: a batch the router never applied, a line removed
from an events file, a restart the events never tell, a clear the router ignored."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STEP = 0.01
BLOCK = 16


def hex16(h: int) -> str:
    return f"{h & ((1 << 64) - 1):016x}"


@dataclass
class Replica:
    name: str
    worker_id: int
    dp_rank: int = 0
    blocks: dict[int, int] = field(default_factory=dict)  # block id -> hash (the truth)
    groups: dict[int, int] = field(default_factory=dict)  # block id -> its KV-cache group
    next_block: int = 1
    steps: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    batches: dict[int, list[list[Any]]] = field(default_factory=dict)
    dropped_lines: set[int] = field(default_factory=set)  # seqs removed from the file


@dataclass
class Router:
    name: str
    kind: str = "dynamo_radix_tree"
    routed: bool = True
    index: set[tuple[str, int]] = field(default_factory=set)
    dumps: list[tuple[float, list[tuple[str, int]]]] = field(default_factory=list)
    skip: set[tuple[str, int]] = field(default_factory=set)  # (replica, step) not applied
    tree: bool = False  # as Dynamo's RadixTree: a store onto an unknown parent refused
    ignore_clear: bool = False
    groups: tuple[int, ...] | None = None  # the groups whose events it indexes (None: all)


def _as_object(event: list[Any]) -> dict[str, Any]:
    """An array-form event in vLLM's JSON object form (msgspec's, tagged by "type")."""
    if event[0] == "BlockStored":
        return {
            "type": "BlockStored",
            "block_hashes": event[1],
            "parent_block_hash": event[2],
            "token_ids": event[3],
            "block_size": event[4],
            "lora_id": None,
            "medium": event[6],
            "group_idx": event[9],
        }
    if event[0] == "BlockRemoved":
        return {
            "type": "BlockRemoved",
            "block_hashes": event[1],
            "medium": event[2],
            "group_idx": event[3],
        }
    return {"type": event[0]}


class Fleet:
    """A scripted fleet: every replica and router, step by step."""

    def __init__(self, replicas: int = 2, routers: tuple[Router, ...] | None = None) -> None:
        self.replicas = {f"r{i}": Replica(f"r{i}", i) for i in range(replicas)}
        self.routers = {r.name: r for r in (routers or (Router("dynamo"),))}
        self.decisions: list[dict[str, Any]] = []
        self.outcomes: list[dict[str, Any]] = []
        self.last_step = 0
        self.objects = False  # events written in vLLM's JSON object form, not arrays
        self.groups = [{"group": 0, "kind": "full_attention", "block_size": BLOCK}]
        self.merge_ranks = False  # every rank's blocks indexed as rank 0 of its worker
        self.index_every = 1  # the routers' index dumped only at steps n % index_every == 0

    def _op(self, r: Replica, step: int, op: dict[str, Any]) -> None:
        r.steps.setdefault(step, []).append(op)
        self.last_step = max(self.last_step, step)

    def _event(self, r: Replica, step: int, event: list[Any]) -> None:
        r.batches.setdefault(step, []).append(event)
        self.last_step = max(self.last_step, step)

    def store(
        self, step: int, replica: str, *hashes: int, parent: int | None = None, group: int = 0
    ) -> None:
        """The replica caches new blocks of KV-cache ``group`` under these hashes and
        publishes BlockStored (a group other than 0: its blocks allocated to it first)."""
        r = self.replicas[replica]
        blocks = list(range(r.next_block, r.next_block + len(hashes)))
        r.next_block += len(hashes)
        r.blocks.update(zip(blocks, hashes, strict=True))
        r.groups.update(dict.fromkeys(blocks, group))
        if group:
            self._op(r, step, {"op": "allocate", "req": "q", "group": group, "blocks": blocks})
        self._op(r, step, {"op": "cache", "blocks": blocks, "hashes": [hex16(h) for h in hashes]})
        event = ["BlockStored", list(hashes), parent, [], BLOCK, None, "GPU", None, None, group]
        self._event(r, step, event)

    def evict(
        self, step: int, replica: str, h: int, *, publish: bool = True, group: int = 0
    ) -> None:
        """One physical copy of ``h`` in ``group`` evicted (its oldest block); BlockRemoved
        published."""
        r = self.replicas[replica]
        block = min(b for b, v in r.blocks.items() if v == h and r.groups.get(b, 0) == group)
        del r.blocks[block]
        self._op(r, step, {"op": "evict", "blocks": [block]})
        if publish:
            self._event(r, step, ["BlockRemoved", [h], "GPU", group])

    def restart(self, step: int, replica: str, *, clear: bool) -> None:
        """The replica's cache emptied; AllBlocksCleared published only with ``clear``."""
        r = self.replicas[replica]
        if r.blocks:
            self._op(r, step, {"op": "evict", "blocks": sorted(r.blocks)})
        r.blocks.clear()
        if clear:
            self._event(r, step, ["AllBlocksCleared"])

    def decide(
        self,
        step: int,
        request: str,
        chosen: str,
        hashes: list[int],
        *,
        router: str = "dynamo",
        reason: str = "prefix",
        predicted: dict[str, int] | None = None,
        cached_blocks: int | None = None,
    ) -> None:
        """A decision at ``step`` and, when ``cached_blocks`` is given, its outcome."""
        tokens = len(hashes) * BLOCK + 1
        self.decisions.append(
            {
                "request": request,
                "router": router,
                "t": step * STEP,
                "chosen": chosen,
                "reason": reason,
                "routed": self.routers[router].routed,
                "prompt_tokens": tokens,
                "predicted": predicted or {},
                "hashes": hashes,
            }
        )
        if cached_blocks is not None:
            self.outcomes.append(
                {
                    "request": request,
                    "replica": chosen,
                    "t": step * STEP,
                    "prompt_tokens": tokens,
                    "cached_tokens": cached_blocks * BLOCK,
                }
            )
        self.last_step = max(self.last_step, step)

    def _route(self) -> None:
        """Each router applies the batches it receives, as a set, dumped when it changes."""
        for router in self.routers.values():
            dumped: set[tuple[str, int]] | None = None
            for step in range(self.last_step + 1):
                for r in self.replicas.values():
                    if (r.name, step) in router.skip:
                        continue
                    for e in r.batches.get(step, []):
                        group = e[9] if e[0] == "BlockStored" else e[3] if len(e) > 3 else 0
                        if router.groups is not None and group not in router.groups:
                            continue
                        if e[0] == "BlockStored":
                            if (
                                router.tree
                                and e[2] is not None
                                and (r.name, e[2]) not in router.index
                            ):
                                continue
                            router.index |= {(r.name, h) for h in e[1]}
                        elif e[0] == "BlockRemoved":
                            router.index -= {(r.name, h) for h in e[1]}
                        elif not router.ignore_clear:
                            router.index = {x for x in router.index if x[0] != r.name}
                due = step % self.index_every == 0 and router.index != dumped
                if due or step == self.last_step:
                    dumped = set(router.index)
                    router.dumps.append((step * STEP, sorted(router.index)))

    def write(self, directory: Path) -> Path:
        self._route()
        directory.mkdir(parents=True, exist_ok=True)
        meta = {
            "pagedkv_fleet": 1,
            "step_seconds": STEP,
            "block_size": BLOCK,
            "hash": "vllm_last8",
            "replicas": [
                {
                    "name": r.name,
                    "worker_id": r.worker_id,
                    "dp_rank": r.dp_rank,
                    "num_gpu_blocks": 64,
                }
                for r in self.replicas.values()
            ],
            "routers": [
                {"name": r.name, "kind": r.kind, "routed": r.routed} for r in self.routers.values()
            ],
            "kind": "full",
            "groups": self.groups,
            "seed": 0,
            "requests": len(self.decisions),
            "trace": "generated",
            "plant": None,
            "index_every": self.index_every,
        }
        (directory / "fleet.json").write_text(json.dumps(meta))
        for r in self.replicas.values():
            sub = directory / f"replica={r.name}"
            sub.mkdir(exist_ok=True)
            header = {
                "pagedkv_step_log": 2,
                "block_size": BLOCK,
                "num_gpu_blocks": 64,
                "reserved_blocks": [0],
            }
            lines = [json.dumps(header)]
            lines += [json.dumps({"step": s, "ops": ops}) for s, ops in sorted(r.steps.items())]
            (sub / "steps.jsonl").write_text("\n".join(lines) + "\n")
            batches = []
            for seq, (step, events) in enumerate(sorted(r.batches.items())):
                if self.objects:
                    events = [_as_object(e) for e in events]
                if seq not in r.dropped_lines:
                    batches.append(
                        json.dumps(
                            {
                                "seq": seq,
                                "ts": step * STEP,
                                "data_parallel_rank": r.dp_rank,
                                "events": events,
                            }
                        )
                    )
            (sub / "events.jsonl").write_text("".join(b + "\n" for b in batches))
        for router in self.routers.values():
            sub = directory / f"router={router.name}"
            sub.mkdir(exist_ok=True)
            workers = {r.name: r.worker_id for r in self.replicas.values()}
            ranks = {r.name: 0 if self.merge_ranks else r.dp_rank for r in self.replicas.values()}
            with (sub / "index.jsonl").open("w") as f:
                for t, held in router.dumps:
                    dump = [
                        {
                            "worker_id": workers[rep],
                            "storage_tier": "device",
                            "event": {
                                "dp_rank": ranks[rep],
                                "event_id": 0,
                                "data": {
                                    "stored": {
                                        "parent_hash": None,
                                        "start_position": None,
                                        "blocks": [
                                            {
                                                "block_hash": h,
                                                "tokens_hash": h,
                                                "mm_extra_info": None,
                                            }
                                        ],
                                    }
                                },
                            },
                        }
                        for rep, h in held
                    ]
                    f.write(json.dumps({"t": t, "dump": dump}) + "\n")
        for name, rows in (("decisions.jsonl", self.decisions), ("outcomes.jsonl", self.outcomes)):
            (directory / name).write_text("".join(json.dumps(x) + "\n" for x in rows))
        return directory


def clean() -> Fleet:
    """Two replicas, one router: a prefix stored, a request routed to it, a block evicted;
    the router and the events agree with the truth at every step."""
    fleet = Fleet()
    fleet.store(1, "r0", 11, 12, 13)
    fleet.store(2, "r1", 21)
    fleet.decide(3, "q1", "r0", [11, 12, 13], predicted={"r0": 3, "r1": 0}, cached_blocks=3)
    fleet.evict(5, "r0", 13)
    fleet.store(6, "r1", (1 << 64) - 5)  # a hash past 2^63: folded to a negative BIGINT
    fleet.evict(8, "r1", 21)
    fleet.store(9, "r0", 14)
    return fleet


def router_lost_removal() -> Fleet:
    """The router never applies r0's batch at step 5 (13's removal): its index claims 13
    to the end (false residency, a sequence gap, fault router)."""
    fleet = clean()
    fleet.routers["dynamo"].skip.add(("r0", 5))
    return fleet


def duplicate_copy() -> Fleet:
    """r1 caches hash 21 twice (two blocks) and evicts the older copy: vLLM publishes
    BlockRemoved while the other copy stays (missed residency, fault engine)."""
    fleet = clean()
    fleet.store(3, "r1", 21)
    fleet.evict(4, "r1", 21)
    return fleet


def over_predicted() -> Fleet:
    """The router predicts 3 blocks of q2 on r0, where r0 hit 1 (13 evicted at step 5,
    unseen by the router: its batch lost)."""
    fleet = router_lost_removal()
    fleet.decide(7, "q2", "r0", [11, 12, 13, 15], predicted={"r0": 3, "r1": 0}, cached_blocks=2)
    return fleet


def misrouted() -> Fleet:
    """q2's prefix 11, 12 is held on r0; the router sends it to r1 by prefix."""
    fleet = clean()
    fleet.decide(4, "q2", "r1", [11, 12], predicted={"r0": 2, "r1": 0}, cached_blocks=0)
    return fleet
