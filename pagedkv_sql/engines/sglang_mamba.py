"""SGLang's Mamba state slots (srt/mem_cache/memory_pool.py ``HybridReqToTokenPool``,
allocator/mamba.py ``MambaSlotAllocator``, unified_radix_cache.py with the MAMBA component;
SGLang 0.5.21 and 0.5.23).

A hybrid model's request row has, beside its KV slots in ``req_to_token``, one slot of the
``MambaPool`` (its recurrent state): ``req_index_to_mamba_index_mapping[row]``. The
``MambaSlotAllocator`` hands out slots ``1 .. size`` (slot 0 is reserved: the dummy write
target of padded tokens) from ``free_slots``; a finished request's state can be kept by the
radix tree (``all_mamba_values_flatten``), a later request's hit copies it into a slot of
its own.

A snapshot adds ``mamba_slots`` int64 (each captured row's slot), ``mamba_free_slots`` int64
(the allocator's free list, in its order), ``tree_mamba_slots`` int64 (the tree's, with a
radix tree) and meta ``mamba_num_slots``. On import the slots are a pool of their own
(``mamba_pool``, the next pool id) and each row's slot the one entry of a ``mamba`` group
(the next group id): slots hold a state, not tokens, so only the ownership invariants
apply (a slot held and free, free twice, held by no one and not free: a leak, outside the
pool); slot 0 is the pool's null block.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .sglang_swa import pool_tables
from .snapshot import Snapshot, as_numpy
from .tables import Pool, table


def is_mamba(req_to_token_pool: Any) -> bool:
    """Whether the request pool is SGLang's ``HybridReqToTokenPool`` (rows with a Mamba
    state slot)."""
    return hasattr(req_to_token_pool, "req_index_to_mamba_index_mapping") and hasattr(
        req_to_token_pool, "mamba_allocator"
    )


def capture_mamba(
    arrays: dict[str, Any],
    meta: dict[str, Any],
    req_to_token_pool: Any,
    tree_cache: Any,
    rows: list[int],
) -> None:
    """Add the Mamba slots of the captured ``rows``, the free list and the tree's slots to
    a snapshot's ``arrays`` / ``meta``."""
    mapping = as_numpy(req_to_token_pool.req_index_to_mamba_index_mapping, "mamba mapping")
    allocator = req_to_token_pool.mamba_allocator
    arrays["mamba_slots"] = mapping.astype(np.int64)[rows]
    arrays["mamba_free_slots"] = as_numpy(allocator.free_slots, "mamba_free_slots").astype(np.int64)
    meta["mamba_num_slots"] = int(allocator.size)
    core = getattr(tree_cache, "tree_core", None)
    if core is not None:
        held = as_numpy(core.all_mamba_values_flatten(), "tree mamba values")
        arrays["tree_mamba_slots"] = np.unique(held.astype(np.int64))


class MambaTables:
    """The Mamba pool's share of the engine tables: a ``mamba`` group's one entry a row,
    the pool's slots (its reserved slot 0 and the tree's, each with its holders as
    ``lock_ref``: a state the tree keeps is never a running row's), free list and pool."""

    def __init__(self, snap: Snapshot, pool_rows: np.ndarray, pool_id: int, group_id: int) -> None:
        slots = snap.counted("mamba_slots", pool_rows.size, "req_to_token row(s)", ("int64",))
        self.block_table = table(
            "engine_block_table",
            seq_id=pool_rows,
            group_id=np.full(slots.size, group_id, dtype=np.int64),
            block_index=np.zeros(slots.size, dtype=np.int64),
            pool_id=np.full(slots.size, pool_id, dtype=np.int64),
            block_id=slots,
        )
        ids: list[int] = [0]
        locks: list[int | None] = [None]
        if "tree_mamba_slots" in snap.arrays:
            tree = snap.integers("tree_mamba_slots", ndim=1, dtypes=("int64",))
            held = {int(s): int((slots == s).sum()) for s in tree.tolist()}
            ids += tree.tolist()
            locks += [held[int(s)] for s in tree.tolist()]
        self.blocks, self.free = pool_tables(snap, pool_id, ids, locks, "mamba_free_slots")
        count = snap.meta.get("mamba_num_slots")
        self.pool = Pool(pool_id, "mamba_pool", num_blocks=None if count is None else count + 1)
