"""Record SGLang's paged KV cache as a step log, from the scheduler's own paths (docs/replay.md).

``Recorder(req_to_token_pool, allocator, path, tree_cache=None)`` wraps, on the instances
only and without changing what they do, what SGLang 0.5.21's scheduler calls:

- the allocator's ``alloc``, ``alloc_extend`` and ``alloc_decode`` (``alloc_for_extend`` /
  ``alloc_for_decode``): the pages they take off the free list are *fresh*;
- its ``free``, ``free_segment`` and ``free_page_ids`` (also inside ``free_group_begin`` /
  ``free_group_end``): the pages handed back, credited to the request whose row
  ``free_kv_row`` / ``insert_req`` / ``cache_unfinished_req`` is releasing, or to the
  radix cache's ``evict`` (an ``evict`` op);
- the radix cache's ``inc_lock_ref`` / ``dec_lock_ref``: the pages under the node whose
  lock changed are observed at the step's end.

It never relies on ``ReqToTokenPool.write`` (prefill writes rows with a Triton kernel):
``step(reqs)`` reads each live request's ``req_to_token`` row (``reqs``: SGLang ``Req``s,
``rid``, ``kv.req_pool_idx``, ``kv.kv_allocated_len``) and writes what changed since the
last step, with pages as blocks (block_size = page_size):

- a request that left ``reqs`` is freed (``free``); one still in ``reqs`` without a row was
  retracted (``preempt``). When the pages its release handed back, plus those the radix
  cache keeps, are not its table once each, a ``release`` of the pages as handed comes first
  (a page handed twice is then ``double_free`` at that step);
- a new page index of a row is an ``allocate`` when an allocation took that page off the
  free list this step, else a ``share`` (a radix-cache prefix); the tokens past the row's
  recorded length are an ``append``. A row whose recorded pages changed (``cache_unfinished_req``
  re-pointing a chunk at the tree's copy) is written as ``preempt`` and its table again;
- ``observed``: each page the step touched with SGLang's own count — the ``lock_ref`` of
  the radix node holding it, else the live rows holding it, else 0 when it is free and 1
  when it is neither free, nor cached, nor in a row (a page the pool lost).

Reads attributes only: it never imports SGLang or torch.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
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
        self.fresh: Counter[int] = Counter()  # pages allocations took off the free list
        self.tables: dict[str, tuple[int, list[int]]] = {}  # request -> (tokens, pages)
        self.rows: dict[int, str] = {}  # row -> request, as of the last step
        self.handed: dict[int, list[int]] = {}  # row -> pages its release handed back
        self.evicted: list[list[int]] = []
        self.touched: set[int] = set()
        self._nested = 0
        self._context: list[tuple[str, int]] = []  # ("row", r) / ("evict", 0) being released
        num_pages = int(getattr(allocator, "num_pages", allocator.size // self.page_size))
        super().__init__(
            path,
            engine="sglang",
            block_size=self.page_size,
            num_gpu_blocks=num_pages + 1,
            reserved_blocks=[0],
        )
        for name in ("alloc", "alloc_extend", "alloc_decode"):
            if hasattr(allocator, name):
                self._wrap(allocator, name, self._alloc)
        for name in ("free", "free_segment", "free_page_ids"):
            if hasattr(allocator, name):
                self._wrap(allocator, name, self._freeing(name))
        if tree_cache is not None:
            self._wrap(tree_cache, "evict", self._evict)
            self._wrap(tree_cache, "free_kv_row", self._releasing_kv)
            # 0.5.21's insert_req is 0.5.23's checkpoint; 0.5.23 has no cache_unfinished_req
            for name in ("insert_req", "checkpoint", "cache_unfinished_req"):
                if hasattr(tree_cache, name):
                    self._wrap(tree_cache, name, self._releasing_req)
            for name in ("inc_lock_ref", "dec_lock_ref"):
                self._wrap(tree_cache, name, self._locking)

    # -- wrapped calls -----------------------------------------------------------------------
    def _free_pages(self) -> Counter[int]:
        return Counter(as_numpy(self.allocator.get_all_free_pages()).astype(np.int64).tolist())

    def _alloc(self, original: Any, *a: Any, **kw: Any) -> Any:
        before = self._free_pages()
        out = original(*a, **kw)
        if out is not None:
            taken = before - self._free_pages()
            self.fresh.update(taken)
            self.touched.update(taken)
        return out

    def _freeing(self, name: str) -> Any:
        def wrapper(original: Any, index: Any, *a: Any, **kw: Any) -> Any:
            if self._nested:  # free_segment's own free_page_ids: counted once, outside
                return original(index, *a, **kw)
            slots = as_numpy(index).astype(np.int64).reshape(-1)
            if name == "free_page_ids":
                pages = slots.tolist()
            elif name == "free_segment":
                pages = (slots[:: self.page_size] // self.page_size).tolist()
            else:  # free() hands each page once (torch.unique)
                pages = np.unique(slots // self.page_size).tolist()
            if not self._context:
                # a free outside a request's release and outside eviction
                self._context.append(("loose", 0))
                try:
                    return self._credit(pages, original, index, *a, **kw)
                finally:
                    self._context.pop()
            return self._credit(pages, original, index, *a, **kw)

        return wrapper

    def _credit(self, pages: list[int], original: Any, *a: Any, **kw: Any) -> Any:
        kind, row = self._context[-1]
        if kind == "evict":
            self.evicted.append(pages)
        elif kind == "row":
            self.handed.setdefault(row, []).extend(pages)
        else:
            self.handed.setdefault(-1, []).extend(pages)
        self.touched.update(pages)
        self._nested += 1
        try:
            return original(*a, **kw)
        finally:
            self._nested -= 1

    def _evict(self, original: Any, *a: Any, **kw: Any) -> Any:
        self._context.append(("evict", 0))
        try:
            return original(*a, **kw)
        finally:
            self._context.pop()

    def _releasing_kv(self, original: Any, kv: Any, *a: Any, **kw: Any) -> Any:
        return self._as_row(getattr(kv, "req_pool_idx", None), original, kv, *a, **kw)

    def _releasing_req(self, original: Any, req: Any, *a: Any, **kw: Any) -> Any:
        row = getattr(getattr(req, "kv", req), "req_pool_idx", None)
        return self._as_row(row, original, req, *a, **kw)

    def _as_row(self, row: Any, original: Any, *a: Any, **kw: Any) -> Any:
        self._context.append(("row", -1 if row is None else int(row)))
        try:
            return original(*a, **kw)
        finally:
            self._context.pop()

    def _locking(self, original: Any, node: Any, *a: Any, **kw: Any) -> Any:
        walk = node
        while walk is not None and walk is not self.tree.root_node:
            if walk.value is not None:
                slots = as_numpy(walk.value).astype(np.int64)
                self.touched.update(np.unique(slots // self.page_size).tolist())
            walk = walk.parent
        return original(node, *a, **kw)

    # -- the step's end ----------------------------------------------------------------------
    def step(self, reqs: Iterable[Any] | None = None) -> int:
        """End the step: ``reqs`` are the requests the scheduler keeps (running, and
        retracted ones waiting to resume); their rows are read now. Without ``reqs``
        (``close()``), only what the wrapped calls gathered is written."""
        if reqs is None:
            return super().step()
        live: dict[str, tuple[int, int]] = {}
        retracted: set[str] = set()
        for req in reqs:
            kv = getattr(req, "kv", req)
            row = getattr(kv, "req_pool_idx", None)
            if row is None:
                retracted.add(str(req.rid))
            else:
                live[str(req.rid)] = (int(row), int(kv.kv_allocated_len))
        tree = self._tree_pages()
        row_of = {rid: row for row, rid in self.rows.items()}
        for rid in [r for r in self.tables if r not in live]:
            if rid in retracted and self.tables[rid] == (0, []):
                continue  # retracted before, still waiting
            self._drop(rid, row_of.get(rid), tree, "preempt" if rid in retracted else "free")
        loose = self.handed.pop(-1, [])
        if loose:  # pages handed back outside any release: credit each to its last holder
            self._loose(loose, tree)
        for pages in self.evicted:
            self.ops.append({"op": "evict", "blocks": pages})
        table = as_numpy(self.rtt.req_to_token)
        self.rows = {}
        for rid, (row, tokens) in live.items():
            self.rows[row] = rid
            self._grow(rid, table[row, :tokens].astype(np.int64))
        self._observe(tree, live, table)
        self.fresh.clear()
        self.handed.clear()
        self.evicted = []
        return super().step()

    def _drop(self, rid: str, row: int | None, tree: dict[int, int], op: str) -> None:
        _, pages = self.tables.pop(rid)
        handed = self.handed.pop(row, []) if row is not None else []
        kept = Counter(handed) + Counter(p for p in pages if p in tree)
        if kept != Counter(pages):
            self.ops.append({"op": "release", "req": rid, "blocks": handed})
        self.touched.update(pages)
        self.ops.append({"op": op, "req": rid})
        if op == "preempt":
            self.tables[rid] = (0, [])

    def _loose(self, pages: list[int], tree: dict[int, int]) -> None:
        holders = {p: rid for rid, (_, held) in self.tables.items() for p in held}
        for page in pages:
            rid = holders.get(page)
            if rid is not None:
                self.ops.append({"op": "release", "req": rid, "blocks": [page]})

    def _grow(self, rid: str, slots: np.ndarray) -> None:
        ps = self.page_size
        now = (slots[::ps] // ps).tolist()
        tokens, pages = self.tables.get(rid, (0, []))
        if pages != now[: len(pages)]:  # the row was re-pointed: its table again
            self.ops.append({"op": "preempt", "req": rid})
            self.touched.update(pages)
            tokens, pages = 0, []
        for page in now[len(pages) :]:
            op = "allocate" if self.fresh[page] > 0 else "share"
            if op == "allocate":
                self.fresh[page] -= 1
            self.ops.append({"op": op, "req": rid, "blocks": [page]})
            self.touched.add(page)
        if len(slots) > tokens:
            self.ops.append({"op": "append", "req": rid, "tokens": len(slots) - tokens})
        self.tables[rid] = (len(slots), now)

    def _tree_pages(self) -> dict[int, int]:
        """Each page a radix node holds -> the node's lock_ref."""
        out: dict[int, int] = {}
        if self.tree is None:
            return out
        stack = [self.tree.root_node]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is self.tree.root_node or node.value is None:
                continue
            slots = as_numpy(node.value).astype(np.int64)
            for page in np.unique(slots // self.page_size).tolist():
                out[int(page)] = int(node.lock_ref)
        return out

    def _observe(self, tree: dict[int, int], live: dict[str, tuple[int, int]], table: Any) -> None:
        if not self.touched or not self.ops:
            self.touched = set()
            return
        ps = self.page_size
        in_rows: Counter[int] = Counter()
        for row, tokens in live.values():
            in_rows.update(set((table[row, :tokens].astype(np.int64) // ps).tolist()))
        free = set(self._free_pages())
        counts: dict[str, int] = {}
        for page in sorted(self.touched - {0}):
            if page in tree:
                counts[str(page)] = tree[page]
            elif in_rows[page]:
                counts[str(page)] = in_rows[page]
            else:
                counts[str(page)] = 0 if page in free else 1
        self.touched = set()
        self.ops.append({"op": "observe", "ref_cnt": counts})
