"""The real vLLM 0.32.0 KVCacheManager on the CPU: allocate, share a prefix, grow, free;
capture; load; every resolved token against vLLM's own block ids and slots; then the
corruptions of vLLM #42571 and #37076 and a double free, named by `check`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines import vllm

from .vllm_driver import BLOCK_SIZE, Engine

PREFIX = list(range(32))  # two full blocks of 16


def two_sharing(num_blocks: int = 16) -> Engine:
    e = Engine(num_blocks)
    e.schedule("a", [*PREFIX, *range(100, 120)])  # 52 tokens: 4 blocks
    e.schedule("b", [*PREFIX, *range(200, 210)])  # 42 tokens: 2 shared + 1
    return e


def test_two_requests_share_a_32_token_prefix() -> None:
    e = two_sharing()
    assert e.blocks("a") == [1, 2, 3, 4]
    assert e.blocks("b") == [1, 2, 5]
    assert [e.ref_cnt(b) for b in (1, 2, 3, 4, 5)] == [2, 2, 1, 1, 1]


def loaded(e: Engine, tmp_path: Path | None = None, fmt: str = "npz") -> pagedkv_sql.Database:
    snap = vllm.capture(e.manager, e.requests)
    if tmp_path is not None:
        snap = snap.save(tmp_path / f"vllm.{fmt}")  # type: ignore[assignment]
    db = pagedkv_sql.connect(":memory:")
    db.load_engine(snap)
    return db


def engine_slots(e: Engine, request_id: str) -> np.ndarray:
    """vLLM's own mapping: slot = block_ids[pos // B] * B + pos % B, block ids from
    KVCacheManager.get_block_ids, one per token the request holds."""
    ids = np.array(e.blocks(request_id), dtype=np.int64)
    pos = np.arange(e.requests[request_id].num_tokens)
    return ids[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE


def resolved_slots(db: pagedkv_sql.Database) -> dict[str, np.ndarray]:
    """What pagedkv-sql resolves, turned back into engine slots through the pool's
    addressing (base + block_id * block_step + offset)."""
    base, step = (
        db.sql("SELECT base, block_step FROM engine_pool WHERE pool_id = 0").to_pylist()[0].values()
    )
    rows = db.sql(
        "SELECT r.request_id, a.token_pos, a.physical_address FROM resolved_kv_address a "
        "JOIN engine_request r USING (seq_id) ORDER BY r.request_id, a.token_pos"
    ).to_pydict()
    out: dict[str, list[int]] = {}
    for rid, pos, addr in zip(
        rows["request_id"], rows["token_pos"], rows["physical_address"], strict=True
    ):
        block, offset = divmod(addr - base, step)
        assert offset == pos % BLOCK_SIZE
        out.setdefault(rid, []).append(block * BLOCK_SIZE + offset)
    return {rid: np.array(s) for rid, s in out.items()}


@pytest.mark.parametrize("fmt", [None, "npz", "safetensors"])
def test_every_resolved_token_is_vllms_own_slot(tmp_path: Path, fmt: str | None) -> None:
    e = two_sharing()
    e.schedule("c", [*PREFIX, *range(300, 340)])  # 72 tokens, shares the prefix too
    for t in range(20):  # b grows across a block boundary, token by token
        e.decode("b", 1000 + t)
    e.finish("a")  # a's blocks go to the free queue, its prefix stays cached
    db = loaded(e, tmp_path if fmt else None, fmt or "npz")
    got = resolved_slots(db)
    assert sorted(got) == ["b", "c"]
    for rid in ("b", "c"):
        np.testing.assert_array_equal(got[rid], engine_slots(e, rid))
    # the engine's ref_cnt is the spec's refcount, and nothing is wrong
    assert db.check().ok(strict=True), db.violations().to_pylist()
    refcounts = {
        r["block_id"]: r["refcount"]
        for r in db.sql(
            "SELECT DISTINCT b.block_id, e.refcount FROM engine_block_table b "
            "JOIN block_table_entry e ON e.block_table_id = b.seq_id "
            "AND e.block_index = b.block_index"
        ).to_pylist()
    }
    assert refcounts == {b: e.ref_cnt(b) for b in refcounts}
    assert refcounts[1] == 2  # b and c share the prefix; a has finished


def test_capture_reads_the_free_queue_in_order() -> None:
    e = two_sharing(num_blocks=10)
    e.finish("b")
    snap = vllm.capture(e.manager, e.requests)
    queue = [b.block_id for b in e.pool.free_block_queue.get_all_free_blocks()]
    assert snap.arrays["free_block_queue"].tolist() == queue
    assert snap.arrays["ref_cnt"].tolist() == [b.ref_cnt for b in e.pool.blocks]
    assert snap.meta["free_queue_complete"] is True
    assert snap.meta["request_ids"] == ["a"]
    assert snap.arrays["slot_mapping"].tolist() == engine_slots(e, "a").tolist()


def findings(db: pagedkv_sql.Database) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in db.check(limit=None).results:
        if r.count:
            out[r.name] = r.rows.to_pylist()
    return out
