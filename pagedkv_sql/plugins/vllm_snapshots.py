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
import threading
from collections import deque
from collections.abc import Callable
from operator import attrgetter
from pathlib import Path
from typing import Any

from .vllm_snapshot_writer import Changes, Child, Copied, Step

log = logging.getLogger("pagedkv_sql.plugins.vllm")
_REF_CNT, _NEXT = attrgetter("ref_cnt"), attrgetter("next_free_block")
# vLLM's KVCacheBlock.block_hash is a property over the slot _block_hash: the slot, read
# directly, costs half (a property call a block); any other block class, its property
_HASH, _HASH_SLOT = attrgetter("block_hash"), attrgetter("_block_hash")


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
        head_next=_id(queue.fake_free_list_head.next_free_block),
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
        # the whole pool, until a snapshot carries it (read once, here)
        self.base: Changes | None = self.fields(blocks, list(range(len(blocks))))

    def fields(self, blocks: list[Any], ids: list[int]) -> Changes:
        """The fields now of ``blocks`` (ids ``ids``), each next in the free queue its id."""
        nexts = [None if n is None else n.block_id for n in map(_NEXT, blocks)]
        tokens = [getattr(b, "block_hash_num_tokens", None) for b in blocks]
        refs, hashes = list(map(_REF_CNT, blocks)), list(map(self.hash_of, blocks))
        return Changes(ids, refs, hashes, nexts, tokens)

    def changes(self) -> Changes:
        """The fields now of the blocks written since (the engine's thread: O(written)),
        the whole pool's with them until a snapshot took them."""
        ids = list(self.dirty)
        self.dirty.clear()
        blocks = self.blocks
        changes = self.fields([blocks[i] for i in ids], ids)
        changes.base = self.base
        return changes

    def handed(self, changes: Changes, taken: bool) -> None:
        """The writer took ``changes`` (the base with them), or not: then they are the
        next snapshot's too."""
        if taken:
            self.base = None
        else:
            self.dirty.update(changes.ids)  # (the base, if any, stays)


def copy_step(kv_cache_manager: Any, requests: dict[Any, Any]) -> Step:
    """The engine's thread: O(requests + blocks they hold), each list copied whole (C)."""
    pool = kv_cache_manager.block_pool
    queue = pool.free_block_queue
    managers = kv_cache_manager.coordinator.single_type_managers
    return Step(
        head_next=_id(queue.fake_free_list_head.next_free_block),
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


def _id(block: Any) -> int | None:
    return None if block is None else int(block.block_id)


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

    def __init__(self, scheduler: Any, path: Path, every: int, keep: int, buffer: int) -> None:
        self.scheduler, self.path, self.every, self.keep = scheduler, path, every, keep
        self.jobs = Jobs(f"pagedkv-sql {path.name} snapshots", buffer)
        self.failed = False
        self.skipped = 0
        # snapshots handed to the writer and done with (each counter one thread's)
        self.handed = self.done = 0
        self.kept: deque[Path] = deque()
        self.tracker: Tracker | None = None
        self.child = Child()  # the writer process

    def close(self, timeout: float = 30.0) -> None:
        """Save the snapshots handed over (``timeout`` seconds at most), then end the
        writer thread and process."""
        self.jobs.close(timeout)
        self.child.close()

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
            self.child.start()  # its imports run while the engine starts serving
        except Exception as e:
            self._stop(e)

    def take(self, step: int) -> None:
        """Hand what changed over (the engine's thread); build and save in the writer's."""
        tracker = self.tracker
        if self.failed or tracker is None:
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
        size = 40 * len(changes.ids) + 16 * held
        size += 0 if changes.base is None else 40 * len(changes.base.ids)
        taken = self.jobs.put_job(lambda: self.save(changes, now, target), size)
        tracker.handed(changes, taken)
        if taken:
            self.handed += 1
        else:
            self._skipped(step)

    def _skipped(self, step: int) -> None:
        self.skipped += 1
        if self.skipped == 1:
            log.warning(
                "pagedkv-sql: the snapshot at step %d was skipped: the one before is still "
                "being saved (snapshots are due faster than they are saved; what changed is "
                "carried to the next; skipped ones are not said again)",
                step,
            )

    def save(self, changes: Changes, step: Step, target: Path) -> None:
        """The writer thread's part: the tables' blocks as ids, handed to the writer
        process (which builds and saves the snapshot, off this interpreter's lock), the
        last ones kept."""
        try:
            if self.failed:
                return
            step.groups = [
                (size, {rid: [b.block_id for b in held] for rid, held in tables.items()})
                for size, tables in step.groups
            ]
            failed = self.child.save(changes, step, target)
            if failed is not None:
                self._stop(RuntimeError(failed))
                return
        except Exception as e:
            self._stop(e)
            return
        finally:
            self.done += 1
        self.kept.append(target)
        while self.keep and len(self.kept) > self.keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.kept.popleft())

    def _stop(self, error: BaseException) -> None:
        self.failed = True
        log.error("pagedkv-sql: no more snapshots (the engine and its step log go on): %s", error)
