"""vLLM's real KVCacheManager over KV-cache groups of each kind (engines/vllm.py,
engines/groups.py):
a sliding-window group, a hybrid (sliding window + full attention, vLLM's
HybridKVCacheCoordinator), chunked local attention, a Mamba hybrid (MambaSpec + full
attention, "align" with prefix caching, "none" without), driven through prefix hits,
window frees and preemption, captured after every step: no finding on the healthy
managers (the fast check every step, `import` + `check` along the way), and a fault
planted in one group of a live manager found, naming its request and block."""

from __future__ import annotations

from typing import Any

import pytest

from pagedkv_sql.engines import check_snapshot, vllm
from pagedkv_sql.errors import InputError

from .helpers import sql_findings
from .vllm_groups_driver import BLOCK_SIZE, Driver, manager

# case -> (groups' kinds, prefix caching, blocks in the pool: few enough to preempt)
KINDS = {
    "sliding": (["sliding"], True, 14),
    "sliding + full": (["sliding", "full"], True, 14),
    "chunked local": (["chunked"], True, 8),
    "chunked local + full": (["chunked", "full"], True, 14),
    "mamba align + full": (["mamba", "full"], True, 14),
    "mamba none + full": (["mamba", "full"], False, 14),
    "full": (["full"], True, 14),
}
KIND_NAMES = {
    "sliding": "sliding_window",
    "chunked": "chunked_local_attention",
    "mamba": "mamba",
    "full": "full_attention",
}
STEPS = 100


@pytest.mark.parametrize("case", list(KINDS))
@pytest.mark.parametrize("seed", [0, 1])
def test_a_healthy_manager_of_every_kind_gives_no_finding(case: str, seed: int) -> None:
    kinds, caching, blocks = KINDS[case]
    driver = Driver(manager(kinds, blocks, caching), seed)
    found: list[tuple[int, list[str]]] = []
    sql: list[tuple[int, dict[str, list[str]]]] = []

    def each(d: Driver) -> None:
        snap = vllm.capture(d.manager, d.running)
        fast = check_snapshot(snap)
        if fast:
            found.append((d.coverage.steps, [str(f) for f in fast[:5]]))
        if d.coverage.steps % 25 == 0:  # the SQL views and the spec's checks, as `check`
            checked = sql_findings(snap)
            if checked:
                sql.append((d.coverage.steps, checked))

    coverage = driver.run(STEPS, each)
    assert found == [] and sql == [], (found[:2], sql[:2])
    # the run went where the checks could have gone wrong: preemptions, prefix hits (with
    # caching), entries without a block behind held ones (all but full attention and
    # Mamba without caching, one block a request)
    assert coverage.preemptions > 0 and coverage.finished > 0, coverage
    assert (coverage.hit_tokens > 0) == caching, coverage
    assert (coverage.placeholders > 0) == (case not in ("full", "mamba none + full")), coverage
    snap = vllm.capture(driver.manager, driver.running)
    assert [g["kind"] for g in snap.meta["kv_cache_groups"]] == [KIND_NAMES[k] for k in kinds]


def _warm(kinds: list[str], steps: int = 40, seed: int = 3) -> Driver:
    driver = Driver(manager(kinds), seed)
    driver.run(steps, lambda d: None)
    assert check_snapshot(vllm.capture(driver.manager, driver.running)) == []
    return driver


def _inside(driver: Driver, g: int) -> tuple[str, int, Any]:
    """A running request's entry of group g inside its kept span (the last whole block
    before its last one), with its block."""
    m = driver.group(g)
    for rid, r in driver.running.items():
        blocks = m.req_to_blocks.get(rid, [])
        i = r.num_computed_tokens // BLOCK_SIZE - 1
        if i >= 1 and i < len(blocks) - 1 and blocks[i].block_id != 0:
            return rid, i, blocks[i]
    raise AssertionError("no request with a whole block inside its window")


def _found(driver: Driver) -> list[Any]:
    snap = vllm.capture(driver.manager, driver.running)
    fast = check_snapshot(snap)
    assert {f.check for f in fast} <= set(sql_findings(snap))  # the views find them too
    return fast


@pytest.mark.parametrize(
    ("kinds", "g"), [(["sliding"], 0), (["sliding", "full"], 0), (["chunked", "full"], 0)]
)
def test_a_block_freed_from_the_window_while_inside_it_is_found(kinds: list[str], g: int) -> None:
    driver = _warm(kinds)
    rid, i, block = _inside(driver, g)
    m = driver.group(g)
    m.req_to_blocks[rid][i] = driver.manager.block_pool.null_block
    driver.manager.block_pool.free_blocks([block])
    missing = [f for f in _found(driver) if f.check == "diag_engine_unresolved_token"]
    assert [f.request_ids for f in missing] == [(rid,)], missing
    assert f" at entry {i} of KV-cache group {g} " in missing[0].reason


def test_the_null_block_handed_back_as_free_is_found() -> None:
    driver = _warm(["sliding", "full"])
    pool = driver.manager.block_pool
    pool.free_block_queue.append(pool.null_block)
    found = [f for f in _found(driver) if f.check == "diag_engine_outside_pool"]
    assert [(f.block_id, f.reason) for f in found] == [
        (0, "block 0 is the null block of pool 0 (reserved: a placeholder) (free queue)")
    ]


def test_the_null_block_handed_out_in_a_full_attention_group_is_found() -> None:
    driver = _warm(["sliding", "full"])
    rid, i, block = _inside(driver, 1)
    driver.group(1).req_to_blocks[rid][i] = driver.manager.block_pool.null_block
    driver.manager.block_pool.free_blocks([block])
    found = [f for f in _found(driver) if f.check == "diag_engine_unresolved_token"]
    assert [f.request_ids for f in found] == [(rid,)]
    assert "KV-cache group 1 (full_attention" in found[0].reason


def test_a_duplicate_in_the_sliding_group_is_found() -> None:
    driver = _warm(["sliding", "full"])
    rid, i, block = _inside(driver, 0)
    blocks = driver.group(0).req_to_blocks[rid]
    dropped = blocks[i + 1]
    blocks[i + 1] = block  # the next entry takes the same block again
    block.ref_cnt += 1
    driver.manager.block_pool.free_blocks([dropped])
    found = [f for f in _found(driver) if f.check == "diag_engine_duplicate_block"]
    assert [(f.request_ids, f.block_id) for f in found] == [((rid,), block.block_id)]


def test_a_mamba_state_block_s_lost_decrement_is_found() -> None:
    driver = _warm(["mamba", "full"])
    state = next(
        b
        for rid in driver.running
        for b in driver.group(0).req_to_blocks.get(rid, [])
        if b.block_id != 0
    )
    state.ref_cnt += 1
    found = [f for f in _found(driver) if f.check == "diag_engine_refcount_mismatch"]
    assert [f.block_id for f in found] == [state.block_id]


def test_a_window_block_freed_twice_is_found() -> None:
    """A double free of a block the window still holds (vLLM #42571's shape): in the free
    queue and held, its count one short."""
    driver = _warm(["sliding", "full"])
    _, _, block = _inside(driver, 0)
    driver.manager.block_pool.free_blocks([block])
    checks = {(f.check, f.block_id) for f in _found(driver)}
    assert ("diag_engine_held_free_block", block.block_id) in checks
    assert ("diag_engine_refcount_mismatch", block.block_id) in checks


def test_a_group_of_a_kind_not_modelled_is_refused_by_name() -> None:
    m = manager(["rswa", "full"])
    with pytest.raises(InputError, match="KV-cache group 0: its spec RSWASpec is not one"):
        vllm.capture(m)
    with pytest.raises(AssertionError, match="RSWASpec"):
        vllm.assert_consistent(m)
