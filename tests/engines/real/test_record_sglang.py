"""Issue 11's recorder on the real SGLang pools: its log replays to exactly the state
capture() reads at the end (pages as blocks)."""

from __future__ import annotations

from pathlib import Path

import pagedkv_sql
from pagedkv_sql.engines import sglang
from pagedkv_sql.replay.record_sglang import Recorder

from .sglang_driver import PAGE_SIZE, Engine
from .test_sglang import PREFIX


def slots(db: pagedkv_sql.Database, label: str, base: int, step: int) -> list[tuple[str, int, int]]:
    rows = db.sql(
        f"SELECT l.request_id, a.token_pos, a.physical_address FROM resolved_kv_address a "
        f"JOIN {label} l USING (seq_id) ORDER BY ALL"
    ).fetchall()
    out = []
    for rid, pos, addr in rows:
        page, offset = divmod(addr - base, step)
        out.append((str(rid), int(pos), page * PAGE_SIZE + offset))
    return out


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
    for t in range(20):
        e.decode("b", 1000 + t)
        rec.step()
    e.finish("a")
    last = rec.step() - 1
    rec.close()

    with pagedkv_sql.connect(tmp_path / "replayed.duckdb") as db:
        report = db.replay(log)
        assert report.ok, report.findings[:3]
        db.replay_at(last)
        replayed = slots(db, "pagedkv_request_label", 0, 256)
    snap = sglang.capture(
        e.rtt, e.allocator, e.tree, seq_lens=e.seq_lens(), request_ids=e.request_ids()
    )
    with pagedkv_sql.connect(":memory:") as db:
        db.load_engine(snap)
        base, step = db.sql("SELECT base, block_step FROM engine_pool").fetchall()[0]
        captured = slots(db, "engine_request", base, step)
    assert replayed == captured
    assert {r for r, _, _ in captured} == {"b", "c"}
