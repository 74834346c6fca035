"""Record SGLang's paged KV-cache pools as a step log (docs/replay.md).

``Recorder(req_to_token_pool, allocator, path, tree_cache=None)`` wraps, on the instances
only and without changing what they do, ``PagedTokenToKVPoolAllocator.alloc``,
``ReqToTokenPool.write`` / ``free_rows`` and ``RadixCache.evict``, and writes the log with
pages as blocks (block_size = page_size):

- a row's first write of a page that ``alloc`` handed out and no request took yet is an
  ``allocate``; of any other page (a radix-cache prefix, another row's page) a ``share``;
  the positions written past the row's length an ``append``;
- ``free_rows`` is a ``free`` of each row's request; pages the radix cache's ``evict``
  gives back are an ``evict``.

A row's request is named by ``name(row, request_id)`` or ``row<r>.<generation>``. A step
ends at ``step()``. Reads attributes only: it never imports SGLang or torch.
"""

from __future__ import annotations

import os
from typing import Any, TextIO

import numpy as np

from ..engines.snapshot import as_numpy
from .record import StepRecorder


class Recorder(StepRecorder):
    def __init__(
        self,
        req_to_token_pool: Any,
        allocator: Any,
        path: str | os.PathLike[str] | TextIO,
        tree_cache: Any = None,
    ) -> None:
        self.rtt, self.allocator, self.tree = req_to_token_pool, allocator, tree_cache
        self.page_size = int(allocator.page_size)
        self.fresh: set[int] = set()  # pages alloc handed out that no row took yet
        self.names: dict[int, str] = {}
        self.rows: dict[int, tuple[str, int, list[int]]] = {}  # row -> (request, tokens, pages)
        self.evicting = 0
        num_pages = int(getattr(allocator, "num_pages", allocator.size // self.page_size))
        super().__init__(
            path,
            engine="sglang",
            block_size=self.page_size,
            num_gpu_blocks=num_pages + 1,
            reserved_blocks=[0],
        )
        self._wrap(allocator, "alloc", self._alloc)
        self._wrap(allocator, "free_segment", self._free_segment)
        self._wrap(req_to_token_pool, "write", self._write)
        self._wrap(req_to_token_pool, "free_rows", self._free_rows)
        if tree_cache is not None:
            self._wrap(tree_cache, "evict", self._evict)

    def name(self, row: int, request_id: str) -> None:
        """Name the request that holds ``row`` from now on."""
        self.names[int(row)] = str(request_id)

    # -- wrapped calls -----------------------------------------------------------------------
    def _alloc(self, original: Any, need_size: int, *a: Any, **kw: Any) -> Any:
        slots = original(need_size, *a, **kw)
        if slots is not None:
            self.fresh.update(int(p) for p in np.unique(as_numpy(slots) // self.page_size))
        return slots

    def _free_segment(self, original: Any, free_index: Any, *a: Any, **kw: Any) -> Any:
        if self.evicting:
            pages = np.unique(as_numpy(free_index) // self.page_size).tolist()
            self.ops.append({"op": "evict", "blocks": [int(p) for p in pages]})
        return original(free_index, *a, **kw)

    def _evict(self, original: Any, *a: Any, **kw: Any) -> Any:
        self.evicting += 1
        try:
            return original(*a, **kw)
        finally:
            self.evicting -= 1

    def _write(self, original: Any, indices: Any, values: Any) -> Any:
        result = original(indices, values)
        row, positions = _row_positions(indices, as_numpy(values).size)
        if row is None:
            return result
        slots = as_numpy(values).astype(np.int64).reshape(-1)
        if row not in self.rows:
            generation = int(as_numpy(self.rtt.req_generation)[row])
            rid = self.names.get(row, f"row{row}.{generation}")
            self.rows[row] = (rid, 0, [])
        rid, tokens, pages = self.rows[row]
        for pos, slot in zip(positions, slots, strict=True):
            if pos < tokens:
                continue
            page = int(slot) // self.page_size
            if pos // self.page_size == len(pages):
                op = "allocate" if page in self.fresh else "share"
                self.fresh.discard(page)
                self.ops.append({"op": op, "req": rid, "blocks": [page]})
                pages.append(page)
        grown = max(positions, default=-1) + 1
        if grown > tokens:
            self.ops.append({"op": "append", "req": rid, "tokens": grown - tokens})
            tokens = grown
        self.rows[row] = (rid, tokens, pages)
        return result

    def _free_rows(self, original: Any, indices: Any, *a: Any, **kw: Any) -> Any:
        for row in [int(r) for r in indices]:
            held = self.rows.pop(row, None)
            if held is not None:
                self.ops.append({"op": "free", "req": held[0]})
            self.names.pop(row, None)
        return original(indices, *a, **kw)


def _row_positions(indices: Any, count: int) -> tuple[int | None, list[int]]:
    """``req_to_token[indices] = values`` with ``indices`` a (row, slice) or (row,
    positions) pair: the row and the positions written."""
    if not isinstance(indices, tuple) or len(indices) != 2:
        return None, []
    row, where = indices
    try:
        row = int(row)
    except TypeError:
        return None, []
    if isinstance(where, slice):
        start = where.start or 0
        return row, list(range(start, start + count))
    return row, [int(p) for p in as_numpy(where).reshape(-1)]
