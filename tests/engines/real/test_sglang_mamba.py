"""SGLang's Mamba state slots (engines/sglang_mamba.py) on the real HybridReqToTokenPool,
MambaSlotAllocator and UnifiedRadixCache(FULL, MAMBA), driven through the scheduler's own
paths (sglang_mamba_driver.py): a workload whose finished requests leave their states to
the tree, a later request hitting one, and an eviction of a state is silent at every step;
a state slot freed while its request runs, and one dropped by everyone, are named."""

from __future__ import annotations

import pytest

import pagedkv_sql
from pagedkv_sql.engines import check_snapshot

from .helpers import sql_findings
from .sglang_driver import _base
from .sglang_mamba_driver import MambaScheduler, torch

# SGLang's Mamba pool warns when it builds its state buffers without a GPU: the engine's
# own notice, not this suite's
pytestmark = pytest.mark.filterwarnings("ignore:Triton is not supported on current platform")
PROMPT = list(range(10))


def test_a_mamba_workload_is_silent_at_every_step() -> None:
    s = MambaScheduler()
    (a,) = s.prefill(("a", PROMPT))
    s.silent()
    for _ in range(3):
        s.decode()
        s.silent()
    tokens = list(a.origin_input_ids) + list(a.output_ids)
    s.finish("a")  # the tree keeps a's state
    s.silent()
    assert s.tree.tree_core.all_mamba_values_flatten().numel() == 1
    (b,) = s.prefill(("b", [*tokens[:-1], 400, 401]))
    hit = len(b.prefix_indices) if hasattr(b, "prefix_indices") else int(b.prefix_len)
    assert hit > 0  # b starts from a's cached state
    s.silent()
    s.decode()
    s.finish("b")
    s.silent()
    out = s.tree.evict(_base.EvictParams(num_tokens=0, mamba_num=1))
    assert int(out.mamba_num_evicted) == 1
    s.silent()
    assert sql_findings(s.snapshot()) == {}


def running() -> MambaScheduler:
    s = MambaScheduler()
    s.prefill(("a", PROMPT), ("b", [*PROMPT[:4], 300]))
    s.decode()
    s.silent()
    return s


def test_the_mamba_slots_are_a_pool_and_a_group(db: pagedkv_sql.Database) -> None:
    s = running()
    db.load_engine(s.snapshot())
    groups = db.sql("SELECT group_id, kind, is_primary FROM engine_kv_group ORDER BY 1").fetchall()
    assert groups == [(0, "full_attention", True), (1, "mamba", False)]
    rows = db.sql(
        "SELECT r.request_id, b.pool_id, b.block_id FROM engine_block_table b "
        "JOIN engine_request r USING (seq_id) WHERE b.group_id = 1 ORDER BY 1"
    ).fetchall()
    assert rows == [("a", 1, s.slot("a")), ("b", 1, s.slot("b"))]
    assert db.sql("SELECT num_blocks FROM engine_pool WHERE pool_id = 1").fetchall() == [(9,)]
    assert db.check().ok(strict=True), db.violations().to_pylist()


def test_a_state_slot_freed_while_its_request_runs_is_named() -> None:
    s = running()
    slot = s.slot("b")
    s.rtt.mamba_allocator.free(torch.tensor([slot]))
    found = check_snapshot(s.snapshot())
    # held by b and free: the next request gets b's state slot
    assert sorted((f.check, f.request_ids, f.block_id) for f in found) == [
        ("diag_engine_held_free_block", ("b",), slot),
        ("diag_engine_leak", ("b",), slot),
    ], [str(f) for f in found]
    assert sorted(sql_findings(s.snapshot())) == [
        "diag_engine_held_free_block",
        "diag_engine_leak",
    ]


def test_a_state_slot_no_one_holds_is_a_leak() -> None:
    s = running()
    slot = s.slot("b")
    s.rtt.req_index_to_mamba_index_mapping[
        next(r.kv.req_pool_idx for r in s.running.reqs if r.rid == "b")
    ] = 0  # b's row forgets its slot; the allocator never gets it back
    found = check_snapshot(s.snapshot())
    leaks = [f for f in found if f.check == "diag_engine_leak"]
    assert [f.block_id for f in leaks] == [slot], [str(f) for f in found]
