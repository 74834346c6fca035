"""The vLLM plugin's capture snapshots (``PAGEDKV_SNAPSHOT_EVERY=N``), taken without
holding the engine's step for the pool's size.

A ``Tracker`` notes each block of the pool written since the last snapshot (the pool's
blocks get a subclass of their class whose ``__setattr__`` notes the block's id: every
write to a ref count, hash or free-queue link, whoever makes it). At the end of every N-th
step the step hands over only those blocks' fields, each live request's block list (the
list copied, not read) and counts: O(what changed). The writer thread keeps a ``Mirror`` of
the pool's fields (the whole pool copied once, when the tracker starts), brings it up to
date, rebuilds a still image of the manager from it, runs ``capture`` on it (the same code
as on the live manager) and saves ``LOG.step<S>.npz`` beside the log, never replacing a
file or following a link (it is written under a hidden name, then hard-linked to its
own). Only the last ``keep`` snapshot files are kept (0: all). A snapshot that cannot be
taken or written is said once and ends the snapshots, not the log; one that does not fit
the writer's buffer (``PAGEDKV_STEP_LOG_BUFFER``, with the lines waiting) is skipped (said
once), its changes carried to the next. Without a step log (an engine whose log the
recorder refuses: a Mamba group), the snapshots have a writer thread of their own
(``Jobs``) and are taken when each step starts (``new_step_starts``: the state the step
before left). Imports nothing heavy until a snapshot is due.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import secrets
import threading
from collections import deque
from collections.abc import Callable
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
    hash_of = hash_reader(blocks)
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


def hash_reader(blocks: list[Any]) -> Any:
    """How to read a block's hash: its slot where the class (or a base) has one."""
    mro = type(blocks[0]).__mro__ if blocks else ()
    slotted = any("_block_hash" in getattr(c, "__slots__", ()) for c in mro)
    return _HASH_SLOT if slotted else _HASH


@dataclass
class Changes:
    """The blocks written since the last snapshot handed over, with their fields now;
    ``base``: the whole pool's fields (the first snapshot's, when the mirror starts)."""

    ids: list[int]
    ref_cnt: list[int]
    hashes: list[Any]
    nexts: list[Any]
    tokens: list[Any]
    base: tuple[Copied, list[Any]] | None = None  # with every block's hash tokens


class Tracker:
    """Notes the blocks of a pool written since the last ``changes()``: each block's class
    becomes a subclass (same slots) whose ``__setattr__`` notes its id first."""

    def __init__(self, kv_cache_manager: Any) -> None:
        self.manager = kv_cache_manager
        blocks = kv_cache_manager.block_pool.blocks
        self.blocks = blocks
        self.dirty: set[int] = set()
        self.hash_of = hash_reader(blocks)
        note, subclasses = self.dirty.add, {}
        for b in blocks:
            cls = type(b)
            sub = subclasses.get(cls)
            if sub is None:
                write = cls.__setattr__

                def __setattr__(block: Any, name: str, value: Any, write: Any = write) -> None:
                    note(block.block_id)
                    write(block, name, value)

                sub = type(cls.__name__, (cls,), {"__slots__": (), "__setattr__": __setattr__})
                subclasses[cls] = sub
            b.__class__ = sub
        # the whole pool, until a snapshot carries it (copied once, here)
        self.base: tuple[Copied, list[Any]] | None = (
            copy_state(kv_cache_manager, {}),
            [getattr(b, "block_hash_num_tokens", None) for b in blocks],
        )

    def changes(self) -> Changes:
        """The fields now of the blocks written since (the engine's thread: O(written))."""
        ids = list(self.dirty)
        self.dirty.clear()
        blocks, hash_of = self.blocks, self.hash_of
        held = [blocks[i] for i in ids]
        return Changes(
            ids,
            list(map(_REF_CNT, held)),
            list(map(hash_of, held)),
            list(map(_NEXT, held)),
            [getattr(b, "block_hash_num_tokens", None) for b in held],
            self.base,
        )

    def handed(self, changes: Changes, taken: bool) -> None:
        """The writer took ``changes`` (the base with them), or not: then they are the
        next snapshot's too."""
        if taken:
            self.base = None
        else:
            self.dirty.update(changes.ids)


class Mirror:
    """The writer thread's copy of the pool's per-block fields, brought up to date by each
    snapshot's changes."""

    def __init__(self) -> None:
        self.ref_cnt: list[int] = []
        self.hashes: list[Any] = []
        self.nexts: list[Any] = []
        self.tokens: list[Any] = []

    def apply(self, c: Changes) -> None:
        if c.base is not None:
            base, self.tokens = c.base
            self.ref_cnt, self.hashes, self.nexts = base.ref_cnt, base.hashes, base.nexts
        ref_cnt, hashes, nexts, tokens = self.ref_cnt, self.hashes, self.nexts, self.tokens
        for i, r, h, n, t in zip(c.ids, c.ref_cnt, c.hashes, c.nexts, c.tokens, strict=True):
            ref_cnt[i], hashes[i], nexts[i], tokens[i] = r, h, n, t

    def copied(self, step: Step) -> Copied:
        """The step's state as ``copy_state`` would have copied it then."""
        tokens = self.tokens
        groups = [
            (
                size,
                {
                    rid: [(b.block_id, tokens[b.block_id]) for b in held]
                    for rid, held in tables.items()
                },
            )
            for size, tables in step.groups
        ]
        return Copied(
            ref_cnt=self.ref_cnt,
            hashes=self.hashes,
            nexts=self.nexts,
            head_next=step.head_next,
            tail=step.tail,
            num_free=step.num_free,
            null_block=step.null_block,
            hash_block_size=step.hash_block_size,
            groups=groups,
            requests=step.requests,
            specs=step.specs,
            config=step.config,
            coordinator=step.coordinator,
        )


@dataclass
class Step:
    """What a snapshot copies of the step besides the blocks' fields: the free queue's
    head and count, each group's tables (each list copied: its blocks, not read), the
    requests' ids, counts and hashes."""

    head_next: Any
    tail: Any
    num_free: int
    null_block: int
    hash_block_size: Any
    groups: list[tuple[int, dict[Any, list[Any]]]]
    requests: dict[Any, tuple[Any, int, list[Any]]]
    specs: list[Any]
    config: Any
    coordinator: str


def copy_step(kv_cache_manager: Any, requests: dict[Any, Any]) -> Step:
    """The engine's thread: O(requests + blocks they hold), each list copied whole (C)."""
    pool = kv_cache_manager.block_pool
    queue = pool.free_block_queue
    managers = kv_cache_manager.coordinator.single_type_managers
    return Step(
        head_next=queue.fake_free_list_head.next_free_block,
        tail=queue.fake_free_list_tail,
        num_free=int(queue.num_free_blocks),
        null_block=int(pool.null_block.block_id),
        hash_block_size=getattr(pool, "hash_block_size", None),
        groups=[
            (int(m.block_size), {rid: held[:] for rid, held in m.req_to_blocks.items()})
            for m in managers
        ],
        requests={
            rid: (r.request_id, int(r.num_computed_tokens), list(getattr(r, "block_hashes", ())))
            for rid, r in requests.items()
        },
        specs=[getattr(m, "kv_cache_spec", None) for m in managers],
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


class Jobs:
    """A writer thread of the snapshots' own (no step log to share one with): jobs run in
    order, their data bounded by ``buffer_bytes`` (a job that does not fit is refused)."""

    def __init__(self, name: str, buffer_bytes: int) -> None:
        self.buffer_bytes = buffer_bytes
        self.error: BaseException | None = None
        self._queue: deque[tuple[Callable[[], None], int]] = deque()
        self._queued = 0
        self._closing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def put_job(self, job: Callable[[], None], size: int) -> bool:
        with self._cond:
            if self._closing or (self._queued and self._queued + size > self.buffer_bytes):
                return False
            self._queue.append((job, size))
            self._queued += size
            self._cond.notify_all()
            return True

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every job handed over has run (``timeout`` seconds at most)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._queued, timeout)

    def close(self, timeout: float | None = 10.0) -> None:
        """Run the jobs handed over, then end the thread (``timeout`` seconds at most)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        atexit.unregister(self.close)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closing)
                if not self._queue:
                    return
                job, size = self._queue[0]
            try:
                job()
            except Exception as e:  # a job reports its own errors; this is a bug of one
                log.error("pagedkv-sql: a snapshot job failed: %r", e)
            with self._cond:
                self._queue.popleft()
                self._queued -= size
                self._cond.notify_all()


class Snapshots:
    """Snapshots of a scheduler's manager every ``every`` steps beside ``path`` (the step
    log's), the last ``keep`` kept, saved by ``jobs`` (the recorder's writer, or
    ``Jobs``): each an O(what changed) hand-over in the engine's step (``Tracker``)."""

    def __init__(self, scheduler: Any, path: Path, every: int, keep: int, jobs: Any) -> None:
        self.scheduler, self.path, self.every, self.keep = scheduler, path, every, keep
        self.jobs = jobs
        self.failed = False
        self.skipped = 0
        # snapshots handed to the writer and done with (each counter one thread's)
        self.handed = self.done = 0
        self.kept: deque[Path] = deque()
        self.tracker: Tracker | None = None
        self.mirror = Mirror()  # the writer thread's

    def attach(self, recorder: Any) -> None:
        """After each ``every``-th step line ``recorder`` writes, take a snapshot."""
        step = type(recorder).step

        def step_and_snapshot() -> int:
            before = recorder.step_no
            after = int(step(recorder))
            if after != before and after % self.every == 0 and recorder.failed is None:
                self.take(after - 1)
            return after

        self.track()
        recorder.step = step_and_snapshot

    def attach_alone(self) -> None:
        """Without a step log: a snapshot of the state each ``every``-th step left, taken
        when the next step starts (``new_step_starts``, the first thing a vLLM scheduler's
        ``schedule()`` does), named by the step that left it (0 the first)."""
        manager = self.scheduler.kv_cache_manager
        starts = manager.new_step_starts
        steps = 0

        def new_step_starts(*args: Any, **kwargs: Any) -> Any:
            nonlocal steps
            if steps and steps % self.every == 0:
                self.take(steps - 1)
            steps += 1
            return starts(*args, **kwargs)

        self.track()
        manager.new_step_starts = new_step_starts

    def track(self) -> None:
        try:
            self.tracker = Tracker(self.scheduler.kv_cache_manager)
        except Exception as e:
            self._stop(e)

    def take(self, step: int) -> None:
        """Hand what changed over (the engine's thread); build and save in the writer's."""
        tracker = self.tracker
        if self.failed or tracker is None or getattr(self.jobs, "error", None) is not None:
            return
        if self.handed != self.done:  # the writer still builds the one before: skipped
            self._skipped(step)
            return
        try:
            changes = tracker.changes()
            now = copy_step(self.scheduler.kv_cache_manager, self.scheduler.requests)
        except Exception as e:
            self._stop(e)
            return
        target = self.path.with_name(f"{self.path.name}.step{step}.npz")
        held = sum(len(h) for _, tables in now.groups for h in tables.values())
        size = (
            40 * len(changes.ids)
            + 16 * held
            + (0 if changes.base is None else 40 * len(changes.base[1]))
        )
        taken = self.jobs.put_job(lambda: self.save(changes, now, target), size)
        tracker.handed(changes, taken)
        if taken:
            self.handed += 1
        else:
            self._skipped(step)

    def _skipped(self, step: int) -> None:
        self.skipped += 1
        if self.skipped == 1 and getattr(self.jobs, "error", None) is None:
            log.warning(
                "pagedkv-sql: the snapshot at step %d was skipped: the one before is still "
                "being saved, or the recorder's buffer is full (snapshots are due faster than "
                "they are saved; what changed is carried to the next; skipped ones are not "
                "said again)",
                step,
            )

    def save(self, changes: Changes, step: Step, target: Path) -> None:
        """The writer thread's part: the mirror brought up to date, the still image
        captured and saved, the last ones kept."""
        try:
            if self.failed:
                return
            from ..engines import vllm

            self.mirror.apply(changes)
            manager, requests = still_image(self.mirror.copied(step))
            save_new(vllm.capture(manager, requests), target)
        except Exception as e:
            self._stop(e)
            return
        finally:
            self.done += 1
        self.kept.append(target)
        while self.keep and len(self.kept) > self.keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.kept.popleft())

    def _stop(self, error: Exception) -> None:
        self.failed = True
        log.error("pagedkv-sql: no more snapshots (the engine and its step log go on): %s", error)
