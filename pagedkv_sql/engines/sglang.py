"""SGLang's paged KV cache (srt/mem_cache/memory_pool.py, allocator/paged.py,
radix_cache.py; checked against SGLang 0.5.21).

``ReqToTokenPool.req_to_token`` int32 ``[size + 1, max_context_len]`` holds each request
row's KV slot per token position (row 0 is padding; ``free_slots`` are the rows not in
use); ``PagedTokenToKVPoolAllocator`` hands out whole pages: page = slot // page_size,
pages ``1 .. num_pages`` (page 0, slot 0, is reserved for padded writes), the free ones in
``free_pages`` (plus ``staged_pages`` waiting to be merged: ``get_all_free_pages()``);
``MHATokenToKVPool.k_buffer[layer]`` / ``v_buffer[layer]`` are ``[slots, heads, dim]``.
A ``RadixCache`` node holds the slots of a cached prefix in ``value`` and a ``lock_ref``
(running requests using it).

A snapshot holds, for the n live rows:

- ``req_to_token`` int32 ``[n, max_len]``, ``seq_lens`` int64 ``[n]`` (tokens each row
  holds), ``req_pool_indices`` int64 ``[n]`` (the rows' indices in the pool: each row's
  ``seq_id``, so that a join on SGLang's ``req_pool_idx`` reads that request; without it,
  the rows are numbered 0..n-1);
- ``free_pages`` int64, in the allocator's order;
- ``tree_pages`` / ``tree_lock_ref`` int64 (each page a radix-tree node holds, with the
  node's lock_ref), when a tree cache was given: then every page is accounted for
  (diag_engine_leak, diag_engine_tree_page_free, diag_engine_lock_ref);
- meta: ``page_size``, ``num_pages``, ``request_ids``.

``capture`` reads attributes only; it never imports SGLang or torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..errors import InputError, UsageError
from ..kv_groups import FULL_ATTENTION, MAMBA
from . import groups as snapshot_groups
from . import sglang_mamba, sglang_swa
from .fastcheck import row_codes
from .snapshot import CacheTensor, Snapshot, as_numpy
from .tables import EngineState, Pool, free_queue_table, table

NAME = "sglang"
RESERVED_PAGE = 0


def capture(
    req_to_token_pool: Any,
    allocator: Any,
    tree_cache: Any = None,
    *,
    reqs: Iterable[Any] | None = None,
    seq_lens: Mapping[int, int] | None = None,
    request_ids: Mapping[int, str] | None = None,
    sliding_window_size: int | None = None,
) -> Snapshot:
    """Snapshot SGLang's request-to-token pool, its paged allocator and (optionally) its
    radix cache (``RadixCache``, or ``UnifiedRadixCache``); with the sliding-window
    allocator (``SWATokenToKVPoolAllocator``), both its pools and the mapping
    (engines/sglang_swa.py; the window is the tree's ``sliding_window_size``, or give it).

    The pool does not record how many tokens a row holds: give either ``reqs`` (SGLang
    ``Req`` objects: ``rid``, ``kv.req_pool_idx``, ``kv.kv_allocated_len``) or
    ``seq_lens`` (row -> tokens, with ``request_ids`` row -> id, else the row number)."""
    pure = sglang_swa.is_pure(allocator)
    freed: list[tuple[int, int]] = []  # each row's positions its window freed
    if reqs is not None:
        rows, lens, ids = [], [], []
        for req in reqs:
            kv = getattr(req, "kv", req)
            if getattr(kv, "req_pool_idx", None) is None:
                continue  # not holding a row
            rows.append(int(kv.req_pool_idx))
            lens.append(int(kv.kv_allocated_len))
            ids.append(str(req.rid))
            freed.append(sglang_swa.window_freed(req, int(allocator.page_size)))
    elif pure:
        raise UsageError(
            "sglang.capture of an all-sliding-window cache (PureSWATokenToKVPoolAllocator) "
            "needs the requests: pass reqs=[...] (SGLang Req objects)",
            hint="its req_to_token keeps the slots the window freed; only each Req says "
            "which those are",
        )
    elif seq_lens is not None:
        rows = [int(r) for r in seq_lens]
        lens = [int(seq_lens[r]) for r in seq_lens]
        names = request_ids or {}
        ids = [str(names.get(r, r)) for r in rows]
    else:
        raise UsageError(
            "sglang.capture needs each row's length: pass reqs=[...] (SGLang Req objects) "
            "or seq_lens={row: tokens}",
            hint="ReqToTokenPool does not record how many positions of a row are in use",
        )
    full = sglang_swa.full_allocator(allocator)
    table_ = as_numpy(req_to_token_pool.req_to_token, "req_to_token")
    width = max(lens, default=0)
    arrays: dict[str, Any] = {
        "req_to_token": np.ascontiguousarray(table_[rows, :width]).astype(np.int32, copy=False),
        "seq_lens": np.array(lens, dtype=np.int64),
        "req_pool_indices": np.array(rows, dtype=np.int64),
        "free_pages": as_numpy(full.get_all_free_pages(), "free_pages").astype(np.int64),
    }
    page_size = int(allocator.page_size)
    meta: dict[str, Any] = {
        "page_size": page_size,
        "num_pages": sglang_swa.num_pages(full),
        "request_ids": ids,
        "free_rows": [int(r) for r in req_to_token_pool.free_slots],
    }
    if pure:
        sglang_swa.capture_pure(arrays, meta, tree_cache, sliding_window_size, freed)
    elif sglang_swa.is_swa(allocator):
        sglang_swa.capture_swa(arrays, meta, allocator, tree_cache, sliding_window_size)
    if sglang_mamba.is_mamba(req_to_token_pool):
        sglang_mamba.capture_mamba(arrays, meta, req_to_token_pool, tree_cache, rows)
        groups = meta.setdefault(
            "kv_cache_groups", [{"kind": FULL_ATTENTION, "block_size": page_size}]
        )
        groups.append({"kind": MAMBA, "block_size": page_size})
    if tree_cache is not None and getattr(tree_cache, "is_chunk_cache", lambda: False)():
        pass  # a ChunkCache (the radix cache disabled) keeps no page beyond the rows'
    elif tree_cache is not None and hasattr(tree_cache, "tree_core"):
        arrays.update(sglang_swa.unified_tree_pages(tree_cache, arrays, page_size))
    elif tree_cache is not None:
        pages, locks = tree_pages(tree_cache, page_size)
        arrays["tree_pages"] = pages
        arrays["tree_lock_ref"] = locks
    kvcache = allocator.get_kvcache()
    tensors = cache_tensors(getattr(kvcache, "full_kv_pool", kvcache))
    swa_kv = getattr(kvcache, "swa_kv_pool", None)
    if pure:  # its one pool is the SWA pool's
        tensors = cache_tensors(swa_kv)
    elif sglang_swa.is_swa(allocator) and swa_kv is not None:
        tensors += cache_tensors(swa_kv, sglang_swa.SWA_POOL)
    return Snapshot(NAME, arrays, meta, tensors, source="<sglang capture>")


def assert_consistent(
    req_to_token_pool: Any,
    allocator: Any,
    tree_cache: Any = None,
    *,
    reqs: Iterable[Any] | None = None,
    seq_lens: Mapping[int, int] | None = None,
    request_ids: Mapping[int, str] | None = None,
    sliding_window_size: int | None = None,
) -> None:
    """For SGLang's own tests: capture the pools (arguments as for ``capture``; give the
    ``tree_cache`` to account for every page) and check every engine invariant in memory
    (``check_snapshot``). Raises ``AssertionError`` naming each finding's request and page
    ids, or saying why the state cannot be mapped."""
    from .fastcheck import assert_captured

    assert_captured(
        "SGLang KV cache",
        lambda: capture(
            req_to_token_pool,
            allocator,
            tree_cache,
            reqs=reqs,
            seq_lens=seq_lens,
            request_ids=request_ids,
            sliding_window_size=sliding_window_size,
        ),
    )


def tree_pages(tree_cache: Any, page_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Every page a radix-tree node holds, with that node's lock_ref (a page is in one
    node: nodes split on page boundaries)."""
    pages: list[np.ndarray] = []
    locks: list[np.ndarray] = []
    stack = [tree_cache.root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node is tree_cache.root_node or node.value is None:
            continue
        slots = as_numpy(node.value, "node.value").astype(np.int64)
        held = np.unique(slots // page_size)
        pages.append(held)
        locks.append(np.full(held.size, int(node.lock_ref), dtype=np.int64))
    if not pages:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(pages), np.concatenate(locks)


def cache_tensors(kvcache: Any, pool: int = 0) -> list[CacheTensor]:
    """The per-layer K and V buffers of an MHATokenToKVPool, ``[slots, heads, dim]``
    (``pool`` 1: the SWA pool's, named ``swa.k_buffer.N``)."""
    out: list[CacheTensor] = []
    prefix = "swa." if pool else ""
    for kv, name in enumerate(("k_buffer", "v_buffer")):
        buffers = getattr(kvcache, name, None)
        for layer, tensor in enumerate(buffers or ()):
            out.append(
                CacheTensor.of(
                    f"{prefix}{name}.{layer}",
                    tensor,
                    ("token", "head", "dim"),
                    kv=kv,
                    layer=layer,
                    pool=pool,
                )
            )
    return out


# -- import ---------------------------------------------------------------------------------
def to_state(snap: Snapshot, *, convert: bool = False) -> EngineState:
    """Check an SGLang snapshot and map it to the engine tables (docs/engines.md)."""
    snap.check_meta()
    page_size = snap.block_size
    rtt = snap.integers(
        "req_to_token", ndim=2, dtypes=("int32",), convert=("int64",) if convert else ()
    )
    rows, width = rtt.shape
    lens = snap.counted("seq_lens", rows, "req_to_token row(s)")
    snap.refuse(
        "seq_lens",
        (lens < 0) | (lens > width),
        lambda i: f"[{i}] = {lens[i]} is outside [0, {width}] (req_to_token's width)",
    )
    if "req_pool_indices" in snap.arrays:
        pool_rows = snap.counted("req_pool_indices", rows, "req_to_token row(s)")
        _, first_use = np.unique(pool_rows, return_index=True)
        again = np.ones(rows, dtype=bool)
        again[first_use] = False
        snap.refuse(
            "req_pool_indices",
            (pool_rows < 0) | again,
            lambda i: (
                f"[{i}] = {pool_rows[i]} is negative"
                if pool_rows[i] < 0
                else f"[{i}] = {pool_rows[i]} names a pool row an earlier row names too"
            ),
            hint="req_pool_indices are the rows' indices in ReqToTokenPool: one a row",
        )
    else:
        pool_rows = np.arange(rows, dtype=np.int64)
    ids = snap.request_ids or [str(r) for r in pool_rows]
    if len(ids) != rows:
        raise InputError(f"{snap.source}: metadata has {len(ids)} request id(s) for {rows} row(s)")
    held = np.arange(width)[None, :] < lens[:, None]
    seq, pos = np.nonzero(held)
    slots = rtt[seq, pos]
    num_pages = snap.meta.get("num_pages")
    limit = None if num_pages is None else (int(num_pages) + 1) * page_size
    snap.refuse(
        "req_to_token",
        (slots < 0) | (slots >= limit if limit is not None else slots < 0),
        lambda i: (
            f"[{seq[i]}, {pos[i]}] = {slots[i]} is outside the pool's slots "
            f"[0, {limit}) (request {ids[seq[i]]!r})"
        ),
    )
    seq_ids = pool_rows[seq]  # a request's seq_id is its req_pool_idx
    token_slots = table("engine_token_slot", seq_id=seq_ids, token_pos=pos, slot=slots)
    # a row's logical blocks: the distinct (position's block, slot's page) pairs, so a
    # block whose tokens sit on two pages shows up twice (diag_conflicting_location)
    columns = [seq_ids, pos // page_size, slots // page_size]
    _, first = np.unique(row_codes(columns), return_index=True)  # sorted as the rows
    block_table = table(
        "engine_block_table",
        seq_id=columns[0][first],
        group_id=np.zeros(first.size, dtype=np.int64),
        block_index=columns[1][first],
        pool_id=np.zeros(first.size, dtype=np.int64),
        block_id=columns[2][first],
    )
    requests = table(
        "engine_request",
        seq_id=pool_rows,
        request_id=ids,
        engine_row=pool_rows,
        num_tokens=lens,
    )
    page_ids = [RESERVED_PAGE]
    lock_ref: list[int | None] = [None]
    if "tree_pages" in snap.arrays:
        tree = snap.integers("tree_pages", ndim=1, dtypes=("int64", "int32"))
        locks = snap.counted("tree_lock_ref", tree.size, "tree page(s)", ("int64", "int32"))
        page_ids += tree.tolist()
        lock_ref += locks.tolist()
    blocks = table(
        "engine_block",
        pool_id=np.zeros(len(page_ids), dtype=np.int64),
        block_id=page_ids,
        lock_ref=lock_ref,
        is_null=[i == 0 for i in range(len(page_ids))],
    )
    free = free_queue_table(snap, "free_pages", ("int64", "int32"))
    # the radix tree recorded: every page is then accounted for (free, tree or held)
    info = {"tree_pages": "recorded"} if "tree_pages" in snap.arrays else {}
    pool = Pool.from_tensors(0, "kv_pool", snap.cache_tensors, page_size)
    if num_pages is not None:  # pages 0 (reserved) .. num_pages
        pool = dataclasses.replace(pool, num_blocks=int(num_pages) + 1)
    state = EngineState(
        NAME,
        page_size,
        requests,
        block_table,
        [pool],
        blocks=blocks,
        free_blocks=free,
        token_slots=token_slots,
        cache_tensors=list(snap.cache_tensors),
        info=info,
    )
    if "full_to_swa" in snap.arrays:  # the sliding-window pool: pool 1, group 1
        swa = sglang_swa.SWATables(snap, seq_ids, pos, slots, ids, seq)
        state.block_table = sglang_swa.concat(state.block_table, swa.block_table)
        state.blocks = sglang_swa.concat(state.blocks, swa.blocks)
        state.free_blocks = sglang_swa.concat(state.free_blocks, swa.free)
        tensors = Pool.from_tensors(swa.pool.pool_id, swa.pool.name, snap.cache_tensors, page_size)
        state.pools.append(dataclasses.replace(tensors, num_blocks=swa.pool.num_blocks))
    kinds = [str(g.get("kind")) for g in snap.meta.get("kv_cache_groups") or []]
    if "mamba_slots" in snap.arrays:  # the Mamba state slots: the next pool, a mamba group
        group = kinds.index(MAMBA) if MAMBA in kinds else len(kinds)
        mamba = sglang_mamba.MambaTables(snap, pool_rows, len(state.pools), group)
        state.block_table = sglang_swa.concat(state.block_table, mamba.block_table)
        state.blocks = sglang_swa.concat(state.blocks, mamba.blocks)
        state.free_blocks = sglang_swa.concat(state.free_blocks, mamba.free)
        state.pools.append(mamba.pool)
    if kinds:
        state.kv_groups = snapshot_groups.read(snap, len(kinds)).table()
    return state
