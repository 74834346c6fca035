"""Tests written for the engines' mutation survivors (docs/mutation.md, "### Engines"):
each sits on a boundary, a join key or a filter that one of the mutants of
pagedkv_sql/engines/*.py or sql/engines.sql moved and no other test noticed. Each was
checked to fail with its mutant applied and to pass without it."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql import engines
from pagedkv_sql.engines import (
    CacheTensor,
    Snapshot,
    engine,
    flashinfer,
    layout,
    read,
    trtllm,
    vllm,
)
from pagedkv_sql.engines.snapshot import as_numpy
from pagedkv_sql.engines.tables import EngineState, Pool, table, write
from pagedkv_sql.errors import InputError, UsageError

from .test_invariants import BLOCK, NUM_BLOCKS, SHARED, findings, state
from .test_trtllm import offsets as trtllm_offsets
from .test_vllm_sglang_snapshots import sglang_snapshot, vllm_snapshot


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
    # the sequence with no page holds no block (and a backwards one none either)
    assert db.sql(
        "SELECT seq_id, count(*) FROM engine_block_table GROUP BY 1 ORDER BY 1"
    ).fetchall() == [
        (0, 1),
        (1, 2),
        (3, 1),
    ]
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


# -- the engine modules' import checks ------------------------------------------------------
def int64_snapshots() -> dict[str, Snapshot]:
    """One small snapshot of each engine with its int32 index arrays as int64."""
    fi = csr_arrays()
    tr = trtllm_offsets([[(0, 5), (0, 7)]])
    snaps = {
        "flashinfer": flashinfer.snapshot(*fi, BLOCK),
        "vllm": vllm_snapshot(),
        "sglang": sglang_snapshot(),
        "trtllm": trtllm.snapshot(tr, np.array([20], np.int32), BLOCK, 2),
    }
    wide = {"flashinfer": "kv_indices", "vllm": "block_table", "sglang": "req_to_token"}
    wide["trtllm"] = trtllm.OFFSETS
    for name, snap in snaps.items():
        snap.arrays[wide[name]] = snap.arrays[wide[name]].astype(np.int64)
    return snaps


def csr_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.array([0, 2, 3], np.int32),
        np.array([5, 7, 2], np.int32),
        np.array([3, BLOCK], np.int32),
    )


@pytest.mark.parametrize("name", ["flashinfer", "vllm", "sglang", "trtllm"])
def test_each_engine_refuses_int64_indices_unless_told_to_convert(name: str) -> None:
    # to_state's own default is convert=False, as load_engine's is
    module = engine(name)
    with pytest.raises(InputError, match="int64"):
        module.to_state(int64_snapshots()[name])
    state = module.to_state(int64_snapshots()[name], convert=True)
    assert state.block_table.num_rows > 0


def test_vllm_kv_cache_groups_past_the_first_stay_engine_facts(db: pagedkv_sql.Database) -> None:
    # block_table [G, R, M]: group 1 (a sliding-window group) holds other blocks
    snap = vllm_snapshot()
    group0 = snap.arrays["block_table"]
    snap.arrays["block_table"] = np.stack([group0, np.array([[6, 7, 0, 0], [7, 0, 0, 0]])])
    snap.arrays["block_table"] = snap.arrays["block_table"].astype(np.int32)
    counts = snap.arrays["num_blocks_per_row"]
    snap.arrays["num_blocks_per_row"] = np.stack([counts, np.array([2, 1], np.int32)])
    snap.arrays["ref_cnt"] = np.array([0, 2, 2, 1, 1, 1, 1, 2], dtype=np.int32)
    snap.arrays["free_block_queue"] = np.array([], dtype=np.int32)
    snap.meta["num_free_blocks"] = 0
    report = db.load_engine(snap)
    assert report.warnings == []
    assert db.sql("SELECT count(*) FROM block_table_entry").fetchall() == [(7,)]
    assert db.sql(
        "SELECT group_id, seq_id, block_index, block_id FROM engine_block_table "
        "WHERE group_id = 1 ORDER BY ALL"
    ).fetchall() == [(1, 0, 0, 6), (1, 0, 1, 7), (1, 1, 0, 7)]


def test_vllm_a_request_with_no_block_yet_and_no_token(db: pagedkv_sql.Database) -> None:
    snap = vllm_snapshot()
    snap.arrays["num_blocks_per_row"] = np.array([4, 0], np.int32)
    snap.arrays["num_tokens"] = np.array([52, 0], np.int64)
    snap.arrays["ref_cnt"] = np.array([0, 1, 1, 1, 1, 0, 0, 0], dtype=np.int32)
    snap.arrays["free_block_queue"] = np.array([5, 6, 7], dtype=np.int32)
    snap.meta["num_free_blocks"] = 3
    report = db.load_engine(snap)
    assert report.warnings == []
    assert db.sql("SELECT request_id, num_tokens FROM engine_request ORDER BY 1").fetchall() == [
        ("a", 52),
        ("b", 0),
    ]


@pytest.mark.parametrize(
    ("name", "values", "message"),
    [
        ("num_tokens", np.array([52, -1], np.int64), "num_tokens[1] = -1 does not fit"),
        (
            "num_blocks_per_row",
            np.array([4, -1], np.int32),
            "num_blocks_per_row[1] = -1 is outside [0, 4]",
        ),
    ],
)
def test_vllm_a_negative_count_is_refused(
    db: pagedkv_sql.Database, name: str, values: np.ndarray, message: str
) -> None:
    snap = vllm_snapshot()
    snap.arrays[name] = values
    with pytest.raises(InputError) as e:
        db.load_engine(snap)
    assert message in str(e.value.problems)


def test_vllm_pool_size_is_the_ref_cnt_array_s_without_num_blocks(
    db: pagedkv_sql.Database,
) -> None:
    snap = vllm_snapshot()
    del snap.meta["num_blocks"]
    db.load_engine(snap)
    assert db.sql("SELECT num_blocks FROM engine_pool").fetchall() == [(8,)]
    snap = vllm_snapshot()
    snap.meta["num_blocks"] = 12  # the allocator's count wins over the array's length
    db.load_engine(snap)
    assert db.sql("SELECT num_blocks FROM engine_pool").fetchall() == [(12,)]


def test_vllm_slot_mapping_is_block_times_size_plus_offset() -> None:
    table = np.array([[3, 9], [4, 0]], dtype=np.int32)
    slots = vllm.slot_mapping(table, np.array([18, 2]), 16)
    expected = [3 * 16 + p for p in range(16)] + [9 * 16, 9 * 16 + 1] + [4 * 16, 4 * 16 + 1]
    assert slots.tolist() == expected


def test_sglang_an_empty_request_and_slot_0_without_num_pages(db: pagedkv_sql.Database) -> None:
    # seq_lens 0 is a request with no token yet; without num_pages only negative slots are
    # outside the pool, and slot 0 (page 0, the reserved page) is a slot like any other
    snap = sglang_snapshot()
    del snap.meta["num_pages"]
    snap.arrays["seq_lens"] = np.array([40, 0], dtype=np.int64)
    snap.arrays["req_to_token"][0, 0] = 0
    db.load_engine(snap)
    assert db.sql("SELECT seq_id, num_tokens FROM engine_request ORDER BY 1").fetchall() == [
        (0, 40),
        (1, 0),
    ]
    assert db.sql("SELECT slot FROM engine_token_slot WHERE token_pos = 0").fetchall() == [(0,)]


def test_sglang_page_0_is_the_null_block(db: pagedkv_sql.Database) -> None:
    db.load_engine(sglang_snapshot())
    assert db.sql("SELECT block_id, is_null FROM engine_block ORDER BY 1").fetchall() == [
        (0, True),
        (1, False),
        (2, False),
    ]


def test_trtllm_beam_width_defaults_to_1_and_0_is_refused() -> None:
    snap = trtllm.snapshot(trtllm_offsets([[(0, 5)]]), np.array([9], np.int32), BLOCK, 2)
    del snap.meta["beam_width"]
    state = trtllm.to_state(snap)
    assert state.requests.column("request_id").to_pylist() == ["0"]
    snap.meta["beam_width"] = 0
    with pytest.raises(InputError, match="1 rows are not num_seqs \\* beam_width 0"):
        trtllm.to_state(snap)
    snap.meta["beam_width"] = 2
    with pytest.raises(InputError, match="1 rows are not num_seqs \\* beam_width 2"):
        trtllm.to_state(snap)


def test_trtllm_a_negative_sequence_length_is_refused() -> None:
    snap = trtllm.snapshot(trtllm_offsets([[(0, 5)]]), np.array([-1], np.int32), BLOCK, 2)
    with pytest.raises(InputError) as e:
        trtllm.to_state(snap)
    assert "sequence_length[0] = -1 is negative" in str(e.value.problems)


def test_trtllm_reads_the_host_array_names(db: pagedkv_sql.Database) -> None:
    # the runtime's host_kv_cache_block_offsets and kv_cache_pool_pointers spellings
    snap = trtllm.snapshot(trtllm_offsets([[(0, 5)]]), np.array([9], np.int32), BLOCK, 2)
    snap.arrays["host_kv_cache_block_offsets"] = snap.arrays.pop(trtllm.OFFSETS)
    snap.arrays["kv_cache_pool_pointers"] = np.array([[1 << 32, 0]], dtype=np.int64)
    snap.meta.update(num_kv_heads=1, size_per_head=8, dtype="float16")
    db.load_engine(snap)
    # pointer 2^32, block_bytes 1 head * 16 tokens * 8 * 2 bytes * 2 (K, V) * 2 layers
    assert db.sql("SELECT physical_block_base FROM block_table_entry").fetchall() == [
        ((1 << 32) + 5 * 1024,)
    ]


def test_trtllm_a_dtype_without_heads_records_no_block_size(db: pagedkv_sql.Database) -> None:
    snap = trtllm.snapshot(trtllm_offsets([[(0, 5)]]), np.array([9], np.int32), BLOCK, 2)
    snap.meta["dtype"] = "float16"
    db.load_engine(snap)
    assert db.sql("SELECT block_bytes FROM engine_pool WHERE pool_id = 0").fetchall() == [(None,)]
    assert db.sql("SELECT physical_block_base FROM block_table_entry").fetchall() == [(5 * 256,)]


def test_flashinfer_convert_keeps_the_largest_int32(db: pagedkv_sql.Database) -> None:
    # the unused tail of a preallocated kv_indices may hold anything that fits int32
    indptr, indices, last = csr_arrays()
    wide = np.r_[indices.astype(np.int64), np.iinfo(np.int32).max, np.iinfo(np.int32).min]
    db.load_engine(flashinfer.snapshot(indptr, wide, last, BLOCK), convert=True)
    assert db.sql("SELECT count(*) FROM block_table_entry").fetchall() == [(3,)]
    too_wide = np.r_[indices.astype(np.int64), 1 << 31]
    with pytest.raises(InputError) as e:
        db.load_engine(flashinfer.snapshot(indptr, too_wide, last, BLOCK), convert=True)
    assert "kv_indices[3] = 2147483648 does not fit int32" in str(e.value.problems)


def test_flashinfer_a_negative_indptr_is_refused(db: pagedkv_sql.Database) -> None:
    _, indices, last = csr_arrays()
    with pytest.raises(InputError) as e:
        db.load_engine(flashinfer.snapshot(np.array([-1, 2, 3], np.int32), indices, last, BLOCK))
    assert "kv_indptr[0] = -1 is outside [0, 3]" in str(e.value.problems)


def test_flashinfer_capture_without_a_fixed_batch_reads_the_whole_buffer() -> None:
    indptr, indices, last = csr_arrays()
    wrapper = SimpleNamespace(
        _paged_kv_indptr_buf=indptr,
        _paged_kv_indices_buf=indices,
        _paged_kv_last_page_len_buf=last,
    )
    snap = flashinfer.capture(wrapper, BLOCK)
    assert snap.arrays["kv_indptr"].tolist() == [0, 2, 3]
    wrapper._fixed_batch_size = 0  # recorded, but no fixed batch
    assert flashinfer.capture(wrapper, BLOCK).arrays["kv_indptr"].tolist() == [0, 2, 3]
    assert snap.arrays["kv_last_page_len"].tolist() == [3, BLOCK]
    assert snap.meta["kv_layout"] == "NHD"


def test_sglang_slot_limit_and_a_full_row(db: pagedkv_sql.Database) -> None:
    # num_pages 7: pages 0 .. 7, slots [0, 128); a row may be full (seq_lens = width)
    snap = sglang_snapshot()
    snap.arrays["req_to_token"][0, 40:48] = np.arange(56, 64)
    snap.arrays["seq_lens"] = np.array([48, 42], dtype=np.int64)
    db.load_engine(snap)
    assert db.sql("SELECT num_tokens FROM engine_request ORDER BY seq_id").fetchall() == [
        (48,),
        (42,),
    ]
    snap.arrays["req_to_token"][1, 41] = 128
    snap.arrays["req_to_token"][1, 40] = -1
    with pytest.raises(InputError) as e:
        db.load_engine(snap)
    assert "[1, 40] = -1 is outside the pool's slots [0, 128)" in str(e.value.problems)
    assert "[1, 41] = 128 is outside the pool's slots [0, 128)" in str(e.value.problems)


def test_trtllm_block_size_alone_and_two_pool_groups_with_beams(db: pagedkv_sql.Database) -> None:
    # pool group 1's primary pool is pool id 3 (three tiers a group); two beams a request
    two = np.concatenate([trtllm_offsets([[(0, 5)], [(0, 6)]])] * 2)
    two[1, :, :, 0] += 4 * 2 * 2  # group 1: blocks 9 and 10
    lengths = np.array([9, 9], np.int32)
    snap = trtllm.snapshot(two, lengths, BLOCK, 2, beam_width=2, request_ids=["req"])
    del snap.meta["tokens_per_block"]
    state = trtllm.to_state(snap)
    assert state.requests.column("request_id").to_pylist() == ["req#beam0", "req#beam1"]
    bt = state.block_table.to_pydict()
    assert sorted(zip(bt["group_id"], bt["pool_id"], bt["block_id"], strict=True)) == [
        (0, 0, 5),
        (0, 0, 6),
        (1, 3, 9),
        (1, 3, 10),
    ]
    assert [p.pool_id for p in state.pools] == [0, 1, 2, 3, 4, 5]


def test_vllm_without_token_counts_every_slot_of_the_blocks_is_a_token(
    db: pagedkv_sql.Database,
) -> None:
    snap = vllm_snapshot()
    del snap.arrays["num_tokens"]
    db.load_engine(snap)
    assert db.sql("SELECT num_tokens FROM engine_request ORDER BY seq_id").fetchall() == [
        (64,),
        (48,),
    ]


def test_vllm_worker_arrays_alone_keep_block_0_as_the_null_block(
    db: pagedkv_sql.Database,
) -> None:
    # without ref_cnt (an export's arrays), a listed block 0 is still the null block: a hole
    table_ = np.array([[1, 0, 5]], dtype=np.int32)
    arrays = {"block_table": table_, "num_blocks_per_row": np.array([3], np.int32)}
    db.load_engine(Snapshot("vllm", arrays, {"block_size": BLOCK}))
    assert db.sql("SELECT block_index FROM block_table_entry ORDER BY 1").fetchall() == [
        (0,),
        (2,),
    ]


@pytest.mark.parametrize("name", ["vllm", "flashinfer"])
def test_export_keeps_a_block_size_other_than_16(db: pagedkv_sql.Database, name: str) -> None:
    snap = vllm_snapshot()
    snap.meta["block_size"] = 32
    db.load_engine(snap)
    out = db.export_engine(name)
    assert out.snapshot.meta["block_size"] == 32
    assert out.refused == []


def test_export_refuses_what_an_engine_array_cannot_hold(
    db: pagedkv_sql.Database, facts_dir: Any
) -> None:
    # seq 1: block 1 at two GPU bases; seq 2: tokens but no root_table row; seq 3: a block
    # table but no token
    tokens = [(s, p, p // 16, p % 16) for s in (1, 2) for p in range(20)]
    entries = [(100, 0, 256, 1), (100, 1, 512, 1), (100, 1, 768, 1), (300, 0, 1024, 1)]
    db.load(
        facts_dir(
            {
                "root_table": [(1, 100), (3, 300)],
                "block_table_entry": entries,
                "virtual_token": tokens,
            }
        )
    )
    out = db.export_engine("vllm")
    assert out.refused == [
        (1, None, "block 1 has 2 different GPU bases"),
        (2, None, "no root_table row (no block table)"),
        (3, None, "no tokens"),
    ]


def test_export_of_nothing_is_empty_arrays(db: pagedkv_sql.Database) -> None:
    arrays = db.export_engine("flashinfer").snapshot.arrays
    assert arrays["kv_indptr"].tolist() == [0]
    assert arrays["kv_indices"].size == 0
    assert arrays["kv_last_page_len"].size == 0
    arrays = db.export_engine("vllm").snapshot.arrays
    assert [arrays[a].size for a in ("block_table", "num_blocks_per_row", "slot_mapping")] == [
        0,
        0,
        0,
    ]


def test_export_writes_into_a_directory_it_creates(
    db: pagedkv_sql.Database, tmp_path: Path
) -> None:
    db.load_engine(vllm_snapshot())
    written = db.export_engine("vllm").write(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b" / "vllm.npz") in written


def test_an_engine_module_missing_from_the_build_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(engines.ENGINES, "ghost", "ghost")
    with pytest.raises(UsageError, match="engine 'ghost' is not available in this build"):
        engine("ghost")


# -- snapshot files and layouts -------------------------------------------------------------
def test_a_snapshot_file_records_format_version_1(tmp_path: Path) -> None:
    path = Snapshot("vllm", {}, {"block_size": 16}).save(tmp_path / "s.npz")
    with np.load(path) as npz:
        assert json.loads(str(npz["pagedkv"]))["format_version"] == 1


def test_metadata_that_is_not_json_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, pagedkv=np.array("{not json"))
    with pytest.raises(InputError, match="pagedkv metadata is not valid JSON"):
        read(path)


def test_a_block_size_that_is_not_a_number_is_named() -> None:
    for value in ("sixteen", [16]):
        with pytest.raises(InputError, match="is not an integer"):
            _ = Snapshot("vllm", {}, {"block_size": value}).block_size


def test_a_malformed_layout_is_named_and_an_old_one_is_pool_0() -> None:
    layout = {"name": "kv", "shape": [2], "strides": [1], "dtype": "f2", "itemsize": 2}
    assert CacheTensor.from_dict({**layout, "dims": ["block"]}).pool == 0
    for bad in ({**layout, "dims": ["block"], "shape": ["two"]}, layout, {**layout, "dims": 7}):
        with pytest.raises(InputError, match="is malformed"):
            CacheTensor.from_dict(bad)


class DLPackOnly:
    """A host array whose DLPack export fails (as a read-only or strided one can)."""

    def __dlpack__(self, **kw: Any) -> Any:
        raise BufferError("cannot export")


class DLPackRefused(DLPackOnly):
    """The same with ``__array__`` to fall back on."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.a


def test_a_failed_dlpack_export_falls_back_to_array_and_else_is_named() -> None:
    a = np.arange(4)
    assert as_numpy(DLPackRefused(a)) is a
    with pytest.raises(UsageError, match="x: cannot read it as a host array: cannot export"):
        as_numpy(DLPackOnly(), "x")


def test_flashinfer_k_and_v_pair_layouts() -> None:
    k = np.zeros((4, BLOCK, 2, 8), np.float16)
    got = flashinfer.cache_tensors((k, k.copy()), "NHD", layer=3)
    assert [(t.name, t.kv, t.layer, t.dims) for t in got] == [
        ("k_cache.3", 0, 3, ("block", "slot", "head", "dim")),
        ("v_cache.3", 1, 3, ("block", "slot", "head", "dim")),
    ]
    hnd = flashinfer.cache_tensors([k, k], "HND")
    assert hnd[0].dims == ("block", "head", "slot", "dim")
    with pytest.raises(UsageError, match="pair has two tensors"):
        flashinfer.cache_tensors((k, k, k), "NHD")
    one = np.zeros((4, 2, 2, BLOCK, 8), np.float16)
    assert flashinfer.cache_tensors(one, "HND")[0].dims == ("block", "kv", "head", "slot", "dim")
    assert flashinfer.cache_tensors(one, "NHD")[0].dims == ("block", "kv", "slot", "head", "dim")


def test_a_tensor_without_layer_holds_layer_0_and_addresses_are_values() -> None:
    dims = ("block", "kv", "slot", "head", "dim")
    t = CacheTensor("kv", (2, 2, BLOCK, 1, 1), (2 * BLOCK, BLOCK, 1, 1, 1), "f2", 2, dims, 0)
    assert layout.holds(t, 0, 1) and not layout.holds(t, 1, 1)
    # a tensor that names neither K nor V (no kv, no kv / kvdim dimension) holds neither
    plain = dataclasses.replace(t, shape=(2, BLOCK, 1, 1), dims=("block", "slot", "head", "dim"))
    assert not layout.holds(plain, 0, 0) and not layout.holds(plain, 0, 1)
    a = layout.KVAddress("K", "kv", 1, 2, 0x100, True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.address = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.pointer = 0  # type: ignore[misc]


def test_pools_take_their_own_tensors_and_round_unaligned_blocks_up() -> None:
    dims = ("block", "slot", "head", "dim")
    t0 = CacheTensor("a", (4, BLOCK, 1, 8), (8 * BLOCK, 8, 8, 1), "f2", 2, dims, 1 << 20, pool=0)
    t1 = CacheTensor("b", (6, BLOCK, 1, 4), (4 * BLOCK, 4, 4, 1), "f2", 2, dims, 1 << 21, pool=1)
    pool = Pool.from_tensors(1, "second", [t0, t1], BLOCK)
    assert (pool.pointer, pool.block_bytes, pool.num_blocks) == (1 << 21, 4 * BLOCK * 2, 6)
    assert Pool(0, "kv", block_bytes=300).addressing(2)[:2] == (2 << 40, 512)
    assert Pool(0, "kv", pointer=100, block_bytes=512).addressing(0)[:2] == (0, 512)
    with pytest.raises(dataclasses.FrozenInstanceError):
        pool.num_blocks = 7  # type: ignore[misc]


def test_trtllm_without_any_block_size_is_named() -> None:
    snap = trtllm.snapshot(trtllm_offsets([[(0, 5)]]), np.array([9], np.int32), BLOCK, 2)
    del snap.meta["tokens_per_block"], snap.meta["block_size"]
    with pytest.raises(InputError, match="metadata has no block_size"):
        trtllm.to_state(snap)


def test_trtllm_per_pool_metadata_is_one_value_or_one_per_pool() -> None:
    snap = trtllm.snapshot(trtllm_offsets([[(0, 5)]]), np.array([9], np.int32), BLOCK, [2])
    assert trtllm.to_state(snap).block_table.num_rows == 1
    snap.meta["num_layers"] = [2, 2]
    with pytest.raises(InputError, match="metadata 'num_layers' has to be one value or 1"):
        trtllm.to_state(snap)


@pytest.mark.parametrize(
    ("dtype", "itemsize"),
    [
        ("float16", 2),
        ("bfloat16", 2),
        ("float32", 4),
        ("fp8", 1),
        ("float8_e4m3fn", 1),
        ("int8", 1),
    ],
)
def test_trtllm_block_bytes_by_dtype(dtype: str, itemsize: int) -> None:
    snap = trtllm.snapshot(trtllm_offsets([[(0, 5)]]), np.array([9], np.int32), BLOCK, 2)
    snap.meta.update(num_kv_heads=4, size_per_head=64, dtype=dtype)
    pool = trtllm.to_state(snap).pools[0]
    assert pool.block_bytes == 4 * BLOCK * 64 * itemsize * 2 * 2  # K and V, 2 layers


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


def test_export_keeps_engine_block_0(db: pagedkv_sql.Database) -> None:
    indptr, _, last = csr_arrays()
    db.load_engine(flashinfer.snapshot(indptr, np.array([0, 7, 2], np.int32), last, BLOCK))
    arrays = db.export_engine("flashinfer").snapshot.arrays
    assert arrays["kv_indices"].tolist() == [0, 7, 2]
    assert "pagedkv_page_base" not in arrays


def test_export_dense_ids_up_to_the_int32_limit(
    db: pagedkv_sql.Database, facts_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # three distinct bases numbered from 0 fit a limit of 3, from 1 (vLLM) do not
    from pagedkv_sql.engines import export

    rows = [(100, i, 0x10000 * (i + 1), 1) for i in range(3)]
    tokens = [(1, p, p // 16, p % 16) for p in range(48)]
    db.load(
        facts_dir({"root_table": [(1, 100)], "block_table_entry": rows, "virtual_token": tokens})
    )
    monkeypatch.setattr(export, "INT32_MAX", 3)
    assert db.export_engine("flashinfer").snapshot.arrays["kv_indices"].tolist() == [0, 1, 2]
    with pytest.raises(pagedkv_sql.PagedKVError, match="3 distinct blocks do not fit int32"):
        db.export_engine("vllm")


def test_export_tells_a_swapped_block_from_a_page_fault(
    db: pagedkv_sql.Database, facts_dir: Any
) -> None:
    # seq 1 lacks block 1 anywhere; seq 2 has its block 1 swapped to the CPU
    tokens = [(s, p, p // 16, p % 16) for s in (1, 2) for p in range(20)]
    db.load(
        facts_dir(
            {
                "root_table": [(1, 100), (2, 200)],
                "block_table_entry": [(100, 0, 256, 1), (200, 0, 512, 1)],
                "swapped_block": [(200, 1, 4096)],
                "virtual_token": tokens,
            }
        )
    )
    assert db.export_engine("vllm").refused == [
        (1, None, "page fault: block 1 (tokens 16..) is neither resident nor swapped"),
        (2, None, "swapped: block 1 is on the CPU (swapped_block), not resident"),
    ]


@pytest.mark.parametrize("error", [BufferError, TypeError, RuntimeError])
def test_each_dlpack_failure_falls_back_to_array(error: type[Exception]) -> None:
    class Refusing(DLPackRefused):
        def __dlpack__(self, **kw: Any) -> Any:
            raise error("cannot export")

    a = np.arange(3)
    assert as_numpy(Refusing(a)) is a


def test_what_is_no_array_is_named() -> None:
    class Broken:
        def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
            raise TypeError("no")

    for value in ([[1, 2], [3]], Broken()):
        with pytest.raises(UsageError, match="x: cannot read it as an array"):
            as_numpy(value, "x")


def test_a_token_dim_pool_has_blocks_of_page_size_tokens() -> None:
    # SGLang's per-layer [slots, heads, dim] buffers: a page is page_size slots
    dims = ("token", "head", "dim")
    t = CacheTensor("k_buffer.0", (64, 2, 8), (16, 8, 1), "bfloat16", 2, dims, 1 << 20, kv=0)
    pool = Pool.from_tensors(0, "kv_pool", [t], BLOCK)
    assert (pool.block_bytes, pool.num_blocks) == (16 * 2 * BLOCK, 64 // BLOCK)


def test_an_element_index_needs_a_name_for_every_dimension() -> None:
    t = CacheTensor("kv", (2, BLOCK, 4), (BLOCK * 4, 4, 1), "f2", 2, ("block", "slot"), 0)
    with pytest.raises(ValueError, match="zip"):
        layout.element_index(t, 1, 0, BLOCK, 0, 0, 0)


def test_block_sizes_1_and_256_fit_the_spec_and_0_and_257_do_not() -> None:
    for size in (1, 256):
        assert Snapshot("vllm", {}, {"block_size": size}).block_size == size
    for size in (0, 257):
        with pytest.raises(InputError, match=rf"block_size {size} is outside \[1, 256\]"):
            _ = Snapshot("vllm", {}, {"block_size": size}).block_size


def test_load_engine_reports_the_engine_invariants_by_default(db: pagedkv_sql.Database) -> None:
    from pagedkv_sql.engines import load_engine

    from .example import example

    report = load_engine(db.con, example())  # chat-43's kv_last_page_len is 0
    assert [w.name for w in report.warnings] == ["diag_engine_csr_row"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.engine = "other"  # type: ignore[misc]
    with pytest.raises(InputError, match="int64"):  # and refuses int64 unless told to convert
        load_engine(db.con, int64_snapshots()["vllm"])


def test_export_numbers_densely_bases_off_the_pool_s_block_step(
    db: pagedkv_sql.Database, facts_dir: Any
) -> None:
    # pool 0 steps 512 bytes a block; a sequence appended at base 256 is on no block
    st = state({"req-a": [1]})
    st.pools = [Pool(0, "kv", block_bytes=512, num_blocks=NUM_BLOCKS)]
    write(db.con, st, "512-byte blocks")
    tokens = [(5, p, 0, p) for p in range(16)]
    db.load(
        facts_dir(
            {
                "root_table": [(5, 500)],
                "block_table_entry": [(500, 0, 256, 1)],
                "virtual_token": tokens,
            }
        ),
        append=True,
    )
    arrays = db.export_engine("vllm").snapshot.arrays
    assert arrays["pagedkv_block_base"].tolist() == [256, 512]


def test_trtllm_a_placeholder_belongs_to_its_group_s_primary_pool() -> None:
    snap = trtllm.snapshot(trtllm_offsets([[(0, 1), None]]), np.array([20], np.int32), BLOCK, 2)
    bt = trtllm.to_state(snap).block_table.to_pydict()
    assert list(zip(bt["pool_id"], bt["block_id"], strict=True)) == [(0, 1), (0, None)]


def test_trtllm_records_a_tensor_only_for_a_pool_with_a_pointer_and_a_size() -> None:
    snap = trtllm.snapshot(trtllm_offsets([[(0, 5)]]), np.array([9], np.int32), BLOCK, 2)
    snap.meta.update(num_kv_heads=1, size_per_head=8, dtype="float16", num_blocks=8)
    assert trtllm.to_state(snap).cache_tensors == []
    snap.arrays["host_kv_cache_pool_pointers"] = np.array([[1 << 32, 0]], dtype=np.int64)
    assert [t.name for t in trtllm.to_state(snap).cache_tensors] == ["pool 0 gpu"]


def test_flashinfer_reads_the_paged_kv_spellings(db: pagedkv_sql.Database) -> None:
    indptr, indices, last = csr_arrays()
    arrays = {"paged_kv_indptr": indptr, "paged_kv_indices": indices}
    arrays["paged_kv_last_page_len"] = last
    db.load_engine(Snapshot("flashinfer", arrays, {"page_size": BLOCK}))
    assert db.sql("SELECT count(*) FROM block_table_entry").fetchall() == [(3,)]


def test_a_state_without_pools_has_pool_0(db: pagedkv_sql.Database) -> None:
    st = state(SHARED)
    plain = EngineState(st.engine, st.block_size, st.requests, st.block_table)
    write(db.con, plain, "default pool")
    assert db.sql("SELECT count(*) FROM block_table_entry").fetchall() == [(7,)]


def test_vllm_lists_exactly_num_blocks_per_row_blocks(db: pagedkv_sql.Database) -> None:
    db.load_engine(vllm_snapshot())  # row b: [1, 2, 5, 0] with 3 blocks: the 0 is padding
    assert db.sql(
        "SELECT seq_id, count(*) FROM engine_block_table GROUP BY 1 ORDER BY 1"
    ).fetchall() == [
        (0, 4),
        (1, 3),
    ]


def test_sglang_engine_rows_and_a_negative_length(db: pagedkv_sql.Database) -> None:
    snap = sglang_snapshot()
    db.load_engine(snap)
    assert db.sql("SELECT engine_row FROM engine_request ORDER BY seq_id").fetchall() == [
        (3,),
        (4,),
    ]
    del snap.arrays["req_pool_indices"]
    db.load_engine(snap)
    assert db.sql("SELECT engine_row FROM engine_request ORDER BY seq_id").fetchall() == [
        (0,),
        (1,),
    ]
    snap.arrays["seq_lens"] = np.array([40, -1], dtype=np.int64)
    with pytest.raises(InputError) as e:
        db.load_engine(snap)
    assert "seq_lens[1] = -1 is outside [0, 48]" in str(e.value.problems)


def test_trtllm_kv_factor_defaults_to_2_and_a_k_only_cache_is_k() -> None:
    snap = trtllm.snapshot(trtllm_offsets([[(0, 5)]]), np.array([9], np.int32), BLOCK, 2)
    snap.meta.update(num_kv_heads=1, size_per_head=8, dtype="float16", num_blocks=8)
    snap.arrays["host_kv_cache_pool_pointers"] = np.array([[1 << 32, 0]], dtype=np.int64)
    del snap.meta["kv_factor"]
    state = trtllm.to_state(snap)
    assert state.pools[0].block_bytes == BLOCK * 8 * 2 * 2 * 2  # K and V of 2 layers
    assert [t.kv for t in state.cache_tensors] == [None]
    k_only = np.zeros((1, 1, 2, 4), dtype=np.int32)
    k_only[0, 0, :, 0] = 5 * 2  # block 5 of 2 layers, one field (K) each
    snap = trtllm.snapshot(k_only, np.array([9], np.int32), BLOCK, 2, kv_factor=1)
    snap.meta.update(num_kv_heads=1, size_per_head=8, dtype="float16", num_blocks=8)
    snap.arrays["host_kv_cache_pool_pointers"] = np.array([[1 << 32, 0]], dtype=np.int64)
    assert [t.kv for t in trtllm.to_state(snap).cache_tensors] == [0]


def test_vllm_full_last_blocks_and_a_4d_block_table(db: pagedkv_sql.Database) -> None:
    snap = vllm_snapshot()
    snap.arrays["num_tokens"] = np.array([64, 48], np.int64)  # every slot of every block
    db.load_engine(snap)
    assert db.sql("SELECT count(*) FROM virtual_token").fetchall() == [(112,)]
    snap.arrays["block_table"] = snap.arrays["block_table"][None, None]
    with pytest.raises(InputError, match=r"has shape \[1, 1, 2, 4\]; expected"):
        db.load_engine(snap)


def test_trtllm_a_pool_without_a_size_takes_any_block_id(db: pagedkv_sql.Database) -> None:
    db.load_engine(trtllm.snapshot(trtllm_offsets([[(0, 200)]]), np.array([9], np.int32), BLOCK, 2))
    assert db.sql("SELECT physical_block_base FROM block_table_entry").fetchall() == [(200 * 256,)]


def test_export_numbers_densely_a_base_below_the_pool(
    db: pagedkv_sql.Database, facts_dir: Any
) -> None:
    # a sequence appended after an import with a base below the pool's base (block id -1)
    db.load_engine(vllm_snapshot())
    tokens = [(5, p, 0, p) for p in range(16)]
    db.load(
        facts_dir(
            {
                "root_table": [(5, 500)],
                "block_table_entry": [(500, 0, -256, 1)],
                "virtual_token": tokens,
            }
        ),
        append=True,
    )
    arrays = db.export_engine("vllm").snapshot.arrays
    assert arrays["pagedkv_block_base"].tolist()[0] == -256
    assert arrays["block_table"].min() >= 0


@pytest.mark.parametrize("name", ["vllm", "flashinfer"])
def test_export_without_a_stored_block_size_uses_16(db: pagedkv_sql.Database, name: str) -> None:
    # a database whose settings lost the row (an old or hand-edited file)
    db.load_engine(vllm_snapshot())
    db.con.execute("DELETE FROM pagedkv_settings WHERE name = 'block_size'")
    assert db.export_engine(name).snapshot.meta["block_size"] == 16


def test_refusals_name_at_most_100_values_and_count_them_all() -> None:
    snap = Snapshot("vllm", {}, {"block_size": 16})
    with pytest.raises(InputError) as e:
        snap.refuse("x", np.ones(150, dtype=bool), lambda i: f"[{i}] is bad")
    assert len(e.value.problems) == 100 and e.value.total == 150


def test_a_missing_array_names_the_arrays_present() -> None:
    with pytest.raises(InputError, match=r"arrays present: none\)"):
        Snapshot("vllm", {}, {}).array("block_table")
    with pytest.raises(InputError, match=r"arrays present: a, b\)"):
        Snapshot("vllm", {"b": np.zeros(1), "a": np.zeros(1)}, {}).array("block_table")


def test_flashinfer_an_empty_batch_and_an_empty_indptr(db: pagedkv_sql.Database) -> None:
    empty = np.zeros(0, np.int32)
    db.load_engine(flashinfer.snapshot(np.array([0], np.int32), empty, empty, BLOCK))
    assert db.sql("SELECT count(*) FROM engine_request").fetchall() == [(0,)]
    with pytest.raises(InputError, match="array 'kv_indptr' is empty"):
        db.load_engine(flashinfer.snapshot(empty, empty, empty, BLOCK))


def test_a_pool_is_described_by_its_k_tensor_even_listed_after_v() -> None:
    dims = ("block", "slot", "head", "dim")
    shape, strides = (4, BLOCK, 1, 8), (8 * BLOCK, 8, 8, 1)
    v = CacheTensor("v", shape, strides, "f2", 2, dims, 2 << 20, kv=1, layer=0)
    k = CacheTensor("k", shape, strides, "f2", 2, dims, 1 << 20, kv=0, layer=0)
    assert Pool.from_tensors(0, "kv", [v, k], BLOCK).pointer == 1 << 20


def test_flashinfer_a_page_id_equal_to_num_pages_is_outside(db: pagedkv_sql.Database) -> None:
    indptr, _, last = csr_arrays()
    snap = flashinfer.snapshot(indptr, np.array([5, 7, 8], np.int32), last, BLOCK)
    snap.meta["num_pages"] = 8
    with pytest.raises(InputError) as e:
        db.load_engine(snap)
    assert "kv_indices[2] = 8 is outside the pool's 8 pages" in str(e.value.problems)


def test_sglang_pool_holds_the_reserved_page_and_num_pages_more(db: pagedkv_sql.Database) -> None:
    db.load_engine(sglang_snapshot())  # num_pages 7: pages 0 (reserved) .. 7
    assert db.sql("SELECT num_blocks FROM engine_pool").fetchall() == [(8,)]


def test_byte_addresses_need_recorded_tensors(db: pagedkv_sql.Database) -> None:
    with pytest.raises(UsageError, match="no cache-tensor layouts are stored"):
        layout.token_addresses(db.con, 0, 0, 0, 0)
    db.load_engine(vllm_snapshot())  # engine tables, but no tensor recorded
    with pytest.raises(UsageError, match="no cache-tensor layouts are stored"):
        layout.token_addresses(db.con, 0, 0, 0, 0)


def test_a_tensor_with_a_layer_dimension_holds_its_recorded_layer_or_all() -> None:
    dims = ("layer", "block", "kv", "slot", "head", "dim")
    t = CacheTensor("kv", (3, 2, 2, BLOCK, 1, 1), (0, 0, 0, 0, 0, 0), "f2", 2, dims, 0)
    assert [layout.holds(t, n, 0) for n in range(3)] == [True, True, True]
    one = dataclasses.replace(t, layer=1)
    assert [layout.holds(one, n, 0) for n in range(3)] == [False, True, False]


def test_a_snapshot_with_pickled_objects_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "pickled.npz"
    np.savez(path, block_table=np.array([{"a": 1}], dtype=object))
    with pytest.raises(InputError, match=r"not a readable \.npz snapshot"):
        read(path, "vllm")


def test_flashinfer_records_the_cache_of_every_layer() -> None:
    indptr, indices, last = csr_arrays()
    cache = np.zeros((8, 2, BLOCK, 1, 4), np.float16)
    snap = flashinfer.snapshot(indptr, indices, last, BLOCK, layers=[cache, cache.copy()])
    assert [(t.name, t.layer) for t in snap.cache_tensors] == [
        ("paged_kv_cache.0", 0),
        ("paged_kv_cache.1", 1),
    ]


def test_trtllm_an_odd_block_index_of_a_k_only_one_layer_cache() -> None:
    k_only = np.zeros((1, 1, 2, 4), dtype=np.int32)
    k_only[0, 0, :, 0] = 5  # block 5 of 1 layer, K only: index 5
    snap = trtllm.snapshot(k_only, np.array([9], np.int32), BLOCK, 1, kv_factor=1)
    assert trtllm.to_state(snap).block_table.column("block_id").to_pylist() == [5]


def test_safetensors_missing_is_a_usage_error_with_the_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "safetensors", None)  # an install without the extra
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    with pytest.raises(UsageError, match="need the safetensors package"):
        Snapshot("vllm", {}, {"block_size": 16}).save(tmp_path / "s.safetensors")


def test_trtllm_a_sequence_of_no_token_yet() -> None:
    snap = trtllm.snapshot(trtllm_offsets([[(0, 5)], []]), np.array([9, 0], np.int32), BLOCK, 2)
    state = trtllm.to_state(snap)
    assert state.requests.column("num_tokens").to_pylist() == [9, 0]
    assert state.block_table.num_rows == 1


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


def test_a_ref_cnt_below_its_holders_is_a_mismatch(db: pagedkv_sql.Database) -> None:
    # block 1 is held twice with ref_cnt 1 (a double free waiting to happen), block 4 once
    # with ref_cnt 2 (a leak)
    found = findings(db, state(SHARED, {1: 1, 4: 2}))
    assert found["diag_engine_ref_cnt_mismatch"] == [
        "ref_cnt 1 but 2 block-list entries hold block 1",
        "ref_cnt 2 but 1 block-list entry hold block 4",
    ]


def test_a_cpu_pool_block_is_swapped_at_its_pool_address(db: pagedkv_sql.Database) -> None:
    st = state({"req-a": [1]})
    st.pools = [Pool(0, "kv", num_blocks=NUM_BLOCKS), Pool(1, "host", tier="cpu", num_blocks=4)]
    extra = table(
        "engine_block_table", seq_id=[0], group_id=[0], block_index=[1], pool_id=[1], block_id=[3]
    )
    st.block_table = pa.concat_tables([st.block_table, extra])
    write(db.con, st, "one swapped block")
    assert spec_rows(db, "swapped_block") == [(0, 1, (1 << 40) + 3 * 256)]
