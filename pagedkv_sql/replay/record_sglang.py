"""Record SGLang's paged KV cache as a step log, from the scheduler's own paths (docs/replay.md).

``Recorder(req_to_token_pool, allocator, path, tree_cache=None)`` wraps, on the instances
only and without changing what they do, what SGLang 0.5.21's scheduler calls:

- the allocator's ``alloc``, ``alloc_extend`` and ``alloc_decode`` (``alloc_for_extend`` /
  ``alloc_for_decode``): the pages they take off the free list are *fresh*;
- its ``free``, ``free_segment`` and ``free_page_ids`` (and ``free_group_end``, where a free
  group's frees take effect): the pages they put on the free list (read from the list, so
  that a free that drops a page, or puts one twice, shows), credited to the request whose
  row ``free_kv_row`` / ``insert_req`` / ``cache_unfinished_req`` is releasing, else to the
  request holding the page; the radix cache's ``evict`` is an ``evict`` of the pages it
  frees;
- the radix cache's ``insert``: the pages it adds are a ``cache``, each with the hash of its
  key (a chain of 64-bit blake2b hashes over the key's pages); ``reset`` is an ``evict`` of
  every page the tree held;
- the radix cache's ``inc_lock_ref`` / ``dec_lock_ref``: the pages under the node whose
  lock changed are observed at the step's end.

It never relies on ``ReqToTokenPool.write`` (prefill writes rows with a Triton kernel):
``step(reqs)`` reads each live request's ``req_to_token`` row (``reqs``: SGLang ``Req``s,
``rid``, ``kv.req_pool_idx``, ``kv.kv_allocated_len``, and its tokens: ``origin_input_ids``
and ``output_ids``, or ``tokens``) and writes what changed since the last step, with pages
as blocks (block_size = page_size):

- a request that left ``reqs`` is freed (``free``); one still in ``reqs`` without a row was
  retracted (``preempt``). When the pages its release put on the free list, plus those the
  radix cache keeps, are not its table once each, the op says which (``handed``): replay
  names a page kept back (``leak``) or given back twice (``double_free``), with the request;
- a new page index of a row is an ``allocate`` when an allocation took that page off the
  free list this step, else a ``share`` (a radix-cache prefix, with the hash of the
  request's tokens up to that page: replay compares it with the page's ``cache``); the
  tokens past the row's recorded length are an ``append``. A row whose recorded pages
  changed (``cache_unfinished_req`` re-pointing a chunk at the tree's copy) is written as
  ``preempt`` and its table again;
- ``observed``: each page the step touched with SGLang's own count — the ``lock_ref`` of
  the radix node holding it, else the live rows holding it, else 0 when it is free and 1
  when it is neither free, nor cached, nor in a row (a page the pool lost) — and those of
  them on the free list, a page once an entry (``free_list``).

Reads attributes only: it never imports SGLang or torch.
"""

from __future__ import annotations

import hashlib
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
        self.handed: dict[str, list[int]] = {}  # request -> pages put back on the free list
        self.loose: list[int] = []  # pages put back outside a request's release
        self.cache_ops: list[dict[str, Any]] = []  # cache / evict, in the step's order
        self.touched: set[int] = set()
        self._nested = 0
        self._context: list[tuple[str, int]] = []  # ("row", r) / ("evict", 0) being released
        self._deferred: list[tuple[tuple[str, int], list[int]]] = []  # a free group's frees
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
        if hasattr(allocator, "free_group_end"):
            self._wrap(allocator, "free_group_end", self._group_end)
        if tree_cache is not None:
            self._wrap(tree_cache, "evict", self._evict)
            self._wrap(tree_cache, "insert", self._insert)
            self._wrap(tree_cache, "reset", self._reset)
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
            context = self._context[-1] if self._context else ("loose", 0)
            self.touched.update(pages)
            if getattr(self.allocator, "free_group", None) is not None:
                self._deferred.append((context, pages))  # put back at free_group_end
                return self._nested_call(original, index, *a, **kw)
            before = self._free_pages()
            out = self._nested_call(original, index, *a, **kw)
            pushed = self._free_pages() - before
            self._credit(context, pushed, pages)
            return out

        return wrapper

    def _nested_call(self, original: Any, *a: Any, **kw: Any) -> Any:
        self._nested += 1
        try:
            return original(*a, **kw)
        finally:
            self._nested -= 1

    def _group_end(self, original: Any, *a: Any, **kw: Any) -> Any:
        """A free group's frees take effect: each deferred free is credited with what it
        put on the free list (its pages as they were pushed); the rest goes loose."""
        deferred, self._deferred = self._deferred, []
        before = self._free_pages()
        out = self._nested_call(original, *a, **kw)
        pushed = self._free_pages() - before
        for context, pages in deferred:
            mine = Counter({p: min(pushed[p], pages.count(p)) for p in set(pages)})
            pushed -= mine
            self._credit(context, mine, pages)
        self._credit(("loose", 0), pushed, [])
        return out

    def _credit(self, context: tuple[str, int], pushed: Counter[int], pages: list[int]) -> None:
        """What a free put on the free list, in the order its pages were given (a page put
        twice, twice): the evicted pages go to the radix cache's ``evict`` (as given), a
        row's release to its request, the rest to the request holding the page."""
        kind, row = context
        put = [p for p in dict.fromkeys([*pages, *pushed]) for _ in range(pushed[p])]
        if kind == "evict":
            self.cache_ops.append({"op": "evict", "blocks": pages})
        elif kind == "row" and row in self.rows:
            self.handed.setdefault(self.rows[row], []).extend(put)
        else:
            self.loose.extend(put)

    def _evict(self, original: Any, *a: Any, **kw: Any) -> Any:
        self._context.append(("evict", 0))
        try:
            return original(*a, **kw)
        finally:
            self._context.pop()

    def _insert(self, original: Any, params: Any, *a: Any, **kw: Any) -> Any:
        """The pages the radix cache adds (past the prefix it held): a ``cache`` of each
        with the hash of its key up to that page."""
        result = original(params, *a, **kw)
        key, value = getattr(params, "key", None), getattr(params, "value", None)
        done = int(getattr(result, "prefix_len", 0) or 0)
        if key is None or value is None:
            return result
        tokens = list(key.token_ids)
        whole = min(len(tokens), len(value)) // self.page_size * self.page_size
        if whole > done:
            slots = as_numpy(value).astype(np.int64)[done : whole : self.page_size]
            chain = _chain(tokens, _salt(key), self.page_size)
            first = done // self.page_size
            pages = (slots // self.page_size).tolist()
            hashes = chain[first : first + len(pages)]
            self.cache_ops.append({"op": "cache", "blocks": pages, "hashes": hashes})
        return result

    def _reset(self, original: Any, *a: Any, **kw: Any) -> Any:
        held = sorted(self._tree_pages()) if self.tree is not None else []
        out = original(*a, **kw)
        if held:
            self.cache_ops.append({"op": "evict", "blocks": held})
        return out

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
            self.ops.extend(self.cache_ops)
            self.cache_ops = []
            return super().step()
        live: dict[str, tuple[int, int, Any]] = {}
        retracted: set[str] = set()
        for req in reqs:
            kv = getattr(req, "kv", req)
            row = getattr(kv, "req_pool_idx", None)
            if row is None:
                retracted.add(str(req.rid))
            else:
                live[str(req.rid)] = (int(row), int(kv.kv_allocated_len), req)
        tree = self._tree_pages()
        self._credit_loose()
        for rid in [r for r in self.tables if r not in live]:
            if rid in retracted and self.tables[rid] == (0, []):
                continue  # retracted before, still waiting
            self._drop(rid, tree, "preempt" if rid in retracted else "free")
        self.ops.extend(self.cache_ops)  # after the frees: a page evicted had no holder
        table = as_numpy(self.rtt.req_to_token)
        self.rows = {}
        for rid, (row, tokens, req) in live.items():
            self.rows[row] = rid
            self._grow(rid, table[row, :tokens].astype(np.int64), tree, req)
        for rid, pages in self.handed.items():  # given back by a request that goes on
            if pages:
                self.ops.append({"op": "release", "req": rid, "blocks": pages})
        self._observe(tree, live, table)
        self.fresh.clear()
        self.handed.clear()
        self.cache_ops = []
        return super().step()

    def _credit_loose(self) -> None:
        """Pages put back outside a request's release, each credited to the request whose
        table holds it (a page no table holds was taken and given back within the step)."""
        holders = {p: rid for rid, (_, held) in reversed(self.tables.items()) for p in held}
        for page in self.loose:
            rid = holders.get(page)
            if rid is not None:
                self.handed.setdefault(rid, []).append(page)
        self.loose = []

    def _given_back(self, rid: str, pages: list[int], keep: set[int]) -> dict[str, Any]:
        """The request's pages given back: put on the free list (``self.handed``) or kept
        (``keep``: by the radix cache, or still in the row); ``{"handed": ...}`` when that
        is not its table once each."""
        handed = self.handed.pop(rid, [])
        kept = [p for p in pages if p in keep]
        self.touched.update(pages)
        if Counter(handed) + Counter(kept) == Counter(pages):
            return {}
        return {"handed": handed + kept}

    def _drop(self, rid: str, tree: dict[int, int], op: str) -> None:
        _, pages = self.tables.pop(rid)
        self.ops.append({"op": op, "req": rid, **self._given_back(rid, pages, set(tree))})
        if op == "preempt":
            self.tables[rid] = (0, [])

    def _grow(self, rid: str, slots: np.ndarray, tree: dict[int, int], req: Any) -> None:
        ps = self.page_size
        now = (slots[::ps] // ps).tolist()
        tokens, pages = self.tables.get(rid, (0, []))
        if pages != now[: len(pages)]:  # the row was re-pointed: its table again
            kept = self._given_back(rid, pages, set(tree) | set(now))
            self.ops.append({"op": "preempt", "req": rid, **kept})
            tokens, pages = 0, []
        chain: list[str] | None = None
        for i, page in enumerate(now[len(pages) :], start=len(pages)):
            op: dict[str, Any] = {"op": "allocate", "req": rid, "blocks": [page]}
            if self.fresh[page] > 0:
                self.fresh[page] -= 1
            else:
                op["op"] = "share"
                if page in tree:  # a radix-cache prefix: the hash its tokens ask for
                    chain = _request_chain(req, ps) if chain is None else chain
                    if i < len(chain):
                        op["hashes"] = [chain[i]]
            self.ops.append(op)
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

    def _observe(
        self, tree: dict[int, int], live: dict[str, tuple[int, int, Any]], table: Any
    ) -> None:
        if not self.touched or not self.ops:
            self.touched = set()
            return
        ps = self.page_size
        in_rows: Counter[int] = Counter()
        for row, tokens, _ in live.values():
            in_rows.update(set((table[row, :tokens].astype(np.int64) // ps).tolist()))
        free = self._free_pages()
        counts: dict[str, int] = {}
        listed: list[int] = []
        for page in sorted(self.touched - {0}):
            if page in tree:
                counts[str(page)] = tree[page]
            elif in_rows[page]:
                counts[str(page)] = in_rows[page]
            else:
                counts[str(page)] = 0 if free[page] else 1
            listed += [page] * free[page]
        self.touched = set()
        observed: dict[str, Any] = {"op": "observe", "ref_cnt": counts}
        if listed:
            observed["free_list"] = listed
        self.ops.append(observed)


def _salt(key: Any) -> str:
    """What a radix key holds beside its tokens (SGLang's ``extra_key``, ``cache_salt``)."""
    return f"{getattr(key, 'extra_key', None)}|{getattr(key, 'cache_salt', None)}"


def _chain(tokens: list[int], salt: str, page_size: int) -> list[str]:
    """The hash of each whole page of ``tokens`` with everything before it: a chain of
    64-bit blake2b hashes, as the log writes them (16 hex digits)."""
    out: list[str] = []
    h = hashlib.blake2b(salt.encode(), digest_size=8).digest()
    for start in range(0, len(tokens) - page_size + 1, page_size):
        page = np.asarray(tokens[start : start + page_size], dtype=np.int64).tobytes()
        h = hashlib.blake2b(h + page, digest_size=8).digest()
        out.append(h.hex())
    return out


def _request_chain(req: Any, page_size: int) -> list[str]:
    """The chain of a request's tokens (``origin_input_ids`` + ``output_ids``, or
    ``tokens``), salted as its radix keys are."""
    if hasattr(req, "origin_input_ids"):
        tokens = list(req.origin_input_ids) + list(getattr(req, "output_ids", ()))
    else:
        tokens = list(getattr(req, "tokens", ()))
    return _chain(tokens, _salt(req), page_size)
