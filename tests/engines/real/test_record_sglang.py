"""Issue 11's recorder on the real SGLang pools: its log replays to exactly the state
capture() reads at the end (pages as blocks)."""

from __future__ import annotations

from pathlib import Path

import pagedkv_sql
from pagedkv_sql.engines import sglang
from pagedkv_sql.replay.record_sglang import Recorder

from .resolved import as_slots, grow_then_finish, pool_addressing, replayed, resolved_tokens
from .sglang_driver import PAGE_SIZE, Engine
from .test_sglang import PREFIX


def test_the_log_replays_to_the_captured_state(tmp_path: Path) -> None:
    log = tmp_path / "sglang.jsonl"
    e = Engine()
    rec = Recorder(e.rtt, e.allocator, log, e.tree)
    for rid, tokens in (("a", [*PREFIX, *range(100, 108)]), ("b", [*PREFIX, *range(200, 210)])):
        rec.name(e.rtt.free_slots[-1], rid)  # the row alloc_rows hands out next
        e.schedule(rid, tokens)
        if rid == "a":
            e.cache_prefix("a", 32)
        rec.step()
    rec.name(e.rtt.free_slots[-1], "c")
    e.schedule("c", [*PREFIX, *range(300, 340)])
    rec.step()
    last = grow_then_finish(e, rec)

    def replayed_slots(db: pagedkv_sql.Database) -> list[tuple[str, int, int]]:
        return as_slots(resolved_tokens(db, "pagedkv_request_label"), 0, 256, PAGE_SIZE)

    after = replayed(log, last, tmp_path / "replayed.duckdb", replayed_slots)
    snap = sglang.capture(
        e.rtt, e.allocator, e.tree, seq_lens=e.seq_lens(), request_ids=e.request_ids()
    )
    with pagedkv_sql.connect(":memory:") as db:
        db.load_engine(snap)
        captured = as_slots(resolved_tokens(db), *pool_addressing(db), PAGE_SIZE)
    assert after == captured
    assert {r for r, _, _ in captured} == {"b", "c"}
