"""The real SGLang 0.5.21 ReqToTokenPool, PagedTokenToKVPoolAllocator, MHATokenToKVPool
and RadixCache on the CPU: allocate, share a prefix through the radix cache, grow, free;
capture; load; every resolved token against req_to_token[row, pos]; then a double free,
a page twice in one request and an eviction of a page a request still holds, named by
`check`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines import sglang

from .resolved import resolved_slots
from .sglang_driver import PAGE_SIZE, Engine, _base, torch

PREFIX = list(range(32))


def two_sharing() -> Engine:
    e = Engine()
    e.schedule("a", [*PREFIX, *range(100, 108)])  # 40 tokens: 3 pages
    e.cache_prefix("a", 32)
    e.schedule("b", [*PREFIX, *range(200, 210)])  # 42 tokens: 2 shared pages + 1
    return e


def pages(e: Engine, rid: str) -> list[int]:
    r = e.running[rid]
    row = e.rtt.req_to_token[r.row, : len(r.tokens)].to(torch.int64)
    return sorted(set((row // PAGE_SIZE).tolist()))


def test_two_requests_share_prefix_pages() -> None:
    e = two_sharing()
    a, b = pages(e, "a"), pages(e, "b")
    assert len(a) == 3 and len(b) == 3
    assert a[:2] == b[:2]  # the 32-token prefix: the same two pages
    assert e.running["b"].prefix_len == 32
    assert e.running["b"].node.lock_ref == 2  # a and b run on the cached prefix


def capture(e: Engine) -> Any:
    return sglang.capture(
        e.rtt, e.allocator, e.tree, seq_lens=e.seq_lens(), request_ids=e.request_ids()
    )


def loaded(e: Engine, path: Path | None = None) -> pagedkv_sql.Database:
    snap = capture(e)
    db = pagedkv_sql.connect(":memory:")
    db.load_engine(snap.save(path) if path is not None else snap)
    return db


@pytest.mark.parametrize("fmt", [None, "npz", "safetensors"])
def test_every_resolved_token_is_req_to_token(tmp_path: Path, fmt: str | None) -> None:
    e = two_sharing()
    e.schedule("c", [*PREFIX, *range(300, 340)])  # 72 tokens on the prefix too
    for t in range(20):  # b grows across a page boundary, token by token
        e.decode("b", 1000 + t)
    e.finish("a")
    db = loaded(e, tmp_path / f"sglang.{fmt}" if fmt else None)
    got = resolved_slots(db, PAGE_SIZE)
    assert sorted(got) == ["b", "c"]
    for rid in ("b", "c"):
        r = e.running[rid]
        own = e.rtt.req_to_token[r.row, : len(r.tokens)].numpy()
        np.testing.assert_array_equal(got[rid], own)
        assert len(got[rid]) == len(r.tokens)
    assert db.check().ok(strict=True), db.violations().to_arrow_table().to_pylist()
    # the prefix pages carry the radix node's lock_ref (b and c run on them)
    locks = (
        db.sql("SELECT block_id, lock_ref FROM engine_block WHERE lock_ref IS NOT NULL ORDER BY 1")
        .to_arrow_table()
        .to_pylist()
    )
    prefix_pages = pages(e, "b")[:2]
    assert {r["block_id"]: r["lock_ref"] for r in locks if r["block_id"] in prefix_pages} == {
        p: e.running["b"].node.lock_ref for p in prefix_pages
    }


def test_capture_reads_free_pages_and_rows() -> None:
    e = two_sharing()
    snap = capture(e)
    free = e.allocator.get_all_free_pages().tolist()
    assert snap.arrays["free_pages"].tolist() == free
    assert snap.meta["page_size"] == PAGE_SIZE
    assert sorted(snap.meta["request_ids"]) == ["a", "b"]
    assert snap.meta["free_rows"] == list(e.rtt.free_slots)
    names = [t.name for t in snap.cache_tensors]
    assert names == ["k_buffer.0", "k_buffer.1", "v_buffer.0", "v_buffer.1"]
    assert snap.cache_tensors[0].pointer == e.kv.k_buffer[0].data_ptr()


def findings(db: pagedkv_sql.Database) -> dict[str, list[dict[str, Any]]]:
    return {r.name: r.rows.to_pylist() for r in db.check(limit=None).results if r.count}


def test_a_request_freed_twice_is_named() -> None:
    """b's pages are freed again after b finished; the next request gets one of them
    while the free list still has it."""
    e = two_sharing()
    b = e.running["b"]
    own = b.slots[32:].clone()  # b's own page (the prefix is the tree's)
    e.finish("b")
    e.allocator.free(own)  # the second free
    d = e.schedule("d", list(range(600, 610)))
    page = int(d.slots[0]) // PAGE_SIZE
    assert page == int(own[0]) // PAGE_SIZE
    db = loaded(e)
    found = findings(db)
    heldfree = {(r["request_id"], r["block_id"]) for r in found["diag_engine_held_free_block"]}
    assert heldfree == {("d", page)}, found


def test_one_page_twice_in_a_request_is_named() -> None:
    e = two_sharing()
    b = e.running["b"]
    first = int(e.rtt.req_to_token[b.row, 0]) // PAGE_SIZE
    e.rtt.req_to_token[b.row, 32:42] = e.rtt.req_to_token[b.row, 0:10]  # block 2 -> page 0's
    db = loaded(e)
    found = findings(db)
    dup = {(r["request_id"], r["block_id"]) for r in found["diag_engine_duplicate_block"]}
    assert dup == {("b", first)}, found


def test_a_page_evicted_while_held_is_named() -> None:
    """The radix cache drops its lock too early and evicts the prefix pages that a and b
    still read."""
    e = two_sharing()
    prefix = pages(e, "b")[:2]
    node = e.running["b"].node
    e.tree.dec_lock_ref(node)
    e.tree.dec_lock_ref(node)  # lock_ref 0 while a and b run on it
    e.tree.evict(_base.EvictParams(num_tokens=32))
    freed = set(e.allocator.get_all_free_pages().tolist())
    assert set(prefix) <= freed
    found = findings(loaded(e))
    heldfree = {(r["request_id"], r["block_id"]) for r in found["diag_engine_held_free_block"]}
    assert heldfree == {(rid, p) for rid in ("a", "b") for p in prefix}, found
