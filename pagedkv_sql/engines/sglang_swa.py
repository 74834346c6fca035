"""SGLang's sliding-window (SWA) hybrid cache and its unified radix tree
(srt/mem_cache/allocator/swa.py, swa_memory_pool.py, unified_radix_cache.py; SGLang 0.5.21
and 0.5.23).

``SWATokenToKVPoolAllocator`` is two paged allocators, ``full_attn_allocator`` (the
full-attention layers' pool) and ``swa_attn_allocator`` (the sliding-window layers'), each
with its own slot and page ids (page 0 of each reserved), and ``full_to_swa_index_mapping``:
full slot -> SWA slot, 0 where the full slot has no SWA peer (never allocated, or freed
from the window: ``free_swa``). ``req_to_token`` holds full slots; a row's SWA slots are
read through the mapping. A request's SWA pages before its window are freed as it decodes
(``free_swa_out_of_window_slots``): their mapping goes to 0.

A snapshot of such a cache adds to engines/sglang.py's arrays:

- ``full_to_swa`` int64: the mapping (without its trailing ``-1`` sentinel);
- ``swa_free_pages`` int64: the SWA allocator's free pages, in its order;
- ``tree_swa_pages`` / ``tree_swa_lock_ref`` int64: the SWA pages the radix tree holds
  (with a radix tree);
- meta ``swa_num_pages`` and ``kv_cache_groups`` (group 0 full_attention, group 1
  sliding_window with its window).

On import the SWA pages are pool 1 (the full pool's pages stay pool 0): the two id spaces
never meet, and every pool-wise invariant (free list, conservation, held-and-free,
outside the pool) holds per pool. Group 1's block list is each row's SWA page per block,
page 0 (the SWA pool's reserved page) where the window dropped it: a placeholder, the
null block of pool 1 (docs/engines.md, "SGLang sliding window").

``PureSWATokenToKVPoolAllocator`` (a model whose every layer slides; page size 1) is one
pool: its full allocator is its SWA allocator, and with no mapping to clear ``req_to_token``
keeps the slots the window freed. Its snapshot is a plain one with one ``sliding_window``
group, the positions each request's window freed (``window_freed``) written as slot 0.

``UnifiedRadixCache`` keeps its nodes in a tree core (Rust by default) that shows them only
through ``walk_for_kv_canary``: every full slot a node holds, whether its lock is 0, and
whether its SWA value is resident. ``capture`` reads the tree that way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from ..kv_groups import FULL_ATTENTION, SLIDING_WINDOW, WINDOW_KEYS
from .snapshot import Snapshot, as_numpy
from .tables import Pool, table

SWA_POOL = 1
SWA_GROUP = 1


def is_swa(allocator: Any) -> bool:
    """Whether ``allocator`` is SGLang's SWA allocator (two pools and a mapping)."""
    return hasattr(allocator, "full_to_swa_index_mapping") and hasattr(
        allocator, "swa_attn_allocator"
    )


def is_pure(allocator: Any) -> bool:
    """Whether ``allocator`` is SGLang's all-sliding-window allocator
    (``PureSWATokenToKVPoolAllocator``: one pool, its full side the SWA side itself)."""
    return is_swa(allocator) and allocator.full_attn_allocator is allocator.swa_attn_allocator


def window_freed(req: Any, page_size: int) -> tuple[int, int]:
    """The positions ``[lo, hi)`` of a request's row its window freed: ``hi`` its SWA
    cursor (``kv.get_evicted_seqlen(ComponentType.SWA)``, read without importing SGLang),
    ``lo`` the lowest position it frees itself (``kv.swa_dead_lo``: above the prefix the
    radix tree owns and the span it keeps for the tree), so the positions before ``lo``
    keep their slots even once the cursor has passed them."""
    kv = getattr(req, "kv", req)
    cursors = getattr(kv, "component_evicted_seqlens", None) or {}
    hi = int(next((v for k, v in cursors.items() if getattr(k, "name", k) == "SWA"), 0))
    dead_lo = getattr(kv, "swa_dead_lo", None)
    lo = int(dead_lo(page_size)) if dead_lo is not None else 0
    return min(lo, hi), hi


def full_allocator(allocator: Any) -> Any:
    """The allocator of the full-attention pool: the SWA allocator's full one, else the
    allocator itself."""
    return allocator.full_attn_allocator if is_swa(allocator) else allocator


def num_pages(allocator: Any) -> int:
    return int(getattr(allocator, "num_pages", allocator.size // allocator.page_size))


def window_tokens(sliding_window_size: int) -> int:
    """The group's window W (positions [n - W + 1, n) of n are kept) of SGLang's
    ``sliding_window_size``, which is the attention's ``window_left``: a query sees that
    many tokens before it and itself (Gemma's ``sliding_window - 1``)."""
    return int(sliding_window_size) + 1


def _window(tree_cache: Any, sliding_window_size: int | None) -> int:
    """SGLang's ``sliding_window_size``: given, or the tree cache's."""
    window = sliding_window_size
    if window is None and tree_cache is not None:
        window = getattr(tree_cache, "sliding_window_size", None)
    if window is None:
        from ..errors import UsageError

        raise UsageError(
            "sglang.capture of a sliding-window cache needs its window: pass "
            "sliding_window_size=... (the model runner's), or the radix tree",
            hint="the allocator does not record the window; the tree does",
        )
    return int(window)


def capture_pure(
    arrays: dict[str, Any],
    meta: dict[str, Any],
    tree_cache: Any,
    sliding_window_size: int | None,
    freed: list[tuple[int, int]],
) -> None:
    """An all-sliding-window cache (``is_pure``): one pool (pool 0, the SWA allocator's)
    and one sliding-window group. ``req_to_token`` keeps the slots its window freed (there
    is no mapping to clear), so the positions each row's window freed (``freed``, the
    rows' order: ``window_freed``) read as placeholders (slot 0)."""
    window = _window(tree_cache, sliding_window_size)
    rtt = arrays["req_to_token"]
    for row, (lo, hi) in enumerate(freed):
        rtt[row, lo : min(hi, rtt.shape[1])] = 0
    page_size = int(meta["page_size"])
    meta["kv_cache_groups"] = [
        {
            "kind": SLIDING_WINDOW,
            "block_size": page_size,
            WINDOW_KEYS[SLIDING_WINDOW]: window_tokens(window),
        }
    ]


def capture_swa(
    arrays: dict[str, Any],
    meta: dict[str, Any],
    allocator: Any,
    tree_cache: Any,
    sliding_window_size: int | None,
) -> None:
    """Add the SWA pool, the mapping and the groups to a snapshot's ``arrays`` / ``meta``
    (``req_to_token`` and ``seq_lens`` already in ``arrays``)."""
    page_size = int(allocator.page_size)
    mapping = as_numpy(allocator.full_to_swa_index_mapping, "full_to_swa_index_mapping")
    mapping = mapping.astype(np.int64)[:-1]  # the trailing -1 (a last_loc of -1) dropped
    swa = allocator.swa_attn_allocator
    window = _window(tree_cache, sliding_window_size)
    arrays["full_to_swa"] = mapping
    arrays["swa_free_pages"] = as_numpy(swa.get_all_free_pages(), "swa_free_pages").astype(np.int64)
    meta["swa_num_pages"] = num_pages(swa)
    meta["kv_cache_groups"] = [
        {"kind": FULL_ATTENTION, "block_size": page_size},
        {
            "kind": SLIDING_WINDOW,
            "block_size": page_size,
            WINDOW_KEYS[SLIDING_WINDOW]: window_tokens(int(window)),
        },
    ]


def held_pages(arrays: dict[str, Any], page_size: int, mapping: np.ndarray | None) -> np.ndarray:
    """The pages the rows hold, once per (row, page): full pages, or through ``mapping``
    the SWA pages (page 0, a dropped one, left out)."""
    rtt, lens = arrays["req_to_token"], arrays["seq_lens"]
    held = np.arange(rtt.shape[1])[None, :] < lens[:, None]
    row, _ = np.nonzero(held)
    slots = rtt[held].astype(np.int64)
    if mapping is not None:
        slots = mapping[np.clip(slots, 0, mapping.size - 1)]
    pages = slots // page_size
    keep = pages > 0
    pairs: np.ndarray = np.unique(np.stack([row[keep], pages[keep]]), axis=1)
    return np.asarray(pairs[1], dtype=np.int64)


def unified_tree_pages(
    tree_cache: Any, arrays: dict[str, Any], page_size: int
) -> dict[str, np.ndarray]:
    """The pages a ``UnifiedRadixCache`` holds, from its tree core's walk: the full pages
    with their lock (``lock_ref`` = the running rows that hold the page when the node is
    locked, at least 1; 0 when not: the walk tells locked from unlocked, not the count),
    and with an SWA component, the SWA pages of the nodes whose SWA value is resident.
    An SWA node's lock is not judged: SGLang may drop a running request's SWA lock once
    its window has passed the node, so its lock_ref is its holders'."""
    core = tree_cache.tree_core
    every = as_numpy(core.walk_for_kv_canary(False, False).slot_indices, "tree").astype(np.int64)
    unlocked = as_numpy(core.walk_for_kv_canary(True, False).slot_indices, "tree")
    pages = np.unique(every // page_size)
    free_pages = np.unique(unlocked.astype(np.int64) // page_size)
    holders = _count(held_pages(arrays, page_size, None), pages)
    locked = ~np.isin(pages, free_pages)
    out = {
        "tree_pages": pages,
        "tree_lock_ref": np.where(locked, np.maximum(holders, 1), 0).astype(np.int64),
    }
    mapping = arrays.get("full_to_swa")
    if mapping is not None:
        resident = as_numpy(core.walk_for_kv_canary(False, True).slot_indices, "tree")
        slots = mapping[np.clip(resident.astype(np.int64), 0, mapping.size - 1)]
        swa_pages = np.unique(slots // page_size)
        swa_pages = swa_pages[swa_pages > 0]
        out["tree_swa_pages"] = swa_pages
        out["tree_swa_lock_ref"] = _count(held_pages(arrays, page_size, mapping), swa_pages)
    return out


def _count(values: np.ndarray, of: np.ndarray) -> np.ndarray:
    """How many times each of ``of`` occurs in ``values``."""
    found, counts = np.unique(values, return_counts=True)
    lookup = dict(zip(found.tolist(), counts.tolist(), strict=True))
    return np.array([lookup.get(v, 0) for v in of.tolist()], dtype=np.int64)


# -- import ---------------------------------------------------------------------------------
class SWATables:
    """The SWA pool's share of the engine tables: group 1's block list, pool 1's blocks
    (its reserved page 0 and the tree's pages), free list and pool, and the groups."""

    def __init__(
        self,
        snap: Snapshot,
        seq_ids: np.ndarray,
        pos: np.ndarray,
        slots: np.ndarray,
        ids: list[str],
        seq: np.ndarray,
    ) -> None:
        from .fastcheck import row_codes

        page_size = snap.block_size
        mapping = snap.integers("full_to_swa", ndim=1, dtypes=("int64",))
        snap.refuse(
            "req_to_token",
            slots >= mapping.size,
            lambda i: (
                f"[{seq[i]}, {pos[i]}] = {slots[i]} has no entry in full_to_swa "
                f"({mapping.size} slots; request {ids[seq[i]]!r})"
            ),
        )
        swa_slots = mapping[slots]
        columns = [seq_ids, pos // page_size, swa_slots // page_size]
        _, first = np.unique(row_codes(columns), return_index=True)
        self.block_table = table(
            "engine_block_table",
            seq_id=columns[0][first],
            group_id=np.full(first.size, SWA_GROUP, dtype=np.int64),
            block_index=columns[1][first],
            pool_id=np.full(first.size, SWA_POOL, dtype=np.int64),
            block_id=columns[2][first],
        )
        page_ids: list[int] = [0]
        locks: list[int | None] = [None]
        if "tree_swa_pages" in snap.arrays:
            tree = snap.integers("tree_swa_pages", ndim=1, dtypes=("int64", "int32"))
            lock = snap.counted("tree_swa_lock_ref", tree.size, "tree SWA page(s)", ("int64",))
            page_ids += tree.tolist()
            locks += lock.tolist()
        self.blocks, self.free = pool_tables(snap, SWA_POOL, page_ids, locks, "swa_free_pages")
        count = snap.meta.get("swa_num_pages")
        self.pool = Pool(SWA_POOL, "swa_pool", num_blocks=None if count is None else count + 1)


def pool_tables(
    snap: Snapshot, pool_id: int, ids: list[int], locks: list[int | None], free_name: str
) -> tuple[pa.Table, pa.Table]:
    """A pool's ``engine_block`` (its reserved id 0, the null block, then the tree's ids with
    their ``lock_ref``) and ``engine_free_block`` (the snapshot's array ``free_name``)."""
    blocks = table(
        "engine_block",
        pool_id=np.full(len(ids), pool_id, dtype=np.int64),
        block_id=ids,
        lock_ref=locks,
        is_null=[i == 0 for i in range(len(ids))],
    )
    free = snap.integers(free_name, ndim=1, dtypes=("int64", "int32"))
    return blocks, table(
        "engine_free_block",
        pool_id=np.full(free.size, pool_id, dtype=np.int64),
        position=np.arange(free.size, dtype=np.int64),
        block_id=free,
    )


def concat(a: pa.Table | None, b: pa.Table) -> pa.Table:
    return b if a is None else pa.concat_tables([a, b])
