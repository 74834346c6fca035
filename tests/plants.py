"""The plants of the conformance suite (tests/test_invariants.py): each idea of the catalogue
planted once, told in the input of every model that claims it (tests/conformance.py runs
the models)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from pagedkv_sql.engines import Snapshot
from pagedkv_sql.engines.tables import EngineState, Pool, table

from . import fleet_fixtures
from .conformance import (
    BASE,
    BASE_TABLES,
    BASE_TOKENS,
    BLOCK,
    POOL,
    Plant,
    alloc,
    append,
    engine_state,
)

# format version 2: the witness (a free's handed blocks, the cache op, a share's hashes)
V2_HEADER = {"pagedkv_step_log": 2, "block_size": 4, "num_gpu_blocks": 10, "reserved_blocks": [0]}
# two KV-cache groups: full attention (the primary) and a sliding window of 8 tokens
HYBRID_HEADER = {
    **V2_HEADER,
    "groups": [
        {"kind": "full_attention", "block_size": 4},
        {"kind": "sliding_window", "block_size": 4, "sliding_window": 8},
    ],
}
HASH_AA, HASH_CC, HASH_DD = "00000000000000aa", "00000000000000cc", "00000000000000dd"


# -- the plants: each idea once --------------------------------------------------------------
def _sglang_leak() -> Snapshot:
    """SGLang, page size 4: r1's 6 tokens on pages 1, 2; page 5 neither free, in the tree
    nor held: leaked."""
    rtt = np.zeros((1, 8), dtype=np.int32)
    rtt[0, :6] = np.r_[4:10]
    arrays: dict[str, Any] = {
        "req_to_token": rtt,
        "seq_lens": np.array([6], dtype=np.int64),
        "req_pool_indices": np.array([0], dtype=np.int64),
        "free_pages": np.array([3, 4, 6, 7, 8, 9], dtype=np.int64),
        "tree_pages": np.array([], dtype=np.int64),
        "tree_lock_ref": np.array([], dtype=np.int64),
    }
    return Snapshot(
        "sglang", arrays, {"page_size": BLOCK, "num_pages": POOL - 1, "request_ids": ["r1"]}
    )


def _sglang_wrong_offset() -> Snapshot:
    """SGLang, page size 4: r1's token 1 in slot 6, offset 2 of page 1, not offset 1."""
    rtt = np.zeros((1, 8), dtype=np.int32)
    rtt[0, :3] = [4, 6, 5]
    arrays: dict[str, Any] = {
        "req_to_token": rtt,
        "seq_lens": np.array([3], dtype=np.int64),
        "req_pool_indices": np.array([0], dtype=np.int64),
    }
    return Snapshot("sglang", arrays, {"page_size": BLOCK, "request_ids": ["r1"]})


def _vllm_wrong_hash() -> Snapshot:
    """r2 asked for the prefix hashes aa, dd; its block 3 holds cc."""
    arrays: dict[str, Any] = {
        "block_table": np.array([[1, 2], [1, 3]], dtype=np.int32),
        "num_blocks_per_row": np.array([2, 2], dtype=np.int32),
        "num_tokens": np.array([8, 8], dtype=np.int64),
        "ref_cnt": np.array([0, 2, 1, 1, 0, 0, 0, 0, 0, 0], dtype=np.int32),
        "free_block_queue": np.array([4, 5, 6, 7, 8, 9], dtype=np.int32),
    }
    meta = {
        "block_size": BLOCK,
        "request_ids": ["r1", "r2"],
        "num_blocks": POOL,
        "block_hashes": {"1": "aa", "2": "bb", "3": "cc"},
        "request_block_hashes": [[["aa", "bb"], ["aa", "dd"]]],
    }
    return Snapshot("vllm", arrays, meta)


def _vllm_window_hole() -> Snapshot:
    """vLLM, a full-attention group and a sliding-window group (window 4): r1's 6 tokens
    keep tokens 3..5 in the window, but its window entry 0 is the null block (freed while
    token 3 still needs it); r2's 5 tokens keep 2..4, in blocks 5 and 6."""
    tables = np.zeros((2, 2, 2), dtype=np.int32)
    tables[0] = [[1, 2], [1, 3]]
    tables[1] = [[0, 4], [5, 6]]
    arrays: dict[str, Any] = {
        "block_table": tables,
        "num_blocks_per_row": np.full((2, 2), 2, dtype=np.int32),
        "num_tokens": np.array([6, 5], dtype=np.int64),
        "num_computed_tokens": np.array([6, 5], dtype=np.int64),
        "ref_cnt": np.array([0, 2, 1, 1, 1, 1, 1, 0, 0, 0], dtype=np.int32),
        "free_block_queue": np.array([7, 8, 9], dtype=np.int32),
    }
    full = {"kind": "full_attention", "block_size": BLOCK, "layer_names": ["layers.0.attn"]}
    window = {"kind": "sliding_window", "block_size": BLOCK, "sliding_window": 4}
    meta = {
        "block_size": BLOCK,
        "request_ids": ["r1", "r2"],
        "num_blocks": POOL,
        "num_free_blocks": 3,
        "kv_cache_groups": [full, window | {"layer_names": ["layers.1.attn"]}],
    }
    return Snapshot("vllm", arrays, meta)


def _flashinfer_bad_row() -> Snapshot:
    arrays: dict[str, Any] = {
        "kv_indptr": np.array([0, 1], dtype=np.int32),
        "kv_indices": np.array([1], dtype=np.int32),
        "kv_last_page_len": np.array([0], dtype=np.int32),
    }
    return Snapshot("flashinfer", arrays, {"page_size": BLOCK, "request_ids": ["r1"]})


def _disk_state() -> EngineState:
    st = engine_state(BASE_TABLES, BASE_TOKENS)
    disk = table(
        "engine_block_table", seq_id=[0], group_id=[0], block_index=[2], pool_id=[1], block_id=[4]
    )
    st.block_table = pa.concat_tables([st.block_table, disk])
    st.pools = [*st.pools, Pool(1, "tertiary", tier="disk", num_blocks=POOL)]
    st.requests = table(
        "engine_request", seq_id=[0, 1], request_id=["r1", "r2"], num_tokens=[10, 5]
    )
    return st


def _trt(event_id: int, kind: str, **data: Any) -> dict[str, Any]:
    return {"event_id": event_id, "data": {"type": kind, **data}}


def _stored(event_id: int, parent: int | None, *hashes: int) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        {"block_hash": h, "tokens": [], "lora_id": None} for h in hashes
    ]
    return _trt(event_id, "stored", parent_hash=parent, blocks=blocks)


def _dyn(event_id: int, data: Any) -> dict[str, Any]:
    """A Dynamo RouterEvent."""
    return {"worker_id": 1, "event": {"event_id": event_id, "data": data}}


def _dyn_stored(h: int, parent: int | None = None) -> dict[str, Any]:
    return {"stored": {"parent_hash": parent, "blocks": [{"block_hash": h, "tokens_hash": h}]}}


PLANTS: dict[str, Plant] = {
    # the spec's constraints: rows refused
    "unaligned_base": Plant(
        spec_facts={"root_table": [(1, 100)], "block_table_entry": [(100, 0, 257, 1)]}
    ),
    "offset_out_of_block": Plant(spec_facts={"virtual_token": [(1, 0, 0, 300)]}),
    "negative_refcount": Plant(spec_facts={"block_table_entry": [(100, 0, 256, -1)]}),
    # r1 is handed block 12 of a pool of 10
    "outside_pool": Plant(
        2,
        "r1",
        12,
        log=[*BASE, {"step": 2, "ops": [alloc("r1", 12)]}],
        engine=lambda: engine_state({"r1": [1, 2, 12], "r2": [1, 3]}, BASE_TOKENS),
    ),
    # r1 hands block 2 back twice: it is twice in the free queue
    "double_free": Plant(
        2,
        "r1",
        2,
        log=[*BASE, {"step": 2, "ops": [{"op": "release", "req": "r1", "blocks": [2, 2]}]}],
        engine=lambda: engine_state(
            {"r1": [1], "r2": [1, 3]}, {"r1": 4, "r2": 5}, free=[4, 5, 6, 7, 8, 9, 2, 2]
        ),
    ),
    # block 5 held by a block table nobody points to / a page nobody counts / kept back by
    # r3's free (the step log's witness: its handed blocks)
    "leak": Plant(
        block=5,
        log=[
            *BASE,
            {"step": 2, "ops": [alloc("r3", 5), append("r3", 2)]},
            {"step": 3, "ops": [{"op": "free", "req": "r3", "handed": []}]},
        ],
        header=V2_HEADER,
        spec_facts={
            "root_table": [(1, 1)],
            "block_table_entry": [(1, 0, 256, 1), (2, 0, 5 * 256, 1)],
            "virtual_token": [(1, 0, 0, 0)],
        },
        engine=_sglang_leak,
    ),
    # block 2, which r1 holds, is evicted (so it sat in the free queue)
    "use_after_free": Plant(
        2,
        "r1",
        2,
        log=[*BASE, {"step": 2, "ops": [{"op": "evict", "blocks": [2]}]}],
        engine=lambda: engine_state(BASE_TABLES, BASE_TOKENS, free=[4, 5, 6, 7, 8, 9, 2]),
    ),
    # block 4: no reference, not in the free queue
    "free_list": Plant(
        block=4, engine=lambda: engine_state(BASE_TABLES, BASE_TOKENS, free=[5, 6, 7, 8, 9])
    ),
    # r2 asked for the prefix hashes aa, dd; its block 3 is cached under cc
    "prefix_hash": Plant(
        1,
        "r2",
        3,
        engine=_vllm_wrong_hash,
        log=[
            {
                "step": 0,
                "ops": [
                    alloc("r1", 1, 3),
                    append("r1", 8),
                    {"op": "cache", "blocks": [1, 3], "hashes": [HASH_AA, HASH_CC]},
                ],
            },
            {
                "step": 1,
                "ops": [
                    {"op": "share", "req": "r2", "blocks": [1, 3], "hashes": [HASH_AA, HASH_DD]}
                ],
            },
        ],
        header=V2_HEADER,
    ),
    # r1 takes block 1 a second time
    "duplicate_block": Plant(
        2,
        "r1",
        1,
        log=[*BASE, {"step": 2, "ops": [{"op": "share", "req": "r1", "blocks": [1]}]}],
        engine=lambda: engine_state({"r1": [1, 2, 1], "r2": [1, 3]}, BASE_TOKENS),
    ),
    "freed_request_referenced": Plant(
        3,
        "r2",
        None,
        log=[*BASE, {"step": 2, "finished": ["r2"]}, {"step": 3, "ops": [append("r2", 1)]}],
    ),
    # the engine counts 2 references to block 2, which only r1 holds
    "ref_count": Plant(
        2,
        "r1",
        2,
        log=[*BASE, {"step": 2, "observed": {"ref_cnt": {"2": 2}}}],
        engine=lambda: engine_state(BASE_TABLES, BASE_TOKENS, ref_cnt={2: 2}),
        spec_engine=True,
    ),
    # the engine says 9 blocks are free; 6 are (pool 10, block 0 reserved, 1-3 in use)
    "free_count": Plant(
        2,
        log=[*BASE, {"step": 2, "observed": {"num_free_blocks": 9}}],
        engine=lambda: engine_state(BASE_TABLES, BASE_TOKENS, free_count=9),
    ),
    # r1's block 2 swapped out to CPU address 1000
    "unaligned_cpu_address": Plant(
        2,
        "r1",
        None,
        log=[
            *BASE,
            {"step": 2, "ops": [{"op": "swap_out", "req": "r1", "blocks": [2], "cpu": [1000]}]},
        ],
        spec_at=2,
    ),
    "overlapping_blocks": Plant(
        spec_facts={
            "root_table": [(1, 1)],
            "block_table_entry": [(1, 0, 256, 1)],
            "swapped_block": [(1, 1, 4096), (1, 2, 4100)],
        }
    ),
    "conflicting_location": Plant(
        spec_facts={
            "root_table": [(1, 1)],
            "block_table_entry": [(1, 0, 256, 1)],
            "swapped_block": [(1, 0, 4096)],
        }
    ),
    "conflicting_root": Plant(spec_facts={"root_table": [(1, 1), (1, 2)]}),
    "disk_block": Plant(request="r1", block=4, engine=_disk_state),
    # r3 is handed block 2 while r1's tokens 4, 5 are in it
    "stale_token": Plant(2, "r1", 2, log=[*BASE, {"step": 2, "ops": [alloc("r3", 2)]}]),
    # r1 writes tokens 6..8: token 8 has no block
    "unresolved_token": Plant(
        2,
        "r1",
        None,
        log=[*BASE, {"step": 2, "ops": [append("r1", 3)]}],
        spec_at=2,
        engine=_vllm_window_hole,
    ),
    # r2's prefix hit reuses 8 tokens of group 0 (blocks 1, 2) and 4 of group 1 (block 3)
    "hit_length_mismatch": Plant(
        1,
        "r2",
        None,
        log=[
            {
                "step": 0,
                "ops": [
                    alloc("r1", 1, 2),
                    {"op": "allocate", "req": "r1", "group": 1, "blocks": [3, 4]},
                    append("r1", 8),
                ],
            },
            {
                "step": 1,
                "ops": [
                    {"op": "share", "req": "r2", "blocks": [1, 2]},
                    {"op": "share", "req": "r2", "group": 1, "blocks": [3]},
                ],
            },
        ],
        header=HYBRID_HEADER,
    ),
    "token_decomposition": Plant(
        spec_facts={"root_table": [(1, 1)], "virtual_token": [(1, 5, 1, 5)]}
    ),
    "slot_page_offset": Plant(request="r1", engine=_sglang_wrong_offset),
    "csr_row": Plant(request="r1", engine=_flashinfer_bad_row),
    "unknown_removal": Plant(events=[_stored(0, None, 1), _trt(1, "removed", block_hashes=[7])]),
    "unknown_parent": Plant(events=[_stored(0, 9, 1)]),
    "after_clear": Plant(
        events=[_dyn(0, _dyn_stored(1)), _dyn(1, "cleared"), _dyn(2, _dyn_stored(2, parent=1))]
    ),
    "sequence_gap": Plant(events=[_stored(0, None, 1), _stored(5, 1, 2)]),
    "false_residency": Plant(fleet=fleet_fixtures.router_lost_removal),
    "missed_residency": Plant(fleet=fleet_fixtures.duplicate_copy),
    "prefix_false_hit": Plant(request="q2", fleet=fleet_fixtures.over_predicted),
    "misroute": Plant(request="q2", fleet=fleet_fixtures.misrouted),
}
