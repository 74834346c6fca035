"""The step recorder on the real vLLM KVCacheManager: its log replays to exactly the
state capture() reads at the end, the #37076 interleaving is reported at its step, and a
leak and a double free planted in the pool's free path are replay's first finding, naming
request and block."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import pagedkv_sql
from pagedkv_sql.cli import app
from pagedkv_sql.engines import vllm
from pagedkv_sql.replay.record_vllm import Recorder

from .helpers import PREFIX, engine_modules
from .resolved import grow_then_finish, replayed, resolved_tokens
from .vllm_driver import Engine, Scheduler
from .vllm_groups_driver import Driver
from .vllm_groups_driver import manager as groups_manager

_manager, _pool = engine_modules("vllm.v1.core.kv_cache_manager", "vllm.v1.core.block_pool")


def test_the_log_replays_to_the_captured_state(tmp_path: Path) -> None:
    log = tmp_path / "vllm.jsonl"
    e = Engine(num_blocks=16)
    rec = Recorder(e.manager, log)
    e.schedule("a", [*PREFIX, *range(100, 120)])
    rec.step()
    e.schedule("b", [*PREFIX, *range(200, 210)])
    e.schedule("c", [*PREFIX, *range(300, 340)])
    rec.step()
    last = grow_then_finish(e, rec)

    labelled = partial(resolved_tokens, label="pagedkv_request_label")
    after = replayed(log, last, tmp_path / "replayed.duckdb", labelled)
    with pagedkv_sql.connect(":memory:") as db:
        db.load_engine(vllm.capture(e.manager, e.requests))
        captured = resolved_tokens(db)
    assert after == captured
    assert {r for r, _, _ in captured} == {"b", "c"}


def test_the_37076_interleaving_is_reported_at_its_step(tmp_path: Path) -> None:
    """a, then e finish and leave their blocks cached (ref_cnt 0; the free queue is the
    never-used blocks, then a's cached 3, 2, 1, then e's); b's lookup finds blocks 1 and 2;
    before b takes them, in the same step, c's allocation takes the queue up to block 1,
    evicting and reusing 2 and 1; b then takes them, its new block from e's. (A lookup still
    untaken at the end of its step is dropped, as vLLM's scheduler drops it; so is one
    allocate_slots finds no room for: docs/replay.md.)"""
    log = tmp_path / "vllm.jsonl"
    e = Engine(num_blocks=16)
    rec = Recorder(e.manager, log)
    e.schedule("a", [*PREFIX, *range(100, 120)])
    rec.step()
    e.finish("a")
    e.schedule("e", list(range(700, 764)))
    rec.step()
    e.finish("e")
    rec.step()
    b = e.request("b", [*PREFIX, *range(200, 210)])
    hit, num_hit, _ = e.manager.get_computed_blocks(b)  # b's lookup: blocks 1, 2
    assert [blk.block_id for blk in hit.blocks[0]] == [1, 2] and num_hit == 32
    bad_step = rec.step_no
    e.schedule("c", list(range(500, 676)))  # 11 blocks: the queue up to blocks 2 and 1
    assert {1, 2} <= set(e.blocks("c"))
    taken = e.manager.allocate_slots(b, b.num_tokens - num_hit, num_hit, hit)  # b, late
    assert taken is not None
    rec.close()

    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(log, keep_going=True)
    first = report.first
    assert first is not None
    assert first.step == bad_step, first
    assert first.block_id in (1, 2)
    at_step = [f for f in report.findings if f.step == bad_step]
    print(*at_step, sep="\n")
    assert {f.check for f in at_step} >= {"evict_held", "fresh_while_held"}, at_step
    fresh = [f for f in at_step if f.check == "fresh_while_held"]
    assert {(f.request, f.other_requests, f.block_id) for f in fresh} >= {("c", "b", 1)}, fresh
    # and from the shell: `pagedkv-sql replay LOG` names the step and exits 1
    result = CliRunner().invoke(app, ["--db", str(tmp_path / "cli.duckdb"), "replay", str(log)])
    assert result.exit_code == 1, result.output
    assert f"step {bad_step}:" in result.output, result.output


def _replay_first(log: Path) -> tuple[Any, list[Any]]:
    """Replay's first finding (the one `replay` prints) and all of them."""
    with pagedkv_sql.connect(":memory:") as db:
        first = db.replay(log).first
        return first, db.replay(keep_going=True).findings


def test_a_leak_is_the_first_finding_naming_request_and_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last block of every fifth finished request kept back by the pool's free path:
    the free that kept it is a leak naming the request and the block, printed first (no
    unresolved_token for the blocks it freed right; the engine's counts disagree after)."""
    state = {"finished": 0, "keep": False}
    free, free_blocks = _manager.KVCacheManager.free, _pool.BlockPool.free_blocks

    def planted_free(self: Any, request: Any) -> None:
        if request.is_finished():
            state["finished"] += 1
            state["keep"] = state["finished"] % 5 == 0
        try:
            free(self, request)
        finally:
            state["keep"] = False

    def planted_free_blocks(self: Any, ordered: Any) -> None:
        blocks = list(ordered)  # the table reversed: its last block first
        free_blocks(self, blocks[1:] if state["keep"] else blocks)

    monkeypatch.setattr(_manager.KVCacheManager, "free", planted_free)
    monkeypatch.setattr(_pool.BlockPool, "free_blocks", planted_free_blocks)
    log = tmp_path / "leak.jsonl"
    e = Scheduler(num_blocks=64)
    rec = Recorder(e.manager, log)
    for n in range(5):
        e.admit(f"r{n}", [*PREFIX, *range(100 * n + 100, 100 * n + 120)])
        rec.step()
    kept = e.blocks("r4")[-1]
    for n in range(5):
        e.step(f"r{n}")  # a decode each
        rec.step()
    for n in range(5):
        e.finish(f"r{n}")
        at = rec.step() - 1
    rec.close()
    first, found = _replay_first(log)
    assert (first.invariant, first.step, first.request, first.block_id) == (
        "leak",
        at,
        "r4",
        kept,
    ), found
    assert "unresolved_token" not in {f.check for f in found}, found


def test_a_preempted_request_freed_again_at_its_finish_is_a_double_free_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine frees a preempted request's blocks again when the request finishes:
    its free gave those blocks back twice (or blocks it no longer holds), a double free
    naming the request and a block, printed first."""
    before: dict[str, list[Any]] = {}
    free = _manager.KVCacheManager.free

    def planted_free(self: Any, request: Any) -> None:
        rid = request.request_id
        if not request.is_finished():  # a preemption: the blocks it lets go of
            before[rid] = list(self.coordinator.single_type_managers[0].req_to_blocks[rid])
        free(self, request)
        if request.is_finished() and rid in before:
            self.block_pool.free_blocks(reversed(before.pop(rid)))  # again

    monkeypatch.setattr(_manager.KVCacheManager, "free", planted_free)
    log = tmp_path / "again.jsonl"
    e = Scheduler(num_blocks=32)
    rec = Recorder(e.manager, log)
    e.admit("a", [*PREFIX, *range(100, 120)])
    e.admit("b", [*PREFIX, *range(200, 220)])
    rec.step()
    e.preempt("a")
    old = {int(b.block_id) for b in before["a"]}
    rec.step()
    e.admit("c", list(range(300, 340)))  # the pool hands out blocks again
    assert e.resume("a")  # a comes back (on its own cached blocks where it can)
    rec.step()
    e.step("a")
    rec.step()
    e.finish("a")
    at = rec.step() - 1
    rec.close()
    first, found = _replay_first(log)
    assert (first.invariant, first.step, first.request) == ("double_free", at, "a"), found
    assert first.block_id in old and first.op == "free", first
    assert "unresolved_token" not in {f.check for f in found}, found


# KV-cache groups the step log replays (a Mamba group's tables are rewritten in place: its
# log is refused, tests/engines/real/test_fuzz.py), each with a pool small enough to preempt
GROUP_CASES = {
    "sliding": (["sliding"], 14),
    "sliding + full": (["sliding", "full"], 14),
    "chunked local": (["chunked"], 8),
    "chunked local + full": (["chunked", "full"], 14),
    "full + full": (["full", "full"], 14),
}


@pytest.mark.parametrize("case", list(GROUP_CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_a_log_of_kv_cache_groups_replays_silent_to_every_group_s_tables(
    tmp_path: Path, case: str, seed: int
) -> None:
    """The real managers under vLLM's coordinator (prefix hits, window frees, preemption,
    in the scheduler's order), recorded: replay finds nothing, and every group's replayed
    tables at the last step are the managers' own, block for block."""
    kinds, blocks = GROUP_CASES[case]
    driver = Driver(groups_manager(kinds, blocks, True), seed, scheduler_order=True)
    log = tmp_path / "groups.jsonl"
    rec = Recorder(driver.manager, log)
    coverage = driver.run(100, lambda d: None)
    rec.step()
    rec.close()
    assert coverage.finished and coverage.hit_tokens, coverage
    assert (coverage.placeholders > 0) == (case != "full + full"), coverage  # window frees
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(log, keep_going=True)
        assert [str(f.message) for f in report.findings] == []
        replayed_tables = set(
            db.sql(
                "SELECT q.request_id, q.group_id, o.block_index, o.block_id "
                "FROM replay_location o JOIN replay_request q USING (rkey) "
                "WHERE o.to_event IS NULL AND o.tier = 'gpu'"
            ).fetchall()
        )
    managers = driver.manager.coordinator.single_type_managers
    held = {
        (rid, g, i, b.block_id)
        for g, m in enumerate(managers)
        for rid, table in m.req_to_blocks.items()
        for i, b in enumerate(table)
        if not b.is_null
    }
    assert replayed_tables == held
    assert len({g for _, g, _, _ in held}) == len(kinds)


def test_a_hit_whose_length_differs_between_groups_is_found_at_its_step(tmp_path: Path) -> None:
    """vLLM's hybrid coordinator gives every group one hit length; a lookup that hands the
    sliding-window group one block less than the full-attention group is replay's
    hit_length_mismatch at that step, naming the request."""
    driver = Driver(groups_manager(["sliding", "full"], 14, True), 2, scheduler_order=True)
    coordinator = driver.manager.coordinator
    original = coordinator.find_longest_cache_hit
    planted: list[str] = []

    def uneven(*a: Any, **kw: Any) -> Any:
        found = original(*a, **kw)  # (blocks per group, hit length, ...)
        blocks = found[0]
        if len(blocks[0]) > 1 and not planted:  # group 0 (sliding) one block short
            planted.append("yes")
            return ((blocks[0][:-1], *blocks[1:]), *found[1:])
        return found

    coordinator.find_longest_cache_hit = uneven
    log = tmp_path / "uneven.jsonl"
    rec = Recorder(driver.manager, log)
    for _ in range(60):
        driver.step()
        if planted:
            step = rec.step() - 1  # the step written (step() returns the next one's number)
            break
    else:
        pytest.fail("no prefix hit of two blocks in 60 steps")
    rec.close()
    with pagedkv_sql.connect(":memory:") as db:
        first = db.replay(log).first
    assert first is not None and first.invariant == "hit_length_mismatch", first
    assert first.step == step
    assert "group 0" in first.message and "group 1" in first.message
