"""What the engines' tests share: an engine state in the spec's tables and the engine
tables, its findings, the snapshots of each engine in its exact shapes and dtypes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import pagedkv_sql
from pagedkv_sql.engines import Snapshot
from pagedkv_sql.engines.tables import EngineState, Pool, table, write

BLOCK = 16
NUM_BLOCKS = 10


def state(
    lists: dict[str, list[int]],
    ref_cnt: dict[int, int] | None = None,
    free: list[int] | None = None,
    slots: dict[str, list[int]] | None = None,
) -> EngineState:
    """A vLLM-like state: requests with block lists, every block's ref_cnt (default: its
    holders), the free queue (default: the blocks nobody holds), null block 0."""
    ids = list(lists)
    holders: dict[int, int] = {}
    for blocks in lists.values():
        for b in blocks:
            holders[b] = holders.get(b, 0) + 1
    counts = {b: holders.get(b, 0) for b in range(1, NUM_BLOCKS)}
    counts.update(ref_cnt or {})
    queue = free if free is not None else [b for b in range(1, NUM_BLOCKS) if not holders.get(b)]
    seq = [i for i, r in enumerate(ids) for _ in lists[r]]
    idx = [j for r in ids for j in range(len(lists[r]))]
    block_ids = [b for r in ids for b in lists[r]]
    token_slots = None
    if slots:
        rows = [(ids.index(r), pos, s) for r, ss in slots.items() for pos, s in enumerate(ss)]
        token_slots = table(
            "engine_token_slot",
            seq_id=[r[0] for r in rows],
            token_pos=[r[1] for r in rows],
            slot=[r[2] for r in rows],
        )
    return EngineState(
        engine="test",
        block_size=BLOCK,
        requests=table(
            "engine_request",
            seq_id=np.arange(len(ids)),
            request_id=ids,
            num_tokens=[len(lists[r]) * BLOCK for r in ids],
        ),
        block_table=table(
            "engine_block_table",
            seq_id=seq,
            group_id=[0] * len(seq),
            block_index=idx,
            pool_id=[0] * len(seq),
            block_id=block_ids,
        ),
        pools=[Pool(0, "kv", num_blocks=NUM_BLOCKS)],
        blocks=table(
            "engine_block",
            pool_id=[0] * NUM_BLOCKS,
            block_id=list(range(NUM_BLOCKS)),
            ref_cnt=[0, *(counts[b] for b in range(1, NUM_BLOCKS))],
            is_null=[True] + [False] * (NUM_BLOCKS - 1),
        ),
        free_blocks=table(
            "engine_free_block",
            pool_id=[0] * len(queue),
            position=list(range(len(queue))),
            block_id=queue,
        ),
        token_slots=token_slots,
    )


def findings(db: pagedkv_sql.Database, st: EngineState) -> dict[str, list[str]]:
    report = write(db.con, st, "test")
    return {r.name: sorted(r.rows.column("reason").to_pylist()) for r in report.warnings}


SHARED = {"req-a": [1, 2, 3, 4], "req-b": [1, 2, 5]}


def spec_rows(db: pagedkv_sql.Database, relation: str) -> list[tuple[int, ...]]:
    return [tuple(r) for r in db.sql(f"SELECT * FROM {relation} ORDER BY ALL").fetchall()]


def with_group(st: EngineState, rows: list[tuple[int, int, int]], pool: int = 0) -> None:
    """Add (seq_id, block_index, block_id) entries of KV-cache group 1 to a state."""
    extra = table(
        "engine_block_table",
        seq_id=[r[0] for r in rows],
        group_id=[1] * len(rows),
        block_index=[r[1] for r in rows],
        pool_id=[pool] * len(rows),
        block_id=[r[2] for r in rows],
    )
    st.block_table = pa.concat_tables([st.block_table, extra])


I32 = np.int32
CSR = {
    "kv_indptr": np.array([0, 2, 3], I32),
    "kv_indices": np.array([1, 2, 3], I32),
    "kv_last_page_len": np.array([5, 16], I32),
}
TENSOR = {
    "name": "kv",
    "shape": [8, 2, 16, 8, 128],
    "strides": [32768, 16384, 1024, 128, 1],
    "dtype": "float16",
    "itemsize": 2,
    "dims": ["block", "kv", "slot", "head", "dim"],
    "pointer": 2**40,
}


def write_npz(path: Path, header: Any, arrays: dict[str, np.ndarray] | None = None) -> Path:
    text = header if isinstance(header, str) else json.dumps(header)
    np.savez(path, **(CSR if arrays is None else arrays), pagedkv=np.array(text))
    return path


def flashinfer_header(meta: dict[str, Any] | None = None, **tensor: Any) -> dict[str, Any]:
    header: dict[str, Any] = {"engine": "flashinfer", "meta": {"page_size": 16, **(meta or {})}}
    if tensor:
        header["cache_tensors"] = [{**TENSOR, **tensor}]
    return header


def load_engine_file(path: Path, engine: str | None = None) -> Any:
    import pagedkv_sql

    with pagedkv_sql.connect(":memory:") as db:
        return db.load_engine(path, engine)


def import_module(name: str) -> Any:
    import importlib

    return importlib.import_module(name)


TPB, LAYERS, KV = 16, 2, 2
SECONDARY = 1 << 30  # KVCacheIndex pool type 1, in the top two bits
NULL = -1  # KVCacheIndex::nullIndex


def offsets(rows: list[list[tuple[int, int] | None]], max_blocks: int = 4) -> np.ndarray:
    """One pool; each row a list of (pool type, block) or None for a placeholder."""
    out = np.zeros((1, len(rows), 2, max_blocks), dtype=np.int32)
    for r, blocks in enumerate(rows):
        for b, entry in enumerate(blocks):
            if entry is None:
                out[0, r, :, b] = NULL
                continue
            kind, block = entry
            k = block * LAYERS * KV + (SECONDARY if kind else 0)
            out[0, r, 0, b], out[0, r, 1, b] = k, k + 1
    return out


def vllm_snapshot() -> Snapshot:
    # two requests sharing a 32-token prefix, block size 16: [1, 2, 3, 4] and [1, 2, 5]
    table = np.array([[1, 2, 3, 4], [1, 2, 5, 0]], dtype=np.int32)
    arrays = {
        "block_table": table,
        "num_blocks_per_row": np.array([4, 3], dtype=np.int32),
        "num_tokens": np.array([52, 42], dtype=np.int64),
        "ref_cnt": np.array([0, 2, 2, 1, 1, 1, 0, 0], dtype=np.int32),
        "free_block_queue": np.array([6, 7], dtype=np.int32),
    }
    meta = {"block_size": 16, "request_ids": ["a", "b"], "num_blocks": 8, "num_free_blocks": 2}
    return Snapshot("vllm", arrays, meta)


def sglang_snapshot() -> Snapshot:
    rtt = np.zeros((2, 48), dtype=np.int32)
    rtt[0, :40] = np.r_[16:48, 48:56]  # pages 1, 2 (prefix), 3
    rtt[1, :42] = np.r_[16:48, 64:74]  # pages 1, 2 (shared), 4
    arrays = {
        "req_to_token": rtt,
        "seq_lens": np.array([40, 42], dtype=np.int64),
        "req_pool_indices": np.array([3, 4], dtype=np.int64),
        "free_pages": np.array([5, 6, 7], dtype=np.int64),
        "tree_pages": np.array([1, 2], dtype=np.int64),
        "tree_lock_ref": np.array([2, 2], dtype=np.int64),
    }
    return Snapshot("sglang", arrays, {"page_size": 16, "num_pages": 7, "request_ids": ["a", "b"]})


def grouped_snapshot(
    groups: list[dict[str, Any]],
    lists: dict[str, list[list[int]]],
    tokens: dict[str, int],
    *,
    num_blocks: int = 24,
    ref_cnt: dict[int, int] | None = None,
    free: list[int] | None = None,
    null_ref_cnt: int = 0,
) -> Snapshot:
    """A vLLM snapshot of several KV-cache groups in the shapes vLLM gives: ``groups`` as
    meta ``kv_cache_groups`` entries (kind, block_size, sliding_window...), each request's
    list per group (block 0, the null block, where vLLM puts a placeholder), its computed
    tokens; every block's ref_cnt is its holders over all groups (``ref_cnt`` overrides;
    the null block's ``null_ref_cnt``, which vLLM 0.32 drifts negative), the free queue
    the blocks nobody holds (``free`` overrides). The snapshot's block size is the primary
    group's (the first full-attention one, else group 0)."""
    ids = list(lists)
    width = max((len(x) for r in ids for x in lists[r]), default=0)
    table_ = np.zeros((len(groups), len(ids), width), dtype=np.int32)
    per_row = np.zeros((len(groups), len(ids)), dtype=np.int32)
    holders: dict[int, int] = {}
    for r, rid in enumerate(ids):
        for g, blocks in enumerate(lists[rid]):
            table_[g, r, : len(blocks)] = blocks
            per_row[g, r] = len(blocks)
            for b in blocks:
                if b != 0:
                    holders[b] = holders.get(b, 0) + 1
    counts = [holders.get(b, 0) for b in range(num_blocks)]
    counts[0] = null_ref_cnt
    for b, n in (ref_cnt or {}).items():
        counts[b] = n
    queue = free if free is not None else [b for b in range(1, num_blocks) if not holders.get(b)]
    computed = np.array([tokens[r] for r in ids], dtype=np.int64)
    arrays = {
        "block_table": table_ if len(groups) > 1 else table_[0],
        "num_blocks_per_row": per_row if len(groups) > 1 else per_row[0],
        "num_tokens": computed,
        "num_computed_tokens": computed.copy(),
        "ref_cnt": np.array(counts, dtype=np.int32),
        "free_block_queue": np.array(queue, dtype=np.int32),
    }
    kinds = [g["kind"] for g in groups]
    primary = kinds.index("full_attention") if "full_attention" in kinds else 0
    meta = {
        "block_size": groups[primary]["block_size"],
        "request_ids": ids,
        "num_blocks": num_blocks,
        "num_free_blocks": len(queue),
        "null_block": 0,
        "num_kv_cache_groups": len(groups),
        "kv_cache_groups": groups,
        "kv_cache_coordinator": "HybridKVCacheCoordinator"
        if len(groups) > 1
        else "UnitaryKVCacheCoordinator",
    }
    return Snapshot("vllm", arrays, meta)
