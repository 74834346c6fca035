"""Record a live vLLM v1 KVCacheManager as a step log (docs/replay.md).

``Recorder(kv_cache_manager, path)`` wraps, on the instances only and without changing
what they do, ``KVCacheManager.get_computed_blocks`` / ``allocate_slots`` / ``free`` /
``new_step_starts`` and the block pool's ``touch`` / ``free_blocks`` /
``_maybe_evict_cached_block`` (the eviction of a cached block when ``get_new_blocks``
reuses it), and writes one JSON line a step:

- a prefix hit found by ``get_computed_blocks`` is a ``share`` at lookup time (the engine
  has decided to reuse the content: docs/replay.md, "Recording a prefix hit");
- blocks ``allocate_slots`` returns are an ``allocate``, the tokens it covers an ``append``;
- ``free`` is a ``free``; an eviction of a cached block is an ``evict``;
- a ``touch`` or ``free_blocks`` called outside the manager (as a bug or a connector
  would) is recorded as the engine's own ``observe`` of the blocks' ref_cnt;
- every step ends with ``observed``: the ref_cnt of each block the step touched and the
  pool's free-block count.

A step ends at ``new_step_starts`` (the scheduler calls it each step) or ``step()``.
Reads attributes only: it never imports vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from .record import StepRecorder


class Recorder(StepRecorder):
    def __init__(self, kv_cache_manager: Any, path: str | os.PathLike[str] | TextIO) -> None:
        self.manager = kv_cache_manager
        self.pool = kv_cache_manager.block_pool
        self.block_size = int(kv_cache_manager.coordinator.single_type_managers[0].block_size)
        self.touched: set[int] = set()
        self.tokens: dict[str, int] = {}  # tokens recorded per live request
        self.depth = 0  # > 0 inside a manager call: pool calls are part of it
        # prefix hits looked up but not yet taken (touched) by allocate_slots: the engine's
        # ref_cnt does not count them yet, so they are not compared until then
        self.pending: dict[str, list[int]] = {}
        super().__init__(
            path,
            engine="vllm",
            block_size=self.block_size,
            num_gpu_blocks=len(self.pool.blocks),
            reserved_blocks=[int(self.pool.null_block.block_id)],
        )
        m, p = self.manager, self.pool
        self._wrap(m, "get_computed_blocks", self._get_computed_blocks)
        self._wrap(m, "allocate_slots", self._allocate_slots)
        self._wrap(m, "free", self._free)
        self._wrap(m, "new_step_starts", self._new_step_starts)
        self._wrap(p, "touch", self._touch)
        self._wrap(p, "free_blocks", self._free_blocks)
        self._wrap(p, "_maybe_evict_cached_block", self._evict)

    # -- plumbing ----------------------------------------------------------------------------
    @contextmanager
    def _inside(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    # -- wrapped calls -----------------------------------------------------------------------
    def _get_computed_blocks(self, original: Any, request: Any, *a: Any, **kw: Any) -> Any:
        with self._inside():
            result = original(request, *a, **kw)
        blocks, num_hit = result[0], int(result[1])
        ids = [int(b.block_id) for b in blocks.blocks[0]] if num_hit else []
        if ids:
            self.ops.append({"op": "share", "req": str(request.request_id), "blocks": ids})
            self.pending[str(request.request_id)] = ids
        return result

    def _allocate_slots(
        self, original: Any, request: Any, num_new_tokens: int, *a: Any, **kw: Any
    ) -> Any:
        rid = str(request.request_id)
        hit = int(kw.get("num_new_computed_tokens", a[0] if a else 0))
        with self._inside():
            new = original(request, num_new_tokens, *a, **kw)
        if new is None:
            return new
        self.touched.update(self.pending.pop(rid, []))
        ids = [int(b.block_id) for b in new.blocks[0]] if new.blocks else []
        if ids:
            self.ops.append({"op": "allocate", "req": rid, "blocks": ids})
            self.touched.update(ids)
        held = int(request.num_computed_tokens) + hit + int(num_new_tokens)
        grow = held - self.tokens.get(rid, 0)
        if grow > 0:
            self.ops.append({"op": "append", "req": rid, "tokens": grow})
            self.tokens[rid] = held
        return new

    def _free(self, original: Any, request: Any, *a: Any, **kw: Any) -> Any:
        rid = str(request.request_id)
        blocks = self.manager.coordinator.single_type_managers[0].req_to_blocks.get(rid, [])
        self.touched.update(int(b.block_id) for b in blocks)
        with self._inside():
            result = original(request, *a, **kw)
        if rid in self.tokens:
            self.ops.append({"op": "free", "req": rid})
            del self.tokens[rid]
        return result

    def _new_step_starts(self, original: Any, *a: Any, **kw: Any) -> Any:
        self.step()
        return original(*a, **kw)

    def _touch(self, original: Any, blocks: Any, *a: Any, **kw: Any) -> Any:
        blocks = list(blocks)
        self.touched.update(int(b.block_id) for b in blocks)
        return original(blocks, *a, **kw)

    def _free_blocks(self, original: Any, ordered_blocks: Any, *a: Any, **kw: Any) -> Any:
        blocks = list(ordered_blocks)
        self.touched.update(int(b.block_id) for b in blocks)
        result = original(blocks, *a, **kw)
        if self.depth == 0:  # a release no request made: the engine's counts say what
            self.ops.append({"op": "observe", **self._observed(b.block_id for b in blocks)})
        return result

    def _evict(self, original: Any, block: Any, *a: Any, **kw: Any) -> Any:
        evicted = original(block, *a, **kw)
        if evicted:
            self.ops.append({"op": "evict", "blocks": [int(block.block_id)]})
            self.touched.add(int(block.block_id))
        return evicted

    # -- steps -------------------------------------------------------------------------------
    def _observed(self, ids: Any) -> dict[str, Any]:
        skip = {int(self.pool.null_block.block_id)}
        for looked_up in self.pending.values():
            skip.update(looked_up)
        blocks = self.pool.blocks
        ref = {str(int(i)): int(blocks[int(i)].ref_cnt) for i in ids if int(i) not in skip}
        if self.pending:  # the pool still counts looked-up blocks as free
            return {"ref_cnt": ref}
        return {"ref_cnt": ref, "num_free_blocks": int(self.pool.get_num_free_blocks())}

    def _observed_step(self) -> dict[str, Any]:
        return self._observed(sorted(self.touched))

    def _start_step(self) -> None:
        self.touched = set()


def record(kv_cache_manager: Any, path: str | os.PathLike[str]) -> Recorder:
    """Start recording ``kv_cache_manager`` to the JSON Lines step log at ``path``."""
    return Recorder(kv_cache_manager, Path(path))
