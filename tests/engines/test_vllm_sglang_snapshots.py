"""vLLM and SGLang snapshots built in the engines' exact shapes and dtypes (numpy only):
import, the round trip through `export vllm`, and bad snapshots refused by array and index.
The real engines are driven in tests/engines/real (make test-engines)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines import Snapshot, export_engine
from pagedkv_sql.errors import InputError


def vllm_snapshot() -> Snapshot:
    # two requests sharing a 32-token prefix, block size 16: [1, 2, 3, 4] and [1, 2, 5]
    table = np.array([[1, 2, 3, 4], [1, 2, 5, 0]], dtype=np.int32)
    arrays = {
        "block_table": table,
        "num_blocks_per_row": np.array([4, 3], dtype=np.int32),
        "num_tokens": np.array([52, 42], dtype=np.int64),
        "ref_cnt": np.array([0, 2, 2, 1, 1, 1, 0, 0], dtype=np.int32),
        "free_block_queue": np.array([6, 7], dtype=np.int32),
    }
    meta = {"block_size": 16, "request_ids": ["a", "b"], "num_blocks": 8, "num_free_blocks": 2}
    return Snapshot("vllm", arrays, meta)


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
    path = export_engine(db.con, "vllm").write(tmp_path)[-1]
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


def sglang_snapshot() -> Snapshot:
    rtt = np.zeros((2, 48), dtype=np.int32)
    rtt[0, :40] = np.r_[16:48, 48:56]  # pages 1, 2 (prefix), 3
    rtt[1, :42] = np.r_[16:48, 64:74]  # pages 1, 2 (shared), 4
    arrays = {
        "req_to_token": rtt,
        "seq_lens": np.array([40, 42], dtype=np.int64),
        "req_pool_indices": np.array([3, 4], dtype=np.int64),
        "free_pages": np.array([5, 6, 7], dtype=np.int64),
        "tree_pages": np.array([1, 2], dtype=np.int64),
        "tree_lock_ref": np.array([2, 2], dtype=np.int64),
    }
    return Snapshot("sglang", arrays, {"page_size": 16, "num_pages": 7, "request_ids": ["a", "b"]})


def test_sglang_snapshot_imports(db: pagedkv_sql.Database) -> None:
    db.load_engine(sglang_snapshot())
    got = db.sql(
        "SELECT seq_id, token_pos, physical_address FROM resolved_kv_address "
        "WHERE token_pos IN (0, 33, 41) ORDER BY ALL"
    ).fetchall()
    # page p's base is p * 256: slot s resolves to (s // 16) * 256 + s % 16
    assert got == [
        (0, 0, 256),
        (0, 33, 3 * 256 + 1),
        (1, 0, 256),
        (1, 33, 4 * 256 + 1),
        (1, 41, 4 * 256 + 9),
    ]
    assert db.check().ok(strict=True), db.violations().to_pylist()


def test_a_slot_outside_the_pool_is_named(db: pagedkv_sql.Database) -> None:
    snap = sglang_snapshot()
    snap.arrays["req_to_token"][1, 5] = 999
    with pytest.raises(InputError) as e:
        db.load_engine(snap)
    assert "[1, 5] = 999" in str(e.value.problems), e.value
