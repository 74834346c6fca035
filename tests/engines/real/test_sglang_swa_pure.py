"""SGLang's all-sliding-window cache (engines/sglang_swa.py, ``is_pure``) on the real
SWAKVPool of one sliding-window layer, PureSWATokenToKVPoolAllocator and PureSWARadixCache,
driven through the scheduler's own paths (sglang_swa_driver.py): one pool, one
sliding-window group; the slots a request's window freed (which its row keeps, there being
no mapping to clear) read as placeholders. A workload with a shared prefix, decodes past the
window, finishes and evictions is silent at every step; a slot freed inside a request's
window is named with the request and the slot.

Before this cache was told from the two-pool one, the state of ``running_past_the_window``
gave 25 findings (the slots b's window freed counted held and free, in both "pools")."""

from __future__ import annotations

import pytest

import pagedkv_sql
from pagedkv_sql.engines import check_snapshot, sglang
from pagedkv_sql.errors import UsageError
from pagedkv_sql.fuzz.sglang_kinds import PURE_WINDOW

from .helpers import sql_findings
from .sglang_driver import _base, hit
from .sglang_swa_driver import PureSWAScheduler, torch

PREFIX = list(range(6))


def running_past_the_window() -> PureSWAScheduler:
    """b on a's cached prefix, decoded until its window has freed slots."""
    s = PureSWAScheduler()
    s.prefill(("a", [*PREFIX, 100]))
    s.decode()
    s.finish("a")
    (b,) = s.prefill(("b", [*PREFIX, 200, 201]))
    assert hit(b) > 0
    for _ in range(10):
        s.decode()
        s.silent()
    lo, hi = s.freed("b")
    assert hi > lo, (lo, hi)  # the window freed slots of b's own
    return s


def test_an_all_sliding_window_workload_is_silent_at_every_step() -> None:
    s = running_past_the_window()
    (c,) = s.prefill(("c", [*PREFIX, 300]))
    assert hit(c) > 0
    s.silent()
    for rid in ("b", "c"):
        s.decode()
        s.silent()
        s.finish(rid)
        s.silent()
    out = s.tree.evict(_base.EvictParams(num_tokens=32, swa_num_tokens=32))
    assert int(out.num_tokens_evicted) > 0
    s.silent()
    assert sql_findings(s.snapshot()) == {}


def test_one_pool_and_one_sliding_window_group_are_imported(db: pagedkv_sql.Database) -> None:
    s = running_past_the_window()
    lo, hi = s.freed("b")
    db.load_engine(s.snapshot())
    groups = db.sql(
        "SELECT group_id, kind, block_size, window_tokens, is_primary FROM engine_kv_group"
    ).fetchall()
    assert groups == [(0, "sliding_window", 1, PURE_WINDOW + 1, True)]
    assert db.sql("SELECT pool_id, num_blocks FROM engine_pool").fetchall() == [(0, 49)]
    rows = db.sql(
        "SELECT block_index, block_id FROM engine_block_table bt JOIN engine_request r "
        "USING (seq_id) WHERE r.request_id = 'b' ORDER BY 1"
    ).fetchall()
    # what the window freed is the null page; the tree's prefix and the window keep slots
    assert [b for i, b in rows if lo <= i < hi] == [0] * (hi - lo)
    assert all(b > 0 for i, b in rows if not lo <= i < hi), rows
    assert db.check().ok(strict=True), db.violations().to_pylist()


def test_a_slot_freed_inside_the_window_is_named() -> None:
    s = running_past_the_window()
    row = s.rows()["b"]
    inside = row[-2]  # the token before the last: inside any window
    s.allocator.free_swa(torch.tensor([inside]))
    found = [f for f in check_snapshot(s.snapshot()) if f.check == "diag_engine_held_free_block"]
    assert [(f.request_ids, f.block_id) for f in found] == [(("b",), inside)], found
    assert "diag_engine_held_free_block" in sql_findings(s.snapshot())
    with pytest.raises(AssertionError, match=f"request b holds block {inside}"):
        sglang.assert_consistent(s.rtt, s.allocator, s.tree, reqs=s.reqs())


def test_assert_consistent_is_silent_on_the_healthy_cache() -> None:
    s = running_past_the_window()
    sglang.assert_consistent(s.rtt, s.allocator, s.tree, reqs=s.reqs())


def test_a_capture_without_the_requests_is_refused() -> None:
    s = running_past_the_window()
    with pytest.raises(UsageError, match=r"all-sliding-window cache .* needs the requests"):
        sglang.capture(s.rtt, s.allocator, s.tree, seq_lens=s.seq_lens())
