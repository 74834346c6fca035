"""The real SGLang 0.5.21 ReqToTokenPool, PagedTokenToKVPoolAllocator, MHATokenToKVPool
and RadixCache on the CPU: allocate, share a prefix through the radix cache, grow, free;
capture and its page invariants (every page free, in the tree or held by a row, once);
every resolved token against req_to_token[row, pos]; a double free, a page twice in one
request and an eviction of a held page named by `check`; `assert_consistent` on a leak."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines import check_snapshot, sglang

from .helpers import sql_findings
from .resolved import resolved_slots
from .sglang_driver import PAGE_SIZE, Engine, Scheduler, _base, _radix, prefix_indices, torch
from .sglang_driver import Scheduler as SGLang

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


def test_sglang_healthy_and_a_leaked_page() -> None:
    e = SGLang(num_pages=8, rows=4, page_size=4)
    e.schedule("a", [*range(8), 100])
    e.cache_prefix("a", 8)
    args = (e.rtt, e.allocator, e.tree)
    sglang.assert_consistent(*args, seq_lens=e.seq_lens(), request_ids=e.request_ids())
    r = e.running.pop("a")
    e.tree.dec_lock_ref(r.node)
    e.rtt.free_rows([r.row])  # its last page never freed
    with pytest.raises(AssertionError) as info:
        sglang.assert_consistent(*args, seq_lens=e.seq_lens(), request_ids=e.request_ids())
    page = int(r.slots[8]) // 4
    assert f"leak (diag_engine_leak): page {page} is neither free" in str(info.value)
    assert f"[block {page}]" in str(info.value)


PAGE = 4


def capture_scheduler(e: Scheduler) -> Any:
    return sglang.capture(
        e.rtt, e.allocator, e.tree, seq_lens=e.seq_lens(), request_ids=e.request_ids()
    )


def fast(snap: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in check_snapshot(snap):
        out.setdefault(f.check, []).append(f.reason)
    return out


def sharing() -> Scheduler:
    e = Scheduler(num_pages=12, rows=6, page_size=PAGE)
    e.schedule("a", [*range(8), 100, 101])  # 10 tokens: 3 pages
    e.cache_prefix("a", 8)
    e.schedule("b", [*range(8), 200])  # hits a's two pages
    return e


def test_a_shared_prefix_is_silent_and_every_page_is_counted() -> None:
    e = sharing()
    snap = capture_scheduler(e)
    assert fast(snap) == {} and sql_findings(snap) == {}
    e.finish("a")
    e.finish("b")
    snap = capture_scheduler(e)
    # all rows gone: the cached pages are the tree's, every other page is free
    assert snap.arrays["tree_pages"].size + snap.arrays["free_pages"].size == 12
    assert fast(snap) == {} and sql_findings(snap) == {}


def test_a_page_dropped_by_free_is_a_leak() -> None:
    """Planted (SGLang #11970's kind): finishing b frees its own page but one, which is
    then neither free, in the tree, nor held."""
    e = sharing()
    r = e.running.pop("b")
    own = r.slots[8:]
    e.allocator.free(own[PAGE:])  # b's only own page is own[:4]: dropped
    e.tree.dec_lock_ref(r.node)
    e.rtt.free_rows([r.row])
    lost = int(own[0]) // PAGE
    snap = capture_scheduler(e)
    expected = {
        "diag_engine_leak": [
            f"page {lost} is neither free, in the radix tree, nor held by a request (leaked)"
        ]
    }
    assert fast(snap) == expected
    assert sql_findings(snap) == expected


def test_a_tree_page_in_the_free_list() -> None:
    """Planted: a cached prefix's pages freed while the tree still serves them (and b still
    holds them)."""
    e = sharing()
    node = e.running["b"].node
    e.allocator.free(node.value)
    snap = capture_scheduler(e)
    found = fast(snap)
    pages = sorted({int(s) // PAGE for s in node.value.tolist()})
    assert sorted(found["diag_engine_tree_page_free"]) == [
        f"page {p} is in the radix tree (lock_ref 2) and in the free list at position {i}"
        for i, p in enumerate(pages)
    ]
    assert "diag_engine_leak" in found  # free and in the tree: counted twice
    assert "diag_engine_held_free_block" in found  # a and b hold them
    assert sql_findings(snap).keys() >= found.keys()


def test_a_second_request_on_a_cached_prefix_that_locks_nothing() -> None:
    """Planted: b reuses a's cached pages without inc_lock_ref: lock_ref 1 with two rows
    on them, so the prefix can be evicted under b once a finishes."""
    e = Scheduler(num_pages=12, rows=6, page_size=PAGE)
    e.schedule("a", [*range(8), 100, 101])
    e.cache_prefix("a", 8)
    e.tree.inc_lock_ref = lambda node: None  # type: ignore[method-assign]
    e.schedule("b", [*range(8), 200])
    snap = capture_scheduler(e)
    found = fast(snap)
    assert sorted(found) == ["diag_engine_lock_ref"]
    assert len(found["diag_engine_lock_ref"]) == 2  # both prefix pages
    assert found["diag_engine_lock_ref"][0].endswith(
        "lock_ref 1 but 2 running request(s) hold it: a b"
    )
    assert sql_findings(snap) == found


def test_a_random_schedule_stays_silent() -> None:
    """Requests on shared prefixes, decodes across pages, partial and full inserts into the
    radix cache, finishes and evictions on a pool that runs out: the fast check silent on
    every state, the SQL views on every tenth."""
    rng = random.Random(2721)
    e = Scheduler(num_pages=16, rows=6, page_size=PAGE)
    prefixes = [list(range(p * 100, p * 100 + 12)) for p in range(3)]
    seen = {"hits": 0, "evicted": 0, "inserted": 0, "finished": 0}
    for step in range(200):
        action = rng.random()
        if (action < 0.3 or not e.running) and len(e.running) < 5:
            tokens = rng.choice(prefixes)[: rng.randint(0, 12)] + [1000 + step] * rng.randint(1, 5)
            key = _radix.RadixKey(tokens)
            hit = len(prefix_indices(e.tree, e.tree.match_prefix(_base.MatchPrefixParams(key=key))))
            before = e.tree.evictable_size()
            if not e.room(len(tokens) - hit):
                continue
            seen["evicted"] += int(e.tree.evictable_size() < before)
            r = e.schedule(f"r{step}", tokens)
            seen["hits"] += int(r.prefix_len > 0)
        elif action < 0.7 and e.running:
            rid = rng.choice(sorted(e.running))
            r = e.running[rid]
            if len(r.tokens) == len(r.slots) and not e.room(1):
                continue
            e.decode(rid, 2000 + step)
        elif action < 0.85 and e.running:
            rid = rng.choice(sorted(e.running))
            e.cache_prefix(rid, len(e.running[rid].tokens))
            seen["inserted"] += 1
        elif e.running:
            e.finish(rng.choice(sorted(e.running)))
            seen["finished"] += 1
        snap = capture_scheduler(e)
        assert fast(snap) == {}, (step, fast(snap))
        if step % 10 == 0:
            assert sql_findings(snap) == {}, step
    assert all(seen.values()), seen
    assert torch is not None


def test_a_chunk_cache_keeps_no_page_and_is_captured_as_none() -> None:
    """With the radix cache disabled SGLang 0.5.21 runs a ChunkCache, which keeps no page
    of its own (0.5.23 has none): captured as no tree."""
    chunk_cache = pytest.importorskip("sglang.srt.mem_cache.chunk_cache")
    from sglang.srt.mem_cache import cache_init_params

    e = two_sharing()
    cache = chunk_cache.ChunkCache(
        cache_init_params.CacheInitParams(
            disable=True,
            req_to_token_pool=e.rtt,
            token_to_kv_pool_allocator=e.allocator,
            page_size=PAGE_SIZE,
        )
    )
    snap = sglang.capture(
        e.rtt, e.allocator, cache, seq_lens=e.seq_lens(), request_ids=e.request_ids()
    )
    assert "tree_pages" not in snap.arrays  # (a radix tree's walk would have failed on it)
    assert check_snapshot(snap) == []
