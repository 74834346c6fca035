"""The routers a fleet simulation feeds (docs/fleet.md, "Routers"): NVIDIA Dynamo's real
``RadixTree`` (the ``fleet`` extra: ``ai-dynamo-runtime``), fed the replicas' KV events,
and a built-in approximate router that remembers the prefixes it routed per replica (LRU,
a replica's pool in blocks, no eviction signal). Both answer a request's predicted prefix
per replica in blocks and dump their index in the shape of Dynamo's
``dump_tree_as_events()``."""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError

DYNAMO_FIX = "pip install 'pagedkv-sql[fleet]' (ai-dynamo-runtime==1.6.1), or --router approx"


@dataclass
class Event:
    """A replica's KV event as a router reads it: ``stored`` (hashes, their parent, Dynamo's
    token hash of each block), ``removed`` (hashes) or ``cleared``; ``group``: the KV-cache
    group it came from (None: cleared)."""

    kind: str
    hashes: list[int] = field(default_factory=list)
    parent: int | None = None
    tokens_hashes: list[int] = field(default_factory=list)
    group: int | None = None


def dynamo() -> Any:
    """Dynamo's Python module (``dynamo.llm``); a UsageError with the fix without it."""
    os.environ.setdefault("DYN_LOG", "error")  # its index logs every dropped store
    try:
        from dynamo import llm  # type: ignore[import-not-found]
    except ImportError:
        raise UsageError("the Dynamo router needs ai-dynamo-runtime", hint=DYNAMO_FIX) from None
    return llm


def tokens_hashes(tokens: Sequence[int], block_size: int) -> list[int]:
    """Dynamo's hash of each full block of ``tokens`` (its ``compute_block_hash_for_seq``:
    a block's own tokens, not chained); without Dynamo a stand-in, the 64-bit blake2b of
    the block's token ids (4 bytes each, little-endian)."""
    if len(tokens) < block_size:
        return []
    try:
        compute = dynamo().compute_block_hash_for_seq
    except UsageError:
        whole = len(tokens) // block_size * block_size
        return [
            int.from_bytes(
                hashlib.blake2b(
                    b"".join(t.to_bytes(4, "little") for t in tokens[i : i + block_size]),
                    digest_size=8,
                ).digest(),
                "little",
            )
            for i in range(0, whole, block_size)
        ]
    return [int(h) for h in compute(list(tokens), block_size)]


Slot = tuple[int, int]  # where a router places a block: (worker id, data-parallel rank)


def element(slot: Slot, event_id: int, blocks: list[tuple[int, int]], parent: int | None) -> Any:
    """One stored event of a dump, as Dynamo 1.6.1's ``dump_tree_as_events`` writes it."""
    return {
        "worker_id": slot[0],
        "storage_tier": "device",
        "residency_domain": "worker",
        "event": {
            "dp_rank": slot[1],
            "event_id": event_id,
            "data": {
                "stored": {
                    "parent_hash": parent,
                    "start_position": None,
                    "blocks": [
                        {"block_hash": h, "tokens_hash": t, "mm_extra_info": None}
                        for h, t in blocks
                    ],
                }
            },
        },
    }


class DynamoRouter:
    """Dynamo's ``RadixTree`` fed the replicas' events; an event the tree refuses (a store
    whose parent it never saw, a removal of a block it does not hold: it raises) is
    dropped, as Dynamo's indexer drops it, and counted in ``refused``."""

    kind = "dynamo_radix_tree"

    def __init__(self, name: str = "dynamo") -> None:
        self.name = name
        self.tree = dynamo().RadixTree()
        self.event_ids: dict[Slot, int] = {}
        self.refused = 0  # events the tree refused (it raised)
        self.changed = False

    def _apply(self, slot: Slot, data: Any) -> None:
        n = self.event_ids.get(slot, 0)
        self.event_ids[slot] = n + 1
        payload = json.dumps({"event_id": n, "data": data, "dp_rank": slot[1]}).encode()
        try:
            self.tree.apply_event(slot[0], payload)
        except RuntimeError:  # Dynamo's own behaviour: the event is dropped
            self.refused += 1
        self.changed = True

    def feed(self, slot: Slot, events: list[Event]) -> None:
        for e in events:
            if e.kind == "stored":
                blocks = [
                    {"block_hash": h, "tokens_hash": t}
                    for h, t in zip(e.hashes, e.tokens_hashes, strict=True)
                ]
                self._apply(slot, {"stored": {"parent_hash": e.parent, "blocks": blocks}})
            elif e.kind == "removed":
                self._apply(slot, {"removed": {"block_hashes": e.hashes}})
            else:
                self._apply(slot, "cleared")

    def scores(self, tokens_hashes: list[int], block_hashes: list[int]) -> dict[Slot, int]:
        if not tokens_hashes:
            return {}
        found = self.tree.find_matches(tokens_hashes).scores
        return {(int(w), int(r)): int(n) for (w, r), n in found.items()}

    def routed(self, slot: Slot, tokens_hashes: list[int], block_hashes: list[int]) -> None:
        """Dynamo learns residency from events only."""

    def dump(self) -> list[Any]:
        self.changed = False
        return [json.loads(e) for e in self.tree.dump_tree_as_events()]


class ApproxRouter:
    """The prefixes it routed, per replica, LRU of ``capacity`` blocks; no event reaches it
    (an approximate router: smg's ``cache_aware``, the vLLM router). It keys blocks by the
    engine's hash of the request's blocks (a router that hashes as the engine does)."""

    kind = "approx_lru"

    def __init__(self, capacity: int, name: str = "approx") -> None:
        self.name = name
        self.capacity = capacity
        self.lru: dict[Slot, OrderedDict[int, tuple[int | None, int]]] = {}
        self.changed = False

    def feed(self, slot: Slot, events: list[Event]) -> None:
        """No eviction signal: events are not read."""

    def scores(self, tokens_hashes: list[int], block_hashes: list[int]) -> dict[Slot, int]:
        out = {}
        for slot, lru in self.lru.items():
            n = 0
            for h in block_hashes:
                if h not in lru:
                    break
                n += 1
            if n:
                out[slot] = n
        return out

    def routed(self, slot: Slot, tokens_hashes: list[int], block_hashes: list[int]) -> None:
        lru = self.lru.setdefault(slot, OrderedDict())
        parent: int | None = None
        for h, t in zip(block_hashes, tokens_hashes, strict=False):
            lru[h] = (parent, t)
            lru.move_to_end(h)
            parent = h
        while len(lru) > self.capacity:
            lru.popitem(last=False)
        self.changed = self.changed or bool(block_hashes)

    def dump(self) -> list[Any]:
        self.changed = False
        out = []
        for slot in sorted(self.lru):
            for n, (h, (parent, t)) in enumerate(self.lru[slot].items()):
                out.append(element(slot, n, [(h, t)], parent))
        return out


Router = DynamoRouter | ApproxRouter
