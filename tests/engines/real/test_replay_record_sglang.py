"""The SGLang recorder on the scheduler's own paths. SGLang 0.5.21's
``prepare_for_extend`` / ``prepare_for_decode`` allocate (``alloc_extend`` /
``alloc_decode``), ``release_kv_cache`` finishes, ``retract_decode`` preempts, the radix
cache shares and evicts; the recorder reads ``req_to_token`` rows at each step's end. A
healthy schedule replays with no finding to the live rows; faults planted in the engine's
free path are found at their step, naming request and page."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql.replay.record_sglang import Recorder

from .resolved import as_slots, replayed, resolved_tokens
from .sglang_driver import PAGE_SIZE, BatchScheduler, _base

PREFIX = list(range(32))


def schedule(e: BatchScheduler, rec: Recorder) -> dict[str, int]:
    """Prefix sharing, decode across page boundaries, a finish whose pages the tree
    keeps, an eviction under a small pool, a retraction and its resumption."""
    steps: dict[str, int] = {}

    def step(name: str | None = None) -> None:
        n = rec.step(e.reqs())
        if name:
            steps[name] = n - 1

    e.prefill(("a", [*PREFIX, *range(100, 108)]))
    step()
    for _ in range(10):  # a: 41 -> 51 tokens, across the page boundary at 48
        e.decode()
        step()
    e.finish("a")  # the tree keeps a's 3 whole pages
    step("finish a")
    e.prefill(("b", [*PREFIX, *range(200, 210)]), ("c", [*PREFIX, *range(300, 340)]))
    step("share")
    e.prefill(("d", list(range(400, 480))))  # 5 pages: evicts a's unshared page
    step("evict")
    for _ in range(12):  # b and c grow; the pool runs out: d is retracted
        if not e.running.check_decode_mem():
            assert e.retract() == ["d"]
            step("retract")
        e.decode()
        step()
    e.finish("b")
    step("finish b")
    e.prefill(("d", []))  # d resumes: matched again, its table again
    step("resume")
    for _ in range(3):
        e.decode()
        step()
    e.finish("c")
    step("finish c")
    return steps


def replayed_rows(db: pagedkv_sql.Database) -> list[tuple[str, int, int]]:
    return as_slots(resolved_tokens(db, "pagedkv_request_label"), 0, 256, PAGE_SIZE)


def live_rows(e: BatchScheduler) -> list[tuple[str, int, int]]:
    return sorted((rid, p, s) for rid, slots in e.rows().items() for p, s in enumerate(slots))


def test_a_healthy_schedule_replays_to_the_live_rows(tmp_path: Path) -> None:
    log = tmp_path / "sglang.jsonl"
    e = BatchScheduler(num_pages=12)
    rec = Recorder(e.rtt, e.allocator, log, e.tree)
    steps = schedule(e, rec)
    rec.close()
    lines = {s["step"]: s["ops"] for s in map(json.loads, log.read_text().splitlines()[1:])}

    def acquired(step: int, rid: str) -> list[tuple[str, int]]:
        return [
            (o["op"], *o["blocks"]) for o in lines[step] if o.get("req") == rid and "blocks" in o
        ]

    # b and c share a's two prefix pages (the tree's), their other pages are fresh
    shared = acquired(steps["share"], "b")[:2]
    assert [op for op, _ in shared] == ["share", "share"]
    assert acquired(steps["share"], "c")[:2] == shared
    assert {op for op, _ in acquired(steps["share"], "c")[2:]} == {"allocate"}
    # d's allocation evicts a's page the tree alone held, and takes it fresh
    evicted = [o["blocks"] for o in lines[steps["evict"]] if o["op"] == "evict"]
    assert evicted and all(op == "allocate" for op, _ in acquired(steps["evict"], "d"))
    assert evicted[0][0] in [b for _, b in acquired(steps["evict"], "d")]
    assert {"op": "preempt", "req": "d"} in lines[steps["retract"]]
    assert acquired(steps["resume"], "d")  # its table again
    last = rec.step_no - 1
    assert replayed(log, last, tmp_path / "replayed.duckdb", replayed_rows) == live_rows(e)


def finish_with_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plant: Callable[[Any, dict[str, Any]], None]
) -> tuple[list[Any], int, int]:
    state: dict[str, Any] = {"row": None}
    plant(monkeypatch, state)
    log = tmp_path / "fault.jsonl"
    e = BatchScheduler(num_pages=12)
    rec = Recorder(e.rtt, e.allocator, log, e.tree)
    e.prefill(("a", [*PREFIX, *range(100, 108)]))
    rec.step(e.reqs())
    e.finish("a")  # the tree keeps a's prefix: b and c run on it, locked
    rec.step(e.reqs())
    e.prefill(("b", [*PREFIX, *range(200, 230)]), ("c", [*PREFIX, *range(300, 310)]))
    rec.step(e.reqs())
    for _ in range(3):
        e.decode()
        rec.step(e.reqs())
    (b,) = [r for r in e.running.reqs if r.rid == "b"]
    state["row"] = b.kv.req_pool_idx
    tail = int(e.rtt.req_to_token[b.kv.req_pool_idx, b.kv.kv_allocated_len - 1]) // PAGE_SIZE
    e.finish("b")
    at = rec.step(e.reqs()) - 1
    e.decode()
    rec.step(e.reqs())
    rec.close()
    with pagedkv_sql.connect(":memory:") as db:
        return db.replay(log, keep_going=True).findings, at, tail


def test_a_page_freed_twice_is_a_double_free_at_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def plant(mp: pytest.MonkeyPatch, state: dict[str, Any]) -> None:
        original = _base.BasePrefixCache.free_kv_row

        def free_kv_row(self: Any, kv: Any, ranges: list[tuple[int, int]]) -> None:
            original(self, kv, ranges)
            if kv.req_pool_idx == state["row"] and ranges and ranges[-1][1] > ranges[-1][0]:
                row = self.req_to_token_pool.req_to_token[kv.req_pool_idx]
                self.token_to_kv_pool_allocator.free(row[ranges[-1][1] - 1 : ranges[-1][1]])

        mp.setattr(_base.BasePrefixCache, "free_kv_row", free_kv_row)

    found, at, tail = finish_with_fault(tmp_path, monkeypatch, plant)
    # b's release puts its last page on the free list twice: b's free gave it back twice
    # (a double free, first, naming b), and the free list shows it twice; b's tokens went
    # with b, none is left unresolved
    got = [(f.check, f.step, f.request, f.block_id) for f in found]
    assert got == [(k, at, "b", tail) for k in ("double_free", "free_list_duplicate")], found


def test_a_page_the_free_drops_is_named_at_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def plant(mp: pytest.MonkeyPatch, state: dict[str, Any]) -> None:
        original = _base.BasePrefixCache.free_kv_row

        def free_kv_row(self: Any, kv: Any, ranges: list[tuple[int, int]]) -> None:
            if kv.req_pool_idx == state["row"] and ranges:
                start, end = ranges[-1]
                end = max(start, (end - 1) // PAGE_SIZE * PAGE_SIZE)  # the last page kept
                ranges = [*ranges[:-1], (start, end)]
            original(self, kv, ranges)

        mp.setattr(_base.BasePrefixCache, "free_kv_row", free_kv_row)

    found, at, tail = finish_with_fault(tmp_path, monkeypatch, plant)
    # b's free kept its last page back: a leak, first, naming b; the engine then counts
    # the page in use (not free, not cached, in no row) where replay has no holder
    got = [(f.check, f.step, f.request, f.block_id) for f in found]
    assert got == [("leak", at, "b", tail), ("refcount_mismatch", at, "b", tail)], found


def test_a_lock_ref_decrement_skipped_is_named_at_its_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def plant(mp: pytest.MonkeyPatch, state: dict[str, Any]) -> None:
        if not hasattr(_base.BasePrefixCache, "unpin"):  # 0.5.23: unlock(TreeLock)
            release = _base.BasePrefixCache.unlock

            def unlock(self: Any, lock: Any) -> None:
                if state["row"] is None or state.setdefault("skipped", False):
                    release(self, lock)
                else:  # b's release, the first once b's row is known
                    state["skipped"] = True

            mp.setattr(_base.BasePrefixCache, "unlock", unlock)
            return
        original = _base.BasePrefixCache.unpin

        def unpin(self: Any, req: Any) -> None:
            if req.kv.req_pool_idx != state["row"]:
                original(self, req)

        mp.setattr(_base.BasePrefixCache, "unpin", unpin)

    found, at, _ = finish_with_fault(tmp_path, monkeypatch, plant)
    # b's prefix node keeps b's lock: lock_ref 2 on the two prefix pages, c alone holds them
    got = {(f.check, f.step, f.block_id, f.expected, f.found) for f in found}
    assert got == {
        ("refcount_mismatch", at, page, "1 holder(s) replayed", "ref_cnt 2") for page in (1, 2)
    }, found
