"""The real vLLM 0.32.0 KVCacheManager on the CPU: allocate, share a prefix, grow, free;
capture on every state the scheduler reaches (chunked prefill, lookahead slots,
preemption); load; every resolved token against vLLM's own block ids and slots; the
corruptions of vLLM #42571 and #37076 and a double free named by `check`; and
`assert_consistent` silent on healthy states, naming request and block on broken ones."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines import check_snapshot, vllm
from pagedkv_sql.errors import InputError

from .helpers import PREFIX, sql_findings
from .resolved import resolved_slots
from .vllm_driver import BLOCK_SIZE, Engine, Scheduler
from .vllm_driver import Scheduler as VLLM


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
    mismatch = {r["block_id"] for r in found["diag_engine_refcount_mismatch"]}
    assert mismatch == {5}  # ref_cnt 1, held twice
    # and what it leads to: finishing b frees block 5 twice
    e.finish("b")
    assert e.ref_cnt(5) == -1
    db2 = pagedkv_sql.connect(":memory:")
    db2.load_engine(vllm.capture(e.manager, e.requests))
    rows = findings(db2)["diag_engine_refcount_mismatch"]
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
    rows = findings(db2)["diag_engine_refcount_mismatch"]
    assert [r["block_id"] for r in rows] == [5], rows
    assert "b" in str(rows) and "c" in str(rows)


def test_vllm_healthy_and_a_double_free() -> None:
    e = VLLM(num_blocks=8, block_size=4)
    e.admit("a", [1, 2, 3, 4])  # 5 tokens on 1 block: the sampled token not computed yet
    vllm.assert_consistent(e.manager, e.requests)
    vllm.assert_consistent(e.manager)  # without requests: every slot a token
    e.admit("b", [9, 8, 7, 6, 5])
    held = list(e.manager.coordinator.single_type_managers[0].req_to_blocks["b"])
    e.pool.free_blocks(held[-1:])  # b's last block back to the free queue while b holds it
    with pytest.raises(AssertionError) as info:
        vllm.assert_consistent(e.manager, e.requests)
    text = str(info.value)
    assert text.startswith("vLLM KV cache is inconsistent: 2 finding(s)\n")
    assert (
        "use_after_free (diag_engine_held_free_block): request b holds block "
        f"{held[-1].block_id}, which is in the free queue at position" in text
    )
    assert f"[request b; block {held[-1].block_id}]" in text


def test_vllm_a_state_that_cannot_be_mapped() -> None:
    e = VLLM(num_blocks=8, block_size=4)
    e.admit("a", [1, 2, 3])
    e.requests["a"].num_computed_tokens = 6
    with pytest.raises(AssertionError, match="vLLM KV cache state cannot be mapped") as info:
        vllm.assert_consistent(e.manager, e.requests)
    assert "request 'a': num_computed_tokens 6 but it holds 1 block(s) of 4 slots" in str(
        info.value
    )


def test_a_full_block_prompt_and_its_sampled_token() -> None:
    """A 4-token prompt with block size 4, computed, then sampled: 5 tokens on 1 block.
    capture must not raise a bare IndexError in slot_mapping here; the sampled token's KV is
    not written, so the state holds 4 tokens, all in block 1."""
    e = Scheduler(num_blocks=8, block_size=4)
    r = e.admit("a", [1, 2, 3, 4])
    assert (r.num_tokens, r.num_computed_tokens, e.blocks("a")) == (5, 4, [1])
    snap = vllm.capture(e.manager, e.requests)
    assert snap.arrays["num_tokens"].tolist() == [4]
    assert snap.arrays["slot_mapping"].tolist() == [4, 5, 6, 7]
    assert check_snapshot(snap) == []
    assert sql_findings(snap) == {}
    e.step("a")  # the sampled token's step: block 2 for it
    snap = vllm.capture(e.manager, e.requests)
    assert snap.arrays["slot_mapping"].tolist() == [4, 5, 6, 7, 8]
    assert check_snapshot(snap) == []


def test_chunked_prefill_and_lookahead_slots() -> None:
    e = Scheduler(num_blocks=16, block_size=4)
    e.admit("a", list(range(10)), chunk=3, lookahead=2)  # 3 computed, 5 slots: 2 blocks
    snap = vllm.capture(e.manager, e.requests)
    assert e.blocks("a") == [1, 2]
    assert snap.arrays["num_tokens"].tolist() == [3]
    e.step("a", chunk=3, lookahead=2)  # 6 computed, 8 slots
    e.step("a", chunk=4, lookahead=3)  # prefill done: 10 computed + sampled, 13 slots
    r = e.requests["a"]
    assert (r.num_tokens, r.num_computed_tokens, len(e.blocks("a"))) == (11, 10, 4)
    snap = vllm.capture(e.manager, e.requests)
    assert snap.arrays["slot_mapping"].size == 10
    assert check_snapshot(snap) == []
    assert sql_findings(snap) == {}


def test_a_state_capture_cannot_map_names_the_request() -> None:
    """A request whose computed tokens are beyond its blocks (as a manager that lost a
    block would leave it) is an InputError naming the request, never an IndexError."""
    e = Scheduler(num_blocks=8, block_size=4)
    e.admit("a", [1, 2, 3, 4, 5])
    e.requests["a"].num_computed_tokens = 9  # 2 blocks hold 8 slots
    with pytest.raises(InputError, match="'a'") as info:
        vllm.capture(e.manager, e.requests)
    assert "num_computed_tokens 9 but it holds 2 block(s) of 4 slots" in str(info.value.details)


def test_a_prefix_hit_in_the_wrong_order_is_found_by_the_block_hashes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A planted bug: the prefix hit hands the cached blocks back reversed. Every count is
    right (ref_cnt, free queue), only the block hashes show that b reads a's KV in the
    wrong order."""
    e = Scheduler(num_blocks=16, block_size=4)
    e.admit("a", list(range(12)))  # 3 full blocks cached
    real = e.manager.get_computed_blocks

    def reversed_hit(request: Any) -> Any:
        blocks, num_hit, *rest = real(request)
        for group in blocks.blocks:
            group.reverse()
        return (blocks, num_hit, *rest)

    monkeypatch.setattr(e.manager, "get_computed_blocks", reversed_hit)
    e.admit("b", [*range(8), 99, 98])  # hits a's first two blocks: 2, 1 instead of 1, 2
    assert e.blocks("b")[:2] == [2, 1]
    snap = vllm.capture(e.manager, e.requests)
    found = check_snapshot(snap)
    assert {(f.check, f.request_ids, f.block_id) for f in found} == {
        ("diag_engine_prefix_hash", ("b",), 2),
        ("diag_engine_prefix_hash", ("b",), 1),
    }
    assert sorted(sql_findings(snap)) == ["diag_engine_prefix_hash"]


def test_a_random_schedule_stays_silent() -> None:
    """Many requests sharing prefixes, chunked prefill, lookahead, decodes, preemptions,
    resumptions and finishes on a pool small enough to run out: every state captured, the
    fast check silent on each, the SQL views (the reference) silent on every tenth."""
    rng = random.Random(27)
    e = Scheduler(num_blocks=24, block_size=4)
    prefixes = [list(range(p * 100, p * 100 + 9)) for p in range(3)]
    waiting: list[str] = []
    seen = {"hits": 0, "preempted": 0, "resumed": 0, "states": 0}
    for step in range(240):
        running = [rid for rid in e.requests if rid not in waiting]
        action = rng.random()
        if action < 0.3 or not running:
            rid = f"r{step}"
            prompt = rng.choice(prefixes)[: rng.randint(2, 9)] + [step] * rng.randint(0, 6)
            r = e.admit(rid, prompt, chunk=rng.choice([None, 3, 5]), lookahead=rng.choice([0, 2]))
            if r is None:
                continue
            seen["hits"] += int(r.num_computed_tokens > 0 and e.ref_cnt(e.blocks(rid)[0]) > 1)
        elif action < 0.85:
            rid = rng.choice(running)
            if not e.step(rid, chunk=rng.choice([None, 2]), lookahead=rng.choice([0, 1, 3])):
                e.preempt(rid)
                waiting.append(rid)
                seen["preempted"] += 1
        elif action < 0.95 and waiting:
            rid = waiting[0]
            if e.resume(rid, chunk=rng.choice([None, 4])):
                waiting.remove(rid)
                seen["resumed"] += 1
        else:
            rid = rng.choice(running)
            e.finish(rid)
        snap = vllm.capture(e.manager, {k: v for k, v in e.requests.items() if k not in waiting})
        assert check_snapshot(snap) == [], (step, [str(f) for f in check_snapshot(snap)])
        seen["states"] += 1
        if step % 10 == 0:
            assert sql_findings(snap) == {}, step
    assert seen["hits"] and seen["preempted"] and seen["resumed"], seen


def test_capture_hashes_are_the_blocks_own() -> None:
    """The captured request hashes are written as vLLM writes a block's hash (hash bytes
    and the group id): on a healthy state they equal the held blocks' hashes."""
    e = Scheduler(num_blocks=8, block_size=4)
    e.admit("a", list(range(9)))
    snap = vllm.capture(e.manager, e.requests)
    hashes = snap.meta["request_block_hashes"][0][0]
    blocks = e.blocks("a")
    assert len(hashes) == 2  # two full blocks of the 9 tokens
    assert hashes == [snap.meta["block_hashes"][str(b)] for b in blocks[:2]]
    assert np.array_equal(snap.arrays["num_tokens"], [9])
