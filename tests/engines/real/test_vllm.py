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

from .resolved import resolved_slots
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


@pytest.mark.parametrize("fmt", [None, "npz", "safetensors"])
def test_every_resolved_token_is_vllms_own_slot(tmp_path: Path, fmt: str | None) -> None:
    e = two_sharing()
    e.schedule("c", [*PREFIX, *range(300, 340)])  # 72 tokens, shares the prefix too
    for t in range(20):  # b grows across a block boundary, token by token
        e.decode("b", 1000 + t)
    e.finish("a")  # a's blocks go to the free queue, its prefix stays cached
    db = loaded(e, tmp_path if fmt else None, fmt or "npz")
    got = resolved_slots(db, BLOCK_SIZE, offset_is_position=True)
    assert sorted(got) == ["b", "c"]
    for rid in ("b", "c"):
        np.testing.assert_array_equal(got[rid], engine_slots(e, rid))
    # the engine's ref_cnt is the spec's refcount, and nothing is wrong
    assert db.check().ok(strict=True), db.violations().to_arrow_table().to_pylist()
    refcounts = {
        r["block_id"]: r["refcount"]
        for r in db.sql(
            "SELECT DISTINCT b.block_id, e.refcount FROM engine_block_table b "
            "JOIN block_table_entry e ON e.block_table_id = b.seq_id "
            "AND e.block_index = b.block_index"
        )
        .to_arrow_table()
        .to_pylist()
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


def test_a_request_freed_twice_is_named() -> None:
    """The blocks of b are released a second time after b finished (a double free): the
    shared prefix blocks drop to ref_cnt 0 and join the free queue while a still holds
    them, and b's own block is queued twice."""
    e = two_sharing()
    b_blocks = list(e.manager.coordinator.single_type_managers[0].req_to_blocks["b"])
    e.finish("b")
    e.pool.free_blocks(reversed(b_blocks))  # the second free
    assert [e.ref_cnt(i) for i in (1, 2, 5)] == [0, 0, -1]
    db = pagedkv_sql.connect(":memory:")
    db.load_engine(vllm.capture(e.manager, e.requests))
    found = findings(db)
    text = str(found)
    assert "diag_engine_held_free_block" in found, text
    heldfree = {(r["request_id"], r["block_id"]) for r in found["diag_engine_held_free_block"]}
    assert heldfree == {("a", 1), ("a", 2)}
    # b's own block went back once and then below zero: queued with ref_cnt -1
    queued = found["diag_engine_free_queue_ref_cnt"]
    assert [(r["block_id"], r["ref_cnt"]) for r in queued] == [(5, -1)], text
    assert not db.check().ok(strict=True)


def test_one_block_twice_in_a_request_is_named() -> None:
    """vLLM #42571: one block twice in one request's list, so free_blocks frees it twice."""
    e = two_sharing()
    blocks = e.manager.coordinator.single_type_managers[0].req_to_blocks["b"]
    blocks.append(blocks[-1])  # block 5 twice in b's list
    e.requests["b"].append_output_token_ids(7)  # b's tokens now reach into the copy
    db = pagedkv_sql.connect(":memory:")
    db.load_engine(vllm.capture(e.manager, e.requests))
    found = findings(db)
    dup = found["diag_engine_duplicate_block"]
    assert {(r["request_id"], r["block_id"]) for r in dup} == {("b", 5)}, dup
    mismatch = {r["block_id"] for r in found["diag_engine_ref_cnt_mismatch"]}
    assert mismatch == {5}  # ref_cnt 1, held twice
    # and what it leads to: finishing b frees block 5 twice
    e.finish("b")
    assert e.ref_cnt(5) == -1
    db2 = pagedkv_sql.connect(":memory:")
    db2.load_engine(vllm.capture(e.manager, e.requests))
    rows = findings(db2)["diag_engine_ref_cnt_mismatch"]
    assert [(r["block_id"], r["ref_cnt"]) for r in rows] == [(5, -1)], rows


def test_a_block_evicted_while_held_is_named() -> None:
    """The damage of vLLM #37076: a block a request still holds goes back to the free
    queue (ref_cnt 0), and the next allocation hands it to another request."""
    e = two_sharing()
    victim = e.pool.blocks[5]  # b's own last block, ref_cnt 1
    e.pool.free_blocks([victim])  # released while b holds it
    snap = vllm.capture(e.manager, e.requests)
    db = pagedkv_sql.connect(":memory:")
    db.load_engine(snap)
    found = findings(db)
    assert {(r["request_id"], r["block_id"]) for r in found["diag_engine_held_free_block"]} == {
        ("b", 5)
    }
    e.schedule("c", list(range(500, 510)))  # a fresh block: the free queue's head, 5
    assert e.blocks("c") == [5]
    db2 = pagedkv_sql.connect(":memory:")
    db2.load_engine(vllm.capture(e.manager, e.requests))
    rows = findings(db2)["diag_engine_ref_cnt_mismatch"]
    assert [r["block_id"] for r in rows] == [5], rows
    assert "b" in str(rows) and "c" in str(rows)
