"""Tests written for the engines' mutation survivors (docs/mutation.md, "### Engines"):
each sits on a boundary, a join key or a filter that one of the mutants of
pagedkv_sql/engines/*.py or sql/engines.sql moved and no other test noticed. Each was
checked to fail with its mutant applied and to pass without it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

import pagedkv_sql
from pagedkv_sql.engines import CacheTensor, flashinfer
from pagedkv_sql.engines.tables import EngineState, Pool, table, write

from .test_invariants import BLOCK, NUM_BLOCKS, SHARED, findings, state


def spec_rows(db: pagedkv_sql.Database, relation: str) -> list[tuple[int, ...]]:
    return [tuple(r) for r in db.sql(f"SELECT * FROM {relation} ORDER BY ALL").fetchall()]


def with_group(st: EngineState, rows: list[tuple[int, int, int]], pool: int = 0) -> None:
    """Add (seq_id, block_index, block_id) entries of KV-cache group 1 to a state."""
    extra = table(
        "engine_block_table",
        seq_id=[r[0] for r in rows],
        group_id=[1] * len(rows),
        block_index=[r[1] for r in rows],
        pool_id=[pool] * len(rows),
        block_id=[r[2] for r in rows],
    )
    st.block_table = pa.concat_tables([st.block_table, extra])


# -- sql/engines.sql ------------------------------------------------------------------------
def test_only_group_0_gives_block_table_entry_rows(db: pagedkv_sql.Database) -> None:
    # engine_to_block_table_entry's `bt.group_id = 0`: another KV-cache group's blocks
    # (vLLM's sliding-window group) stay in engine_block_table
    write(db.con, state(SHARED), "plain")
    plain = spec_rows(db, "block_table_entry")
    st = state(SHARED)
    with_group(st, [(0, 0, 6), (0, 1, 7), (1, 3, 8)])
    write(db.con, st, "two groups")
    assert spec_rows(db, "block_table_entry") == plain


def test_only_group_0_gives_swapped_block_rows(db: pagedkv_sql.Database) -> None:
    st = state(SHARED)
    st.pools = [Pool(0, "kv", num_blocks=NUM_BLOCKS), Pool(1, "host", tier="cpu", num_blocks=4)]
    with_group(st, [(0, 4, 2)], pool=1)
    write(db.con, st, "a cpu block of group 1")
    assert spec_rows(db, "swapped_block") == []


def test_a_block_id_equal_to_the_pool_size_is_outside_it(db: pagedkv_sql.Database) -> None:
    # ids 0 .. NUM_BLOCKS - 1 are the pool's; NUM_BLOCKS itself is the first one outside
    found = findings(db, state({"req-a": [1, NUM_BLOCKS - 1, NUM_BLOCKS]}, {NUM_BLOCKS: 1}))
    assert found["diag_engine_slot_outside_pool"] == [
        f"block {NUM_BLOCKS} is outside pool 0 ({NUM_BLOCKS} blocks) (request req-a)"
    ]


def two_pools(with_blocks: bool = True) -> EngineState:
    """Two GPU pools (TensorRT-LLM's primary pools of two window sizes, say) with the
    same block ids: req-a holds block 3 of pool 0, req-b and req-c block 3 of pool 1; block 5
    of pool 0 is free while req-b holds block 5 of pool 1."""
    blocks = None
    if with_blocks:
        blocks = table(
            "engine_block",
            pool_id=[0, 0, 0, 1, 1, 1],
            block_id=[3, 4, 5, 3, 4, 5],
            ref_cnt=[1, 0, 0, 2, 0, 1],
            is_null=[False] * 6,
        )
    return EngineState(
        engine="test",
        block_size=BLOCK,
        requests=table(
            "engine_request",
            seq_id=[0, 1, 2],
            request_id=["req-a", "req-b", "req-c"],
            num_tokens=[BLOCK, 2 * BLOCK, BLOCK],
        ),
        block_table=table(
            "engine_block_table",
            seq_id=[0, 1, 1, 2],
            group_id=[0, 0, 0, 0],
            block_index=[0, 0, 1, 0],
            pool_id=[0, 1, 1, 1],
            block_id=[3, 3, 5, 3],
        ),
        pools=[Pool(0, "primary", num_blocks=8), Pool(1, "primary-2", num_blocks=8)],
        blocks=blocks,
        free_blocks=table("engine_free_block", pool_id=[0, 0], position=[0, 1], block_id=[4, 5]),
    )


def test_refcounts_are_per_pool_when_the_engine_keeps_none(db: pagedkv_sql.Database) -> None:
    # the holders window partitions by (pool, block): block 3 of pool 0 has one holder
    write(db.con, two_pools(with_blocks=False), "no ref_cnt")
    rows = spec_rows(db, "block_table_entry")
    pool1 = 1 << 40
    assert rows == [
        (0, 0, 3 * 256, 1),
        (1, 0, pool1 + 3 * 256, 2),
        (1, 1, pool1 + 5 * 256, 1),
        (2, 0, pool1 + 3 * 256, 2),
    ]


def test_refcounts_come_from_the_block_of_the_same_pool(db: pagedkv_sql.Database) -> None:
    report = write(db.con, two_pools(), "ref_cnt per pool")
    assert [r.name for r in report.warnings] == ["diag_engine_free_queue_ref_cnt"]
    rows = spec_rows(db, "block_table_entry")
    assert [r[3] for r in rows] == [1, 2, 1, 2]


def test_a_free_block_of_another_pool_is_no_use_after_free(db: pagedkv_sql.Database) -> None:
    # ref_cnt matches the holders in each pool, and block 5 is free in pool 0 only: the only
    # finding is pool 1's block 4 (ref_cnt 0, not in the queue, which is pool 0's)
    found = findings(db, two_pools())
    assert found == {
        "diag_engine_free_queue_ref_cnt": ["block 4 has ref_cnt 0 but is not in the free queue"]
    }


def test_block_0_and_slot_0_are_inside_the_pool(db: pagedkv_sql.Database) -> None:
    # vLLM's sliding-window groups hold the null block 0; SGLang's slot 0 is a real slot
    found = findings(db, state({"req-a": [0, 1]}, slots={"req-a": list(range(BLOCK))}))
    assert "diag_engine_slot_outside_pool" not in found
    # (a negative slot is refused by the SGLang import: sglang.to_state)
    found = findings(db, state({"req-a": [-1, 1]}, {-1: 1}))
    assert found["diag_engine_slot_outside_pool"] == [
        "block -1 is outside pool 0 (10 blocks) (request req-a)"
    ]


def csr_findings(
    db: pagedkv_sql.Database, indptr: list[int], last: list[int], pages: int = 4
) -> list[str]:
    snap = flashinfer.snapshot(
        np.array(indptr, dtype=np.int32),
        np.arange(pages, dtype=np.int32),
        np.array(last, dtype=np.int32),
        BLOCK,
    )
    report = db.load_engine(snap)
    return [
        reason
        for r in report.warnings
        if r.name == "diag_engine_csr_row"
        for reason in r.rows.column("reason").to_pylist()
    ]


def test_last_page_lengths_1_and_the_page_size_are_fine(db: pagedkv_sql.Database) -> None:
    # a last page holds 1 .. page_size tokens; a sequence with no page (kv_indptr equal)
    # holds none, whatever its kv_last_page_len says
    assert csr_findings(db, [0, 1, 3, 3, 4], [1, BLOCK, 0, 5]) == []
    assert csr_findings(db, [0, 1, 3, 3, 4], [0, BLOCK + 1, 0, 5]) == [
        "kv_last_page_len[0] = 0 is outside [1, 16]",
        f"kv_last_page_len[1] = {BLOCK + 1} is outside [1, 16]",
    ]


def test_kv_addresses_of_group_0_and_the_last_block_of_the_tensor(
    db: pagedkv_sql.Database,
) -> None:
    # a [2, 2, BLOCK, 1, 1] cache holds blocks 0 and 1: block 1 is its last block (in
    # bounds), block 2 is one past it (not); group 1's block 7 has no address here
    st = state({"req-a": [1, 2]})
    with_group(st, [(0, 0, 7)])
    shape = (2, 2, BLOCK, 1, 1)
    strides = (2 * BLOCK, BLOCK, 1, 1, 1)
    dims = ("block", "kv", "slot", "head", "dim")
    st.cache_tensors = [CacheTensor("kv", shape, strides, "float16", 2, dims, 1 << 20)]
    write(db.con, st, "tensor")
    rows = db.sql(
        "SELECT block_id, kv, count(*), bool_and(in_bounds), bool_or(in_bounds) "
        "FROM pagedkv_kv_address(0, 0) GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert rows == [
        (1, "K", BLOCK, True, True),
        (1, "V", BLOCK, True, True),
        (2, "K", BLOCK, False, False),
        (2, "V", BLOCK, False, False),
    ]
