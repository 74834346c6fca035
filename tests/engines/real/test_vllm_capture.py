"""`vllm.capture` on every state the real vLLM 0.32.0 KVCacheManager reaches in the
scheduler's own order (allocate, compute, sample): a prompt that fills its blocks plus the
sampled token, chunked prefill, lookahead slots, preemption; the fast check and the SQL
views silent on all of them; the block-hash invariant finding a prefix hit in the wrong
order."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from pagedkv_sql.engines import check_snapshot, vllm
from pagedkv_sql.errors import InputError

from .conftest import sql_findings
from .vllm_driver import Scheduler


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
        ("diag_engine_block_hash_mismatch", ("b",), 2),
        ("diag_engine_block_hash_mismatch", ("b",), 1),
    }
    assert sorted(sql_findings(snap)) == ["diag_engine_block_hash_mismatch"]


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
