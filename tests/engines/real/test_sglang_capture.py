"""The SGLang page invariants on the real SGLang 0.5.21 allocator, ReqToTokenPool and
RadixCache: every page free, in the radix tree or held by a row, once; a
tree page never in the free list; a node's lock_ref at least the rows running on it. Silent
on a random schedule the way SGLang's scheduler keeps the cache; each planted bug found."""

from __future__ import annotations

import random
from typing import Any

from pagedkv_sql.engines import check_snapshot, sglang

from .conftest import sql_findings
from .sglang_driver import Scheduler, _base, _radix, prefix_indices, torch

PAGE = 4


def capture(e: Scheduler) -> Any:
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
    snap = capture(e)
    assert fast(snap) == {} and sql_findings(snap) == {}
    e.finish("a")
    e.finish("b")
    snap = capture(e)
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
    snap = capture(e)
    expected = {
        "diag_engine_page_conservation": [
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
    snap = capture(e)
    found = fast(snap)
    pages = sorted({int(s) // PAGE for s in node.value.tolist()})
    assert sorted(found["diag_engine_tree_page_free"]) == [
        f"page {p} is in the radix tree (lock_ref 2) and in the free list at position {i}"
        for i, p in enumerate(pages)
    ]
    assert "diag_engine_page_conservation" in found  # free and in the tree: counted twice
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
    snap = capture(e)
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
        snap = capture(e)
        assert fast(snap) == {}, (step, fast(snap))
        if step % 10 == 0:
            assert sql_findings(snap) == {}, step
    assert all(seen.values()), seen
    assert torch is not None
