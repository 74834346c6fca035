"""Record a live vLLM v1 KVCacheManager as a step log (docs/replay.md, "Recording a real
vLLM").

``Recorder(kv_cache_manager, path, scheduler=None)`` wraps, on the instances only and
without changing what they do, ``KVCacheManager.get_computed_blocks`` / ``allocate_slots``
/ ``free`` / ``pop_blocks_for_free`` / ``new_step_starts`` and the block pool's ``touch``
/ ``free_blocks`` / ``_maybe_evict_cached_block``, and writes one JSON line a step:

- a prefix hit found by ``get_computed_blocks`` is a ``share`` placed at lookup time
  (docs/replay.md, "Recording a prefix hit"), but kept only if ``allocate_slots`` takes it
  in the same step: a lookup that finds no room (``allocate_slots`` returns None) or that
  the scheduler drops is no share (vLLM touched nothing);
- the blocks ``allocate_slots`` appends to the request's table beyond the hit are an
  ``allocate`` (connector blocks for ``num_external_computed_tokens`` too), the tokens it
  covers an ``append``: ``num_computed_tokens`` + the hit + the external tokens + the new
  tokens, the KV this step writes, but not the speculative rows (drafts, or the padding to
  the draft length) past the request's tokens: attached to a scheduler, those it accepts
  are appended when ``update_from_output`` returns (it lowers ``num_computed_tokens`` by
  the rejected ones), so a rejected draft is never a token of the log;
- ``free`` of a finished request is a ``free``; of a request that is not finished (vLLM's
  ``_preempt_request`` frees a RUNNING request) a ``preempt``: the request lives on and its
  resumption is its next allocation. When the pool took back other blocks than the
  request's table (read from ``free_blocks``' effect: each block once per decrement of its
  ref_cnt), the op says which (``handed``): replay names a block kept back (``leak``) or
  given back twice (``double_free``), with the request;
- a prefix hit (``share``) carries the hash the request asked for each block, and
  ``cache_full_blocks`` setting blocks' hashes is a ``cache``: replay compares the two
  (``prefix_hash``); an eviction of a cached block, or a prefix-cache reset, is an
  ``evict``; a ``touch`` or ``free_blocks`` called outside the manager is recorded as the
  engine's own ``observe`` of the blocks' ref_cnt;
- every step ends with ``observed``: the ref_cnt of each block the step touched, those of
  them in the free queue (``free_list``) and the pool's free-block count.

With a ``scheduler`` (what the vLLM plugin attaches: ``pagedkv_sql.plugins.vllm``), a step
ends when ``Scheduler.schedule()`` returns and when ``update_from_output()`` returns: the
tokens a step computes are appended in the schedule line, and the free of a request that
finishes on them lands in the next line (vLLM frees it after the forward pass). Without one,
a step ends at ``new_step_starts`` or ``step()``. ``safe=True`` (the plugin's): an error of
the recorder is logged once, the recorder puts the engine's methods back and stops; the
engine never sees it. Reads attributes only: it never imports vLLM.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from ..engines.groups import primary
from ..engines.vllm import describe_groups
from ..hashes import CANONICAL
from ..kv_groups import FULL_ATTENTION
from .builder import short_hash
from .header import SNAPSHOT_HINT, log_groups, unreplayable
from .record import StepRecorder

log = logging.getLogger("pagedkv_sql.record")


class UnsupportedEngine(Exception):
    """The engine's KV cache has a shape the step log cannot describe (a Mamba group, a
    group with a host pool of its own); ``hint``: how to check that engine instead."""

    hint = SNAPSHOT_HINT


class Recorder(StepRecorder):
    def __init__(
        self,
        kv_cache_manager: Any,
        path: str | os.PathLike[str] | TextIO,
        *,
        scheduler: Any = None,
        safe: bool = False,
    ) -> None:
        self.manager = kv_cache_manager
        self.pool = kv_cache_manager.block_pool
        self.managers = list(kv_cache_manager.coordinator.single_type_managers)
        if any(getattr(m, "host_pool", None) is not None for m in self.managers):
            raise UnsupportedEngine("a KV-cache group with a host block pool of its own")
        # each group's kind (an unknown spec class is refused by name: an InputError)
        described = describe_groups(kv_cache_manager, self.managers)
        self.groups = [{k: v for k, v in g.items() if k != "layer_names"} for g in described]
        self.primary = primary([g["kind"] for g in self.groups])
        self.several = len(self.managers) > 1  # ops name their group
        self.block_size = int(self.managers[self.primary].block_size)
        why = unreplayable(self.groups)
        if why is not None:  # a log replay refuses: nothing is written (the snapshots check)
            raise UnsupportedEngine(f"`pagedkv-sql replay` cannot replay its log: {why}")
        self.null = int(self.pool.null_block.block_id)
        self.touched: set[int] = set()
        self.tokens: dict[str, int] = {}  # tokens recorded per live request
        self.depth = 0  # > 0 inside a manager call: pool calls are part of it
        self.pool_freed: list[int] | None = None  # blocks free_blocks took back inside a free
        # prefix hits looked up but not yet taken (touched) by allocate_slots, by request:
        # the share ops (one per group) already in this step's ops. The engine's ref_cnt
        # does not count them yet, so they are not compared until then; at the step's end
        # they are dropped.
        self.pending: dict[str, list[dict[str, Any]]] = {}
        self.freeing: str | None = None  # the request whose free is under way
        # requests whose last allocation covered speculative drafts: their drafts' tokens
        # count once update_from_output says how many were accepted
        self.drafted: dict[str, int] = {}  # request -> its drafts scheduled
        # what the recorder saw, for a caller's figures: requests finished and preempted,
        # lookups dropped (allocate_slots found no room, or the scheduler let them go)
        self.finished = self.preempted = self.lookups_dropped = 0
        # tokens a KV connector loaded; speculative rows (drafts, padding) accepted, and
        # rejected (never recorded)
        self.external_tokens = self.drafts_accepted = self.drafts_rejected = 0
        super().__init__(
            path,
            engine="vllm",
            block_size=self.block_size,
            num_gpu_blocks=len(self.pool.blocks),
            reserved_blocks=[self.null],
            # one full-attention group is what a log without groups means
            groups=log_groups(self.groups) or None,
            hash_fold=CANONICAL,
            safe=safe,
        )
        m, p = self.manager, self.pool
        self._wrap(m, "get_computed_blocks", self._get_computed_blocks)
        self._wrap(m, "allocate_slots", self._allocate_slots)
        self._wrap(m, "free", self._free)
        self._wrap(m, "pop_blocks_for_free", self._pop_blocks_for_free)
        self._wrap(m, "new_step_starts", self._new_step_starts)
        for g, manager in enumerate(self.managers):
            if (
                self.groups[g]["kind"] != FULL_ATTENTION
            ):  # a window's frees (full attention has none)
                self._wrap(manager, "remove_skipped_blocks", self._window_frees(g))
        self._wrap(p, "touch", self._touch)
        self._wrap(p, "free_blocks", self._free_blocks)
        self._wrap(p, "_maybe_evict_cached_block", self._evict)
        self._wrap(p, "cache_full_blocks", self._cache_full_blocks)
        self._wrap(p, "reset_prefix_cache", self._reset_prefix_cache)
        self.scheduler = scheduler
        if scheduler is not None:
            self._wrap(scheduler, "schedule", self._step_after)
            self._wrap(scheduler, "update_from_output", self._update_after)

    # -- plumbing ----------------------------------------------------------------------------
    @contextmanager
    def _inside(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def _group_op(self, name: str, rid: str, group: int) -> dict[str, Any]:
        """An op naming a request's table: its group said in a log of several groups."""
        op: dict[str, Any] = {"op": name, "req": rid}
        if self.several:
            op["group"] = group
        return op

    def _id(self, block: Any) -> int | None:
        """A block's id in a block list; None for the null block, a placeholder (a
        sliding window's or a prefix hit's padding entry: no block held)."""
        i = int(block.block_id)
        return None if i == self.null else i

    def _ids(self, request_id: str, group: int = 0) -> list[Any]:
        return self.managers[group].req_to_blocks.get(request_id, ())  # type: ignore[no-any-return]

    def _tables(self, request_id: str) -> list[Any]:
        """Every group's blocks of the request, group 0 first."""
        return [b for g in range(len(self.managers)) for b in self._ids(request_id, g)]

    # -- wrapped calls -----------------------------------------------------------------------
    def _get_computed_blocks(self, original: Any, request: Any, *a: Any, **kw: Any) -> Any:
        with self._inside():
            result = original(request, *a, **kw)
        rid = str(request.request_id)
        self._drop_lookup(rid)  # a second lookup of the same request replaces the first
        if int(result[1]):  # a hit: a share in every group (the hit length in each)
            ops = [self._share(request, list(b), g) for g, b in enumerate(result[0].blocks)]
            self.ops.extend(ops)
            self.pending[rid] = ops
        return result

    def _share(self, request: Any, blocks: list[Any], group: int) -> dict[str, Any]:
        """A prefix hit in ``group``: the blocks, and per block the hash the request asked
        for (its ``block_hashes`` at the group's block size, as engines/vllm.py's capture
        reads them; null past them, and for a block whose cached prefix is not whole
        blocks)."""
        size = int(self.managers[group].block_size)
        hashes = list(getattr(request, "block_hashes", ()) or ())
        per = int(getattr(self.pool, "hash_block_size", size) or size)
        view = hashes[max(1, size // per) - 1 :: max(1, size // per)]
        asked: list[str | None] = []
        for i, block in enumerate(blocks):
            tokens = getattr(block, "block_hash_num_tokens", None)
            whole = tokens is None or tokens % size == 0
            asked.append(short_hash(view[i]) if i < len(view) and whole else None)
        op = self._group_op("share", str(request.request_id), group)
        op["blocks"] = [self._id(b) for b in blocks]
        if any(h is not None for h in asked):
            op["hashes"] = asked
        return op

    def _drop_lookup(self, rid: str) -> None:
        ops = self.pending.pop(rid, None)
        if ops is not None:
            self.ops = [o for o in self.ops if all(o is not p for p in ops)]
            self.lookups_dropped += 1

    def _allocate_slots(
        self, original: Any, request: Any, num_new_tokens: int, *a: Any, **kw: Any
    ) -> Any:
        rid = request.request_id
        named = kw
        if a:  # the scheduler passes them by name; a caller of its own may not
            names = ("num_new_computed_tokens", "new_computed_blocks")
            named = {**dict(zip(names, a[:2], strict=False)), **kw}
        hit = named.get("num_new_computed_tokens") or 0
        external = named.get("num_external_computed_tokens") or 0
        given = named.get("new_computed_blocks")
        computed = request.num_computed_tokens
        groups = range(len(self.managers))
        before = [len(self._ids(rid, g)) for g in groups]
        with self._inside():
            new = original(request, num_new_tokens, *a, **kw)
        if new is None:  # no room: vLLM touched nothing, the lookup was no share
            self._drop_lookup(rid)
            return new
        given_blocks = list(given.blocks) if given is not None and hit else []
        ops = self.pending.pop(rid, None) or []
        if given_blocks:
            for g in groups:
                # what the table took of the hit: a sliding window replaces the hit's blocks
                # that are out of its window at the hit's length by placeholders
                took = list(self._ids(rid, g)[before[g] : before[g] + len(given_blocks[g])])
                self.touched.update(i for b in took if (i := self._id(b)) is not None)
                taken = self._share(request, took, g)
                if g < len(ops):  # what the scheduler passed on (it may cut the hit short)
                    ops[g].clear()
                    ops[g].update(taken)
                else:  # no lookup seen (a caller of its own): the share is now
                    self.ops.append(taken)
                before[g] += len(took)
        else:
            self.ops = [o for o in self.ops if all(o is not p for p in ops)]
        for g in groups:
            fresh = [self._id(b) for b in self._ids(rid, g)[before[g] :]]
            if fresh:
                self.ops.append({**self._group_op("allocate", rid, g), "blocks": fresh})
                self.touched.update(b for b in fresh if b is not None)
        self.external_tokens += int(external)
        held = int(computed + hit + external + num_new_tokens)
        # only a scheduler's update_from_output says which drafts were accepted
        drafts = _drafts(request, held) if self.scheduler is not None else 0
        if drafts:
            self.drafted[rid] = drafts
            held -= drafts
        grow = held - self.tokens.get(rid, 0)
        if grow > 0:
            self.ops.append({"op": "append", "req": rid, "tokens": grow})
            self.tokens[rid] = held
        elif rid not in self.tokens and any(self._ids(rid, g) for g in groups):
            self.tokens[rid] = 0
        return new

    def _window_frees(self, group: int) -> Any:
        """The wrapper of group ``group``'s ``remove_skipped_blocks``."""

        def wrapped(original: Any, request_id: Any, processed: int, *a: Any, **kw: Any) -> Any:
            return self._remove_skipped_blocks(group, original, request_id, processed, *a, **kw)

        return wrapped

    def _remove_skipped_blocks(
        self, group: int, original: Any, request_id: Any, processed: int, *a: Any, **kw: Any
    ) -> Any:
        """A window's frees: every entry of the table the call replaced by the null block
        (what it did, not what the window lets go: a free inside the window shows), a
        ``window_free`` measured at the processed tokens vLLM passed."""
        rid = str(request_id)
        before = [int(b.block_id) for b in self._ids(rid, group)]
        with self._inside():
            result = original(request_id, processed, *a, **kw)
        after = [int(b.block_id) for b in self._ids(rid, group)]
        freed = [
            b for b, now in zip(before, after, strict=False) if b != self.null and now == self.null
        ]
        if freed:
            op = self._group_op("window_free", rid, group)
            self.ops.append({**op, "blocks": freed, "tokens": int(processed)})
            self.touched.update(freed)
        return result

    def _free(self, original: Any, request: Any, *a: Any, **kw: Any) -> Any:
        return self._release(original, request, a, kw, pool=True)

    def _pop_blocks_for_free(self, original: Any, request: Any, *a: Any, **kw: Any) -> Any:
        # a deferred free (vLLM defers it while a connector may still write the blocks):
        # the request lets go now, the pool gets the blocks later
        return self._release(original, request, a, kw, pool=False)

    def _release(
        self, original: Any, request: Any, a: tuple[Any, ...], kw: dict[str, Any], *, pool: bool
    ) -> Any:
        rid = str(request.request_id)
        table = self._tables(rid)
        self.touched.update(int(b.block_id) for b in table)
        self.pool_freed, self.freeing = [], rid
        try:
            with self._inside():
                result = original(request, *a, **kw)
            handed = [b for b in self.pool_freed if b != self.null]  # a placeholder
        finally:
            self.pool_freed = self.freeing = None
        self._drop_lookup(rid)
        if rid not in self.tokens:  # never allocated (aborted while waiting)
            return result
        finished = bool(request.is_finished())
        op: dict[str, Any] = {"op": "free" if finished else "preempt", "req": rid}
        if pool and sorted(handed) != sorted(i for b in table if (i := self._id(b)) is not None):
            # the pool took back other blocks than the request holds (one twice, one
            # missing): the free says which, in one fact (docs/replay.md)
            op["handed"] = handed
        # drafts verified in the step that finishes the request are not appended: their
        # KV goes with the request's blocks in the same line (no token left without one)
        self.drafted.pop(rid, None)
        self.ops.append(op)
        if finished:
            del self.tokens[rid]
            self.finished += 1
        else:
            self.tokens[rid] = 0
            self.preempted += 1
        return result

    def _new_step_starts(self, original: Any, *a: Any, **kw: Any) -> Any:
        self.step()
        return original(*a, **kw)

    def _step_after(self, original: Any, *a: Any, **kw: Any) -> Any:
        result = original(*a, **kw)
        self.step()
        return result

    def _update_after(self, original: Any, *a: Any, **kw: Any) -> Any:
        """update_from_output: the drafts it accepted are tokens now (it lowered each
        drafting request's num_computed_tokens by the drafts it rejected)."""
        result = original(*a, **kw)
        requests = self.scheduler.requests
        for rid in self.drafted:
            request = requests.get(rid)
            if request is not None:
                self._accept(request)
        self.drafted.clear()
        self.step()
        return result

    def _accept(self, request: Any) -> None:
        """Append the drafts of ``request`` its verification kept (its KV, written in the
        step that scheduled them, stays); the rest are dropped, never recorded."""
        rid = str(request.request_id)
        if rid not in self.tokens:
            return
        kept = int(request.num_computed_tokens) - self.tokens[rid]
        self.drafts_accepted += max(kept, 0)
        self.drafts_rejected += self.drafted.get(rid, 0) - max(kept, 0)
        if kept > 0:
            self.ops.append({"op": "append", "req": rid, "tokens": kept})
            self.tokens[rid] += kept

    def _touch(self, original: Any, blocks: Any, *a: Any, **kw: Any) -> Any:
        blocks = list(blocks)
        self.touched.update(int(b.block_id) for b in blocks)
        result = original(blocks, *a, **kw)
        if self.depth == 0:  # a hold no request took: the engine's counts say what
            self.ops.append({"op": "observe", **self._observed(b.block_id for b in blocks)})
        return result

    def _free_blocks(self, original: Any, ordered_blocks: Any, *a: Any, **kw: Any) -> Any:
        """What the pool took back: each block once per decrement of its ref_cnt (the
        call's effect, not its arguments: a free path that drops a block, or frees one
        twice, shows)."""
        blocks = list(ordered_blocks)
        self.touched.update(int(b.block_id) for b in blocks)
        unique = {int(b.block_id): b for b in blocks}
        before = {i: int(b.ref_cnt) for i, b in unique.items()}
        result = original(blocks, *a, **kw)
        if self.pool_freed is not None:
            for i, b in unique.items():
                self.pool_freed.extend([i] * max(0, before[i] - int(b.ref_cnt)))
        if self.depth == 0:  # a release no request made: the engine's counts say what
            self.ops.append({"op": "observe", **self._observed(b.block_id for b in blocks)})
        return result

    def _cache_full_blocks(self, original: Any, *a: Any, **kw: Any) -> Any:
        """The blocks whose hash the call set: a ``cache`` with each block's hash (the
        pool's hash with its 4-byte group id cut off, folded as the shares' are: vLLM's
        published integer) and, where the engine's hash is bytes, its whole digest in hex
        (``digests``)."""
        blocks = list(kw["blocks"] if "blocks" in kw else a[1] if len(a) > 1 else ())
        before = [b.block_hash for b in blocks]
        result = original(*a, **kw)
        cached = [b for b, h in zip(blocks, before, strict=True) if b.block_hash is not h]
        cached = [b for b in cached if b.block_hash is not None]
        if cached:
            hashes = [_cached_hash(b.block_hash) for b in cached]
            op = {"op": "cache", "blocks": [int(b.block_id) for b in cached], "hashes": hashes}
            digests = [_digest(b.block_hash) for b in cached]
            if all(d is not None for d in digests):
                op["digests"] = digests
            self.ops.append(op)
        return result

    def _reset_prefix_cache(self, original: Any, *a: Any, **kw: Any) -> Any:
        """A reset drops every block's hash (no block is held then): an ``evict`` of them."""
        hashed = [int(b.block_id) for b in self.pool.blocks if b.block_hash is not None]
        done = original(*a, **kw)
        if done and hashed:
            self.ops.append({"op": "evict", "blocks": hashed})
        return done

    def _evict(self, original: Any, block: Any, *a: Any, **kw: Any) -> Any:
        evicted = original(block, *a, **kw)
        if evicted:
            self.ops.append({"op": "evict", "blocks": [int(block.block_id)]})
            self.touched.add(int(block.block_id))
        return evicted

    # -- steps -------------------------------------------------------------------------------
    def _observed(self, ids: Any) -> dict[str, Any]:
        skip = {self.null}
        for ops in self.pending.values():
            for op in ops:
                skip.update(op["blocks"])
        blocks = self.pool.blocks
        seen = [int(i) for i in ids if int(i) not in skip]
        out: dict[str, Any] = {"ref_cnt": {str(i): int(blocks[i].ref_cnt) for i in seen}}
        # those in the free queue (a doubly linked list: a queued block has a predecessor)
        listed = [i for i in seen if blocks[i].prev_free_block is not None]
        if listed:
            out["free_list"] = listed
        if not self.pending:  # the pool still counts looked-up blocks as free
            out["num_free_blocks"] = int(self.pool.get_num_free_blocks())
        return out

    def _observed_step(self) -> dict[str, Any]:
        return self._observed(sorted(self.touched))

    def step(self) -> int:
        """End the step; a lookup no ``allocate_slots`` took by now is dropped (vLLM's
        scheduler discards it too)."""
        for rid in list(self.pending):
            self._drop_lookup(rid)
        return super().step()

    def _start_step(self) -> None:
        self.touched = set()


def _cached_hash(block_hash: Any) -> str | None:
    """A block's hash as the pool keeps it (vLLM's BlockHashWithGroupId: the hash's bytes,
    then the group id in 4 bytes) abbreviated as the request's hashes are."""
    if isinstance(block_hash, bytes | bytearray):
        return short_hash(bytes(block_hash)[:-4])
    return short_hash(block_hash)


def _digest(block_hash: Any) -> str | None:
    """A cached block's whole digest in hex (its group id cut off); None for a hash that is
    not bytes."""
    if isinstance(block_hash, bytes | bytearray):
        return bytes(block_hash)[:-4].hex()
    return None


def _drafts(request: Any, held: int) -> int:
    """The speculative rows among the tokens an allocation covers (``held``: computed,
    hit, external and new), as vLLM's scheduler counts them (``scheduled_spec_decode_
    tokens``): what reaches past the request's tokens and output placeholders, its drafts
    (``spec_token_ids``) or the padding a new decode request gets to the batch's draft
    length."""
    placeholders = int(getattr(request, "num_output_placeholders", 0) or 0)
    return max(0, held - int(request.num_tokens) - placeholders)


def record(
    kv_cache_manager: Any, path: str | os.PathLike[str], *, scheduler: Any = None
) -> Recorder:
    """Start recording ``kv_cache_manager`` to the JSON Lines step log at ``path``."""
    return Recorder(kv_cache_manager, Path(path), scheduler=scheduler)


def attach(scheduler: Any, path: str | os.PathLike[str], *, safe: bool = False) -> Recorder:
    """Record a live vLLM ``Scheduler`` (its ``kv_cache_manager``), a step a
    ``schedule()`` and an ``update_from_output()``."""
    return Recorder(scheduler.kv_cache_manager, Path(path), scheduler=scheduler, safe=safe)
