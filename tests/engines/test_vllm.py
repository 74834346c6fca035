"""vLLM snapshots built in the engine's exact shapes and dtypes (numpy only): import, the
round trip through `export vllm`, and bad snapshots refused by array and index. The real
engine is driven in tests/engines/real (make test-engines)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines import Snapshot, export_arrays, vllm
from pagedkv_sql.errors import InputError

from .helpers import BLOCK, vllm_snapshot


def test_vllm_snapshot_imports_with_its_refcounts(db: pagedkv_sql.Database) -> None:
    db.load_engine(vllm_snapshot())
    rows = db.sql(
        "SELECT block_table_id, block_index, physical_block_base, refcount "
        "FROM block_table_entry ORDER BY ALL"
    ).fetchall()
    assert rows[:4] == [(0, 0, 256, 2), (0, 1, 512, 2), (0, 2, 768, 1), (0, 3, 1024, 1)]
    assert rows[4:] == [(1, 0, 256, 2), (1, 1, 512, 2), (1, 2, 1280, 1)]
    assert db.sql("SELECT count(*) FROM virtual_token").fetchall() == [(94,)]
    assert db.check().ok(strict=True), db.violations().to_pylist()


def test_export_vllm_imports_again(db: pagedkv_sql.Database, tmp_path: Path) -> None:
    db.load_engine(vllm_snapshot())
    before = db.resolve_table()
    path = export_arrays(db, "vllm").write(tmp_path)[-1]
    with pagedkv_sql.connect(":memory:") as again:
        again.load_engine(path)
        assert again.resolve_table().equals(before)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"block_table": np.zeros((2, 4), np.float32)}, "array 'block_table' has dtype float32"),
        ({"num_blocks_per_row": np.array([4, 9], np.int32)}, r"num_blocks_per_row\[1\] = 9"),
        ({"num_tokens": np.array([52, 99], np.int64)}, r"num_tokens\[1\] = 99"),
        ({"num_blocks_per_row": np.array([4], np.int32)}, "has shape"),
        # a computed count is bounded: never stored as it came, however far past the
        # request's blocks (2^31-1 on one block), or negative
        (
            {"num_computed_tokens": np.array([52, 2**31 - 1], np.int64)},
            r"num_computed_tokens\[1\] = 2147483647 does not fit request 'b''s 3 block",
        ),
        ({"num_computed_tokens": np.array([-1, 0], np.int64)}, r"num_computed_tokens\[0\] = -1"),
        ({"num_computed_tokens": np.array([65, 0], np.int64)}, r"num_computed_tokens\[0\] = 65"),
    ],
)
def test_bad_vllm_snapshots_name_the_array(
    db: pagedkv_sql.Database, change: dict[str, np.ndarray], message: str
) -> None:
    snap = vllm_snapshot()
    snap.arrays.update(change)
    with pytest.raises(InputError) as e:
        db.load_engine(snap)
    assert re.search(message, f"{e.value} {e.value.problems}"), e.value
    assert db.sql("SELECT count(*) FROM root_table").fetchall() == [(0,)]


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


def test_vllm_lists_exactly_num_blocks_per_row_blocks(db: pagedkv_sql.Database) -> None:
    db.load_engine(vllm_snapshot())  # row b: [1, 2, 5, 0] with 3 blocks: the 0 is padding
    assert db.sql(
        "SELECT seq_id, count(*) FROM engine_block_table GROUP BY 1 ORDER BY 1"
    ).fetchall() == [
        (0, 4),
        (1, 3),
    ]


def test_vllm_full_last_blocks_and_a_4d_block_table(db: pagedkv_sql.Database) -> None:
    snap = vllm_snapshot()
    snap.arrays["num_tokens"] = np.array([64, 48], np.int64)  # every slot of every block
    db.load_engine(snap)
    assert db.sql("SELECT count(*) FROM virtual_token").fetchall() == [(112,)]
    snap.arrays["block_table"] = snap.arrays["block_table"][None, None]
    with pytest.raises(InputError, match=r"has shape \[1, 1, 2, 4\]; expected"):
        db.load_engine(snap)
