"""engines/tables.py: an engine state written as the spec's relations and the engine tables."""

from __future__ import annotations

import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql.engines import Snapshot, layout
from pagedkv_sql.engines.tables import EngineState, Pool, table, write
from pagedkv_sql.errors import InputError, UsageError

from .helpers import (
    BLOCK,
    NUM_BLOCKS,
    SHARED,
    findings,
    sglang_snapshot,
    spec_rows,
    state,
    vllm_snapshot,
)


def test_refcount_is_the_engine_s_ref_cnt_where_it_keeps_one(db: pagedkv_sql.Database) -> None:
    write(db.con, state(SHARED, {3: 5}), "ref_cnt 5")
    assert db.sql(
        "SELECT block_table_id, refcount FROM block_table_entry WHERE physical_block_base = 768"
    ).fetchall() == [(0, 5)]


def test_free_counter_without_a_queue_counts_distinct_held_blocks(
    db: pagedkv_sql.Database,
) -> None:
    # 10 blocks: 5 distinct held (blocks 1 and 2 twice), the null block: 4 free
    st = state(SHARED)
    st.free_blocks = None
    st.pools = [Pool(0, "kv", num_blocks=NUM_BLOCKS, free_count=4)]
    assert findings(db, st) == {}
    st.pools = [Pool(0, "kv", num_blocks=NUM_BLOCKS, free_count=5)]
    assert findings(db, st) == {
        "diag_engine_free_count": [
            "kv counts 5 free blocks, but 4 of its blocks are held by no request"
        ]
    }


def test_block_sizes_1_and_256_fit_the_spec_and_0_and_257_do_not() -> None:
    for size in (1, 256):
        assert Snapshot("vllm", {}, {"block_size": size}).block_size == size
    for size in (0, 257):
        with pytest.raises(InputError, match=rf"block_size {size} is outside \[1, 256\]"):
            _ = Snapshot("vllm", {}, {"block_size": size}).block_size


def test_a_state_without_pools_has_pool_0(db: pagedkv_sql.Database) -> None:
    st = state(SHARED)
    plain = EngineState(st.engine, st.block_size, st.requests, st.block_table)
    write(db.con, plain, "default pool")
    assert db.sql("SELECT count(*) FROM block_table_entry").fetchall() == [(7,)]


def test_byte_addresses_need_recorded_tensors(db: pagedkv_sql.Database) -> None:
    with pytest.raises(UsageError, match="no cache-tensor layouts are stored"):
        layout.token_addresses(db.con, 0, 0, 0, 0)
    db.load_engine(vllm_snapshot())  # engine tables, but no tensor recorded
    with pytest.raises(UsageError, match="no cache-tensor layouts are stored"):
        layout.token_addresses(db.con, 0, 0, 0, 0)


def test_a_slotted_token_s_offset_is_its_slot_s_place_in_the_page(db: pagedkv_sql.Database) -> None:
    # SGLang: token 3 sits in slot 20 = page 1, place 4; its offset_in_block is 4, and the
    # spec's diag_token_decomposition sees the wrong place too
    slots = [BLOCK + i for i in range(BLOCK)]
    slots[3] = BLOCK + 4
    write(db.con, state({"req-a": [1]}, slots={"req-a": slots}), "slots")
    assert db.sql(
        "SELECT token_pos, block_index, offset_in_block FROM virtual_token "
        "WHERE token_pos IN (3, 4) ORDER BY ALL"
    ).fetchall() == [(3, 0, 4), (4, 0, 4)]


def test_a_cpu_pool_block_is_swapped_at_its_pool_address(db: pagedkv_sql.Database) -> None:
    st = state({"req-a": [1]})
    st.pools = [Pool(0, "kv", num_blocks=NUM_BLOCKS), Pool(1, "host", tier="cpu", num_blocks=4)]
    extra = table(
        "engine_block_table", seq_id=[0], group_id=[0], block_index=[1], pool_id=[1], block_id=[3]
    )
    st.block_table = pa.concat_tables([st.block_table, extra])
    write(db.con, st, "one swapped block")
    assert spec_rows(db, "swapped_block") == [(0, 1, (1 << 40) + 3 * 256)]


# A vLLM num_blocks or SGLang num_pages of 2^31 - 1 in a snapshot of a few hundred bytes is
# refused: block counts are int32 in the metadata schema, yet the import's diagnostics would
# range over every block, with no answer after minutes.
@pytest.mark.parametrize(
    ("engine", "meta"),
    [
        ("vllm", {"num_blocks": 2**31 - 1}),
        ("vllm", {"num_blocks": 2**25 + 1}),  # one block past 2^29 slots of 16 tokens
        ("sglang", {"num_pages": 2**31 - 1}),
        ("sglang", {"num_pages": 2**25}),  # + the null page: 2^25 + 1 pages
    ],
)
def test_a_pool_larger_than_a_real_engine_holds_is_refused_before_any_work(
    engine: str, meta: dict[str, int]
) -> None:
    snap = vllm_snapshot() if engine == "vllm" else sglang_snapshot()
    snap.meta.pop("num_free_blocks", None)
    snap.meta.update(meta)
    with (
        pagedkv_sql.connect(":memory:") as db,
        pytest.raises(pagedkv_sql.InputError, match=r"token slots a real engine holds"),
    ):
        db.load_engine(snap)
