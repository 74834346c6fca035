"""SGLang snapshots built in the engine's exact shapes and dtypes (numpy only): import, and
bad snapshots refused by array and index. The real engine is driven in
tests/engines/real (make test-engines)."""

from __future__ import annotations

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.errors import InputError

from .helpers import sglang_snapshot


def test_sglang_snapshot_imports(db: pagedkv_sql.Database) -> None:
    db.load_engine(sglang_snapshot())
    got = db.sql(
        "SELECT seq_id, token_pos, physical_address FROM resolved_kv_address "
        "WHERE token_pos IN (0, 33, 41) ORDER BY ALL"
    ).fetchall()
    # page p's base is p * 256: slot s resolves to (s // 16) * 256 + s % 16; the rows are
    # pool rows 3 and 4 (req_pool_indices), their seq_ids
    assert got == [
        (3, 0, 256),
        (3, 33, 3 * 256 + 1),
        (4, 0, 256),
        (4, 33, 4 * 256 + 1),
        (4, 41, 4 * 256 + 9),
    ]
    assert db.check().ok(strict=True), db.violations().to_pylist()


def test_a_slot_outside_the_pool_is_named(db: pagedkv_sql.Database) -> None:
    snap = sglang_snapshot()
    snap.arrays["req_to_token"][1, 5] = 999
    with pytest.raises(InputError) as e:
        db.load_engine(snap)
    assert "[1, 5] = 999" in str(e.value.problems), e.value


def test_sglang_an_empty_request_and_slot_0_without_num_pages(db: pagedkv_sql.Database) -> None:
    # seq_lens 0 is a request with no token yet; without num_pages only negative slots are
    # outside the pool, and slot 0 (page 0, the reserved page) is a slot like any other
    snap = sglang_snapshot()
    del snap.meta["num_pages"]
    snap.arrays["seq_lens"] = np.array([40, 0], dtype=np.int64)
    snap.arrays["req_to_token"][0, 0] = 0
    db.load_engine(snap)
    assert db.sql("SELECT seq_id, num_tokens FROM engine_request ORDER BY 1").fetchall() == [
        (3, 40),
        (4, 0),
    ]
    assert db.sql("SELECT slot FROM engine_token_slot WHERE token_pos = 0").fetchall() == [(0,)]


def test_sglang_page_0_is_the_null_block(db: pagedkv_sql.Database) -> None:
    db.load_engine(sglang_snapshot())
    assert db.sql("SELECT block_id, is_null FROM engine_block ORDER BY 1").fetchall() == [
        (0, True),
        (1, False),
        (2, False),
    ]


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


def test_sglang_pool_holds_the_reserved_page_and_num_pages_more(db: pagedkv_sql.Database) -> None:
    db.load_engine(sglang_snapshot())  # num_pages 7: pages 0 (reserved) .. 7
    assert db.sql("SELECT num_blocks FROM engine_pool").fetchall() == [(8,)]


def test_a_join_on_req_pool_idx_reads_that_request(db: pagedkv_sql.Database) -> None:
    """seq_id is SGLang's req_pool_idx (docs/engines.md): the rows of pool rows 4 and 3,
    in that order, are each read back by their own index, never by their position."""
    snap = sglang_snapshot()
    snap.arrays["req_pool_indices"] = np.array([4, 3], np.int64)
    db.load_engine(snap)
    rows = db.sql(
        "SELECT seq_id, engine_row, request_id, num_tokens FROM engine_request ORDER BY 1"
    ).fetchall()
    assert rows == [(3, 3, "b", 42), (4, 4, "a", 40)]
    # the slots a user reads for req_pool_idx 3 are row "b"'s: its own page 4 (slots 64..)
    slots = db.sql("SELECT slot FROM engine_token_slot WHERE seq_id = 3 AND token_pos = 32")
    assert slots.fetchall() == [(64,)]


def test_req_pool_indices_name_each_row_once(db: pagedkv_sql.Database) -> None:
    snap = sglang_snapshot()
    snap.arrays["req_pool_indices"] = np.array([3, 3], np.int64)
    with pytest.raises(InputError) as e:
        db.load_engine(snap)
    assert "req_pool_indices[1] = 3 names a pool row an earlier row names too" in str(
        e.value.problems
    )
    snap.arrays["req_pool_indices"] = np.array([-1, 3], np.int64)
    with pytest.raises(InputError) as e:
        db.load_engine(snap)
    assert "req_pool_indices[0] = -1 is negative" in str(e.value.problems)
