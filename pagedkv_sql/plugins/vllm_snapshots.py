"""The vLLM plugin's capture snapshots (``PAGEDKV_SNAPSHOT_EVERY=N``), taken without
holding the engine's step for the pool's size.

At the end of every N-th step line the step copies what ``engines.vllm.capture`` reads and
what changes later (three per-block fields of the pool, read by C-level ``map``s, the free
queue's head, each live request's blocks and counts); the recorder's writer thread rebuilds
a still image of the manager from the copy, runs ``capture`` on it (the same code as on the
live manager) and saves ``LOG.step<S>.npz`` beside the log, never replacing a file or
following a link (it is written under a hidden name, then hard-linked to its own). Only the
last ``keep`` snapshot files are kept (0: all). A snapshot that cannot be taken or written
is said once and ends the snapshots, not the log; one whose copy does not fit the
recorder's buffer (``PAGEDKV_STEP_LOG_BUFFER``, with the lines waiting) is skipped (said
once). Imports nothing heavy until a snapshot is due.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

log = logging.getLogger("pagedkv_sql.plugins.vllm")
_REF_CNT, _NEXT = attrgetter("ref_cnt"), attrgetter("next_free_block")
# vLLM's KVCacheBlock.block_hash is a property over the slot _block_hash: the slot, read
# directly, costs half (a property call a block); any other block class, its property
_HASH, _HASH_SLOT = attrgetter("block_hash"), attrgetter("_block_hash")


@dataclass
class Copied:
    """What a capture reads of a live manager, copied at a step's end."""

    ref_cnt: list[int]
    hashes: list[Any]  # immutable hash objects (bytes), shared, not copied
    nexts: list[Any]  # each block's next in the free queue: a block (ids never change)
    head_next: Any
    tail: Any
    num_free: int
    null_block: int
    hash_block_size: Any
    # per KV-cache group: its block size and each request's (block id, hash tokens) held
    groups: list[tuple[int, dict[Any, list[tuple[int, Any]]]]]
    requests: dict[Any, tuple[Any, int, list[Any]]]  # id -> (request_id, computed, hashes)
    # what capture reads of the groups: each manager's spec, the manager's kv_cache_config,
    # the coordinator's class name (never changed after the engine starts: not copied)
    specs: list[Any] = field(default_factory=list)
    config: Any = None
    coordinator: str = ""


def copy_state(kv_cache_manager: Any, requests: dict[Any, Any]) -> Copied:
    """The copy, in the engine's thread: O(pool) in C-level attribute reads, the free
    queue's order left to its links (read later, in the writer thread)."""
    pool = kv_cache_manager.block_pool
    blocks = pool.blocks
    queue = pool.free_block_queue
    slots = getattr(type(blocks[0]), "__slots__", ()) if blocks else ()
    hash_of = _HASH_SLOT if "_block_hash" in slots else _HASH
    groups = [
        (
            int(m.block_size),
            {
                rid: [(b.block_id, getattr(b, "block_hash_num_tokens", None)) for b in held]
                for rid, held in m.req_to_blocks.items()
            },
        )
        for m in kv_cache_manager.coordinator.single_type_managers
    ]
    return Copied(
        ref_cnt=list(map(_REF_CNT, blocks)),
        hashes=list(map(hash_of, blocks)),
        nexts=list(map(_NEXT, blocks)),
        head_next=queue.fake_free_list_head.next_free_block,
        tail=queue.fake_free_list_tail,
        num_free=int(queue.num_free_blocks),
        null_block=int(pool.null_block.block_id),
        hash_block_size=getattr(pool, "hash_block_size", None),
        groups=groups,
        requests={
            rid: (r.request_id, int(r.num_computed_tokens), list(getattr(r, "block_hashes", ())))
            for rid, r in requests.items()
        },
        specs=[
            getattr(m, "kv_cache_spec", None)
            for m in kv_cache_manager.coordinator.single_type_managers
        ],
        config=getattr(kv_cache_manager, "kv_cache_config", None),
        coordinator=type(kv_cache_manager.coordinator).__name__,
    )


class Still:
    """A block of the still image: the fields ``capture`` reads."""

    __slots__ = ("block_hash", "block_hash_num_tokens", "block_id", "next_free_block", "ref_cnt")

    def __init__(self, block_id: int, ref_cnt: int = 0, block_hash: Any = None) -> None:
        self.block_id, self.ref_cnt, self.block_hash = block_id, ref_cnt, block_hash
        self.block_hash_num_tokens: Any = None
        self.next_free_block: Still | None = None


def still_image(c: Copied) -> tuple[Any, dict[Any, Any]]:
    """A manager and requests standing still as copied, for ``capture``."""
    blocks = [Still(i, r, h) for i, (r, h) in enumerate(zip(c.ref_cnt, c.hashes, strict=True))]
    head, tail = Still(-1), Still(-1)

    def still(block: Any) -> Still | None:
        if block is None:
            return None
        return tail if block is c.tail else blocks[int(block.block_id)]

    for b, following in zip(blocks, c.nexts, strict=True):
        b.next_free_block = still(following)
    head.next_free_block = still(c.head_next)
    managers = []
    specs = c.specs or [None] * len(c.groups)
    for (block_size, held), spec in zip(c.groups, specs, strict=True):
        tables = {}
        for rid, ids in held.items():
            tables[rid] = [blocks[int(i)] for i, _ in ids]
            for i, tokens in ids:
                blocks[int(i)].block_hash_num_tokens = tokens
        manager = SimpleNamespace(block_size=block_size, req_to_blocks=tables, kv_cache_spec=spec)
        managers.append(manager)
    queue = SimpleNamespace(
        num_free_blocks=c.num_free, fake_free_list_head=head, fake_free_list_tail=tail
    )
    pool = SimpleNamespace(blocks=blocks, null_block=blocks[c.null_block], free_block_queue=queue)
    if c.hash_block_size is not None:
        pool.hash_block_size = c.hash_block_size
    coordinator = type(c.coordinator or "Coordinator", (), {})()  # capture names its class
    coordinator.single_type_managers = managers
    manager = SimpleNamespace(block_pool=pool, coordinator=coordinator, kv_cache_config=c.config)
    requests = {
        rid: SimpleNamespace(request_id=r, num_computed_tokens=n, block_hashes=h)
        for rid, (r, n, h) in c.requests.items()
    }
    return manager, requests


def save_new(snapshot: Any, target: Path) -> None:
    """Save ``snapshot`` at ``target``, which must not exist: written whole under a hidden
    name beside it, then hard-linked (a link never replaces a name, nor follows one)."""
    part = target.with_name(f".{target.stem}.{secrets.token_hex(6)}.part{target.suffix}")
    snapshot.save(part)
    try:
        os.link(part, target, follow_symlinks=False)
    except FileExistsError:
        raise FileExistsError(
            f"{target} exists (a snapshot never replaces a file or follows a link)"
        ) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)


class Snapshots:
    """A recorder's snapshots every ``every`` step lines, the last ``keep`` kept."""

    def __init__(self, recorder: Any, scheduler: Any, every: int, keep: int) -> None:
        self.recorder, self.scheduler, self.every, self.keep = recorder, scheduler, every, keep
        self.failed = False
        self.skipped = 0
        self.kept: deque[Path] = deque()

    def attach(self) -> None:
        """After each ``every``-th written step, take a snapshot."""
        recorder = self.recorder
        step = type(recorder).step

        def step_and_snapshot() -> int:
            before = recorder.step_no
            after = int(step(recorder))
            if after != before and after % self.every == 0:
                self.take(after - 1)
            return after

        recorder.step = step_and_snapshot

    def take(self, step: int) -> None:
        """Copy the manager now (the engine's thread); build and save it in the writer's."""
        recorder = self.recorder
        if self.failed or recorder.failed is not None or recorder.writer is None:
            return
        try:
            copied = copy_state(self.scheduler.kv_cache_manager, self.scheduler.requests)
        except Exception as e:
            self._stop(e)
            return
        target = recorder.path.with_name(f"{recorder.path.name}.step{step}.npz")
        size = 24 * len(copied.ref_cnt) + 64 * sum(len(h) for _, h in copied.groups)
        if not recorder.writer.put_job(lambda: self.save(copied, target), size):
            self.skipped += 1
            if self.skipped == 1 and recorder.writer.error is None:
                log.warning(
                    "pagedkv-sql: the snapshot at step %d was skipped: the recorder's buffer "
                    "is full (snapshots and lines are due faster than they are saved; "
                    "skipped ones are not said again)",
                    step,
                )

    def save(self, copied: Copied, target: Path) -> None:
        """The writer thread's part: capture the still image, save it, keep the last ones."""
        if self.failed:
            return
        from ..engines import vllm

        try:
            manager, requests = still_image(copied)
            save_new(vllm.capture(manager, requests), target)
        except Exception as e:
            self._stop(e)
            return
        self.kept.append(target)
        while self.keep and len(self.kept) > self.keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.kept.popleft())

    def _stop(self, error: Exception) -> None:
        self.failed = True
        log.error("pagedkv-sql: no more snapshots (the step log goes on): %s", error)
