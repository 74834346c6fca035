"""SGLang's sliding-window hybrid cache (engines/sglang_swa.py) on the real SWAKVPool,
SWATokenToKVPoolAllocator and UnifiedRadixCache(FULL, SWA), driven through the scheduler's
own paths (sglang_swa_driver.py): a workload with a shared prefix, decodes past the
window (pages dropped from it), finishes and evictions is silent at every step; an SWA page
freed inside a request's window, and one on the SWA free list while a request maps it,
are named with the request and the block."""

from __future__ import annotations

import random

import pytest

import pagedkv_sql
from pagedkv_sql.engines import check_snapshot, sglang

from .helpers import sql_findings
from .sglang_driver import _base, hit
from .sglang_swa_driver import PAGE, SWAScheduler, torch

PREFIX = list(range(8))


def workload() -> tuple[SWAScheduler, dict[str, int]]:
    """a (a short prompt, finished before the window fills: cached whole); b on a's prefix
    decodes past the window; c on the same prefix; a's prefix evicted once unlocked."""
    s = SWAScheduler()
    seen = {"prefix hits": 0, "dropped": 0, "evicted": 0}
    s.prefill(("a", [*PREFIX, 100, 101]))
    s.silent()
    s.decode()
    s.finish("a")
    s.silent()
    (b,) = s.prefill(("b", [*PREFIX, 200, 201, 202]))
    seen["prefix hits"] += hit(b) > 0
    for _ in range(14):
        s.decode()
        s.silent()
    seen["dropped"] = s.evicted("b")
    (c,) = s.prefill(("c", [*PREFIX, 300]))
    seen["prefix hits"] += hit(c) > 0
    s.silent()
    for rid in ("b", "c"):
        s.decode()
        s.finish(rid)
        s.silent()
    out = s.tree.evict(_base.EvictParams(num_tokens=8 * PAGE, swa_num_tokens=8 * PAGE))
    seen["evicted"] = int(out.num_tokens_evicted)
    s.silent()
    return s, seen


def test_a_sliding_window_workload_is_silent_at_every_step() -> None:
    s, seen = workload()
    assert seen["prefix hits"] == 2, seen
    assert seen["dropped"] >= 2 * PAGE, seen  # pages left b's window
    assert seen["evicted"] > 0, seen
    assert sql_findings(s.snapshot()) == {}


def running_past_the_window() -> SWAScheduler:
    s = SWAScheduler()
    s.prefill(("b", [*PREFIX, 200, 201, 202]))
    for _ in range(14):
        s.decode()
    assert s.evicted("b") >= 2 * PAGE and s.swa_slots("b")[0] == 0
    s.silent()  # the window-dropped pages are placeholders, not missing
    return s


def test_swa_pools_and_groups_are_imported_apart(db: pagedkv_sql.Database) -> None:
    s = running_past_the_window()
    db.load_engine(s.snapshot())
    groups = db.sql(
        "SELECT group_id, kind, block_size, window_tokens, is_primary FROM engine_kv_group "
        "ORDER BY 1"
    ).fetchall()
    assert groups == [
        (0, "full_attention", PAGE, None, True),
        (1, "sliding_window", PAGE, 9, False),  # SGLang's window 8 and the query
    ]
    pools = db.sql("SELECT pool_id, num_blocks FROM engine_pool ORDER BY 1").fetchall()
    assert pools == [(0, 17), (1, 9)]  # each pool's pages and its reserved page 0
    # b's SWA list: the dropped entries are pool 1's null page, the window's are real pages
    rows = db.sql(
        "SELECT block_index, block_id FROM engine_block_table WHERE group_id = 1 ORDER BY 1"
    ).fetchall()
    dropped = s.evicted("b") // PAGE
    assert [b for _, b in rows[:dropped]] == [0] * dropped
    assert all(b > 0 for _, b in rows[dropped:]), rows
    assert db.check().ok(strict=True), db.violations().to_pylist()


def test_an_swa_page_freed_inside_the_window_is_named() -> None:
    s = running_past_the_window()
    row = s.rows()["b"]
    inside = (len(row) - 1) // PAGE - 1  # the page before the last: inside the window
    s.allocator.free_swa(torch.tensor(row[inside * PAGE : (inside + 1) * PAGE]))
    found = [str(f) for f in check_snapshot(s.snapshot())]
    assert found == [
        f"unresolved_token (diag_engine_unresolved_token): request b holds no block at "
        f"entry {inside} of KV-cache group 1 (sliding_window 9, block size {PAGE}): a "
        f"placeholder, though the group keeps tokens {inside * PAGE}..{inside * PAGE + 3} of "
        f"its {len(row)} computed tokens there [request b]"
    ], found
    assert list(sql_findings(s.snapshot())) == ["diag_engine_unresolved_token"]


def test_an_swa_page_free_while_mapped_is_named() -> None:
    s = running_past_the_window()
    last = s.swa_slots("b")[-1]
    page = last // PAGE
    # the SWA allocator takes the page back, the mapping still points b at it
    s.allocator.swa_attn_allocator.free(torch.arange(page * PAGE, (page + 1) * PAGE))
    found = check_snapshot(s.snapshot())
    held = [f for f in found if f.check == "diag_engine_held_free_block"]
    assert [(f.request_ids, f.block_id) for f in held] == [(("b",), page)], found
    assert f"request b holds block {page}, which is in the free queue" in held[0].reason
    with pytest.raises(AssertionError, match=f"request b holds block {page}"):
        sglang.assert_consistent(s.rtt, s.allocator, s.tree, reqs=s.reqs())


def test_assert_consistent_is_silent_on_the_healthy_cache() -> None:
    s = running_past_the_window()
    sglang.assert_consistent(s.rtt, s.allocator, s.tree, reqs=s.reqs())


def test_an_swa_page_unmapped_but_never_freed_is_a_leak_of_the_swa_pool() -> None:
    s = running_past_the_window()
    row = s.rows()["b"]
    page = s.swa_slots("b")[-1] // PAGE
    last = (len(row) - 1) // PAGE * PAGE
    # the mapping forgets the last page's SWA peer, the SWA allocator never gets it back
    s.allocator.clear_full_to_swa_mapping(torch.tensor(row[last:], dtype=torch.int64))
    found = check_snapshot(s.snapshot())
    leaks = [f for f in found if f.check == "diag_engine_leak"]
    assert [f.block_id for f in leaks] == [page], [str(f) for f in found]
    assert "(leaked)" in leaks[0].reason


def test_a_random_sliding_window_schedule_stays_silent() -> None:
    """Requests on shared prefixes admitted while both pools have room (the tree evicted
    when they have not), decoded past the window a step at a time, finished: the fast check
    silent on every state, the SQL views on every tenth."""
    rng = random.Random(3521)
    s = SWAScheduler(full_pages=24, swa_pages=16)
    prefixes = [list(range(p * 100, p * 100 + 12)) for p in range(3)]
    seen = {"prefix hits": 0, "dropped": 0, "evicted": 0, "finished": 0}
    running: set[str] = set()

    def room(tokens: int) -> bool:
        need = (-(-tokens // PAGE) + 1) * PAGE
        a = s.allocator
        if min(a.full_available_size(), a.swa_available_size()) < need:
            out = s.tree.evict(_base.EvictParams(num_tokens=need, swa_num_tokens=need))
            seen["evicted"] += int(out.num_tokens_evicted) > 0
        return min(a.full_available_size(), a.swa_available_size()) >= need

    for step in range(120):
        action = rng.random()
        if (action < 0.25 or not running) and len(running) < 4:
            tokens = rng.choice(prefixes)[: rng.randint(4, 12)] + [1000 + step] * rng.randint(1, 5)
            if not room(len(tokens)):
                continue
            (req,) = s.prefill((f"r{step}", tokens))
            seen["prefix hits"] += hit(req) > 0
            running.add(req.rid)
        elif action < 0.85 and running:
            if not room(PAGE * len(running)):
                continue
            s.decode()
            seen["dropped"] = max([seen["dropped"], *(s.evicted(rid) for rid in running)])
        elif running:
            rid = rng.choice(sorted(running))
            s.finish(rid)
            running.discard(rid)
            seen["finished"] += 1
        snap = s.snapshot()
        found = check_snapshot(snap)
        assert found == [], (step, [str(f) for f in found])
        if step % 10 == 0:
            assert sql_findings(snap) == {}, step
    assert all(seen.values()), seen
