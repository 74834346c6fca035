"""TensorRT-LLM's kv_cache_block_offsets, with fixtures in its exact shape and dtype:
int32 [num_pools, num_seqs * beam, 2, max_blocks_per_seq] of KVCacheIndex values."""

from __future__ import annotations

import re

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines import trtllm
from pagedkv_sql.errors import InputError

TPB, LAYERS, KV = 16, 2, 2
SECONDARY = 1 << 30  # KVCacheIndex pool type 1, in the top two bits
NULL = -1  # KVCacheIndex::nullIndex


def offsets(rows: list[list[tuple[int, int] | None]], max_blocks: int = 4) -> np.ndarray:
    """One pool; each row a list of (pool type, block) or None for a placeholder."""
    out = np.zeros((1, len(rows), 2, max_blocks), dtype=np.int32)
    for r, blocks in enumerate(rows):
        for b, entry in enumerate(blocks):
            if entry is None:
                out[0, r, :, b] = NULL
                continue
            kind, block = entry
            k = block * LAYERS * KV + (SECONDARY if kind else 0)
            out[0, r, 0, b], out[0, r, 1, b] = k, k + 1
    return out


def snap(rows: list[list[tuple[int, int] | None]], lengths: list[int], **kw: object) -> object:
    return trtllm.snapshot(
        offsets(rows),
        np.array(lengths, dtype=np.int32),
        TPB,
        LAYERS,
        request_ids=[f"req{i}" for i in range(len(rows))],
        **kw,
    )


def rows_of(db: pagedkv_sql.Database, sql: str) -> list[tuple[object, ...]]:
    return [tuple(r.values()) for r in db.sql(sql).to_arrow_table().to_pylist()]


def test_primary_secondary_and_shared_blocks(db: pagedkv_sql.Database) -> None:
    db.load_engine(snap([[(0, 5), (1, 2), (0, 7)], [(0, 5)]], [40, 16]))
    assert rows_of(db, "SELECT * FROM block_table_entry ORDER BY ALL") == [
        (0, 0, 5 * 256, 2),
        (0, 2, 7 * 256, 1),
        (1, 0, 5 * 256, 2),
    ]
    # pool 0's secondary pool is pool id 1: its addresses start at 2^40
    assert rows_of(db, "SELECT * FROM swapped_block") == [(0, 1, (1 << 40) + 2 * 256)]
    assert db.resolve_table().num_rows == 56
    assert db.check().warnings == 0


def test_placeholder_is_a_page_fault(db: pagedkv_sql.Database) -> None:
    report = db.load_engine(snap([[(0, 1), None]], [20]))
    assert [w.name for w in report.warnings] == ["diag_unresolved_token"]
    assert report.warnings[0].count == 4


def test_pool_pointers_give_real_block_bases(db: pagedkv_sql.Database) -> None:
    heads, dim = 4, 64
    pointers = np.array([[0x7F0000000000, 0x10000000]], dtype=np.int64)
    s = snap(
        [[(0, 3)]],
        [10],
        pool_pointers=pointers,
        num_kv_heads=heads,
        size_per_head=dim,
        dtype="float16",
        num_blocks=8,
        num_secondary_blocks=8,
    )
    db.load_engine(s)
    block_bytes = LAYERS * KV * heads * TPB * dim * 2
    assert rows_of(db, "SELECT physical_block_base FROM block_table_entry") == [
        (0x7F0000000000 + 3 * block_bytes,)
    ]
    # V of layer 1, head 2, token 5: [block 3, layer 1, V, head 2, slot 5, dim 0]
    (v,) = rows_of(
        db, "SELECT address FROM pagedkv_kv_address(1, 2) WHERE token_pos = 5 AND kv = 'V'"
    )
    sub = heads * TPB * dim
    element = ((3 * LAYERS + 1) * KV + 1) * sub + (2 * TPB + 5) * dim
    assert v == (0x7F0000000000 + 2 * element,)


def test_tertiary_blocks_stay_in_the_engine_tables_and_check_says_so(
    db: pagedkv_sql.Database,
) -> None:
    o = offsets([[(0, 1), (0, 0), (1, 2)], [(0, 0)]])
    for row, block_index, block in ((0, 1, 3), (1, 0, 6)):  # pool type 2: disk
        k = np.array([(2 << 30) + block * LAYERS * KV], np.int64).astype(np.int32)[0]
        o[0, row, 0, block_index], o[0, row, 1, block_index] = k, k + 1
    lengths, ids = np.array([40, 5], np.int32), ["req0", "req1"]
    report = db.load_engine(trtllm.snapshot(o, lengths, TPB, LAYERS, request_ids=ids))
    # the spec's relations hold the GPU and host blocks only
    assert rows_of(db, "SELECT * FROM block_table_entry") == [(0, 0, 256, 1)]
    assert rows_of(db, "SELECT block_table_id, block_index FROM swapped_block") == [(0, 2)]
    # the disk blocks are the engine's facts, in its disk pool (pool 0's tertiary: id 2)
    assert rows_of(
        db,
        "SELECT seq_id, block_index, pool_id, block_id, tier FROM engine_block_table "
        "JOIN engine_pool USING (pool_id) WHERE tier = 'disk' ORDER BY ALL",
    ) == [(0, 1, 2, 3, "disk"), (1, 0, 2, 6, "disk")]
    found = {w.name: w for w in report.warnings}
    assert sorted(found) == ["diag_engine_disk_block", "diag_unresolved_token"]
    assert found["diag_unresolved_token"].count == 16 + 5
    assert [v.reason for v in found["diag_engine_disk_block"].violations] == [
        "request req0 holds block 3 (block index 1) in pool 0 tertiary, on disk: "
        "no tier of the spec holds it",
        "request req1 holds block 6 (block index 0) in pool 0 tertiary, on disk: "
        "no tier of the spec holds it",
    ]
    with pytest.raises(pagedkv_sql.ConstraintError, match="refused under --strict"):
        db.load_engine(trtllm.snapshot(o, lengths, TPB, LAYERS), strict=True)


def test_older_encoding_flags_secondary_with_bit_31(db: pagedkv_sql.Database) -> None:
    o = offsets([[(0, 1)]])
    o[0, 0, 0, 0] = np.int32(-(1 << 31) + 1 * LAYERS * KV)
    o[0, 0, 1, 0] = o[0, 0, 0, 0] + 1
    s = trtllm.snapshot(o, np.array([4], np.int32), TPB, LAYERS, index_encoding="secondary_bit31")
    db.load_engine(s)
    assert rows_of(db, "SELECT block_index, cpu_base_address FROM swapped_block") == [
        (0, (1 << 40) + 256)
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda o, n: (o.astype(np.int64), n), r"'kv_cache_block_offsets' has dtype int64"),
        (lambda o, n: (o[:, :, :1], n), r"third dimension is K/V"),
        (lambda o, n: (o, n[:1]), r"'sequence_length' has 1 entries for 2 rows"),
        (lambda o, n: (o, np.array([40, 90], np.int32)), r"sequence_length\[1\] = 90 needs 6"),
        (lambda o, n: (_v(o, 0, 1, 999), n), r"\[0, 0, 1, 1\] = 999: the V index"),
        (lambda o, n: (_v(o, 0, 0, 3), n), r"\[0, 0, 0, 1\] = 3: a K index is a multiple of 4"),
    ],
)
def test_bad_snapshots_are_refused_naming_the_index(
    db: pagedkv_sql.Database, change: object, message: str
) -> None:
    o, n = offsets([[(0, 5), (0, 2), (0, 7)], [(0, 5)]]), np.array([40, 16], np.int32)
    o, n = change(o, n)  # type: ignore[operator]
    with pytest.raises(InputError) as e:
        db.load_engine(trtllm.snapshot(o, n, TPB, LAYERS))
    assert re.search(message, "\n".join([e.value.message, *e.value.details]))
    assert db.sql("SELECT count(*) AS n FROM virtual_token").to_arrow_table().column(
        0
    ).to_pylist() == [0]


def _v(o: np.ndarray, row: int, kv: int, value: int) -> np.ndarray:
    o = o.copy()
    o[0, row, kv, 1] = value
    return o


def test_a_free_block_counter_out_of_step_is_found(db: pagedkv_sql.Database) -> None:
    # TensorRT-LLM #11879: the offload path corrupted the free-block counter
    rows = [[(0, 5), (1, 2), (0, 7)], [(0, 5)]]
    good = db.load_engine(snap(rows, [40, 16], num_blocks=8, num_free_blocks=6))
    assert good.warnings == []  # blocks 5 and 7 are held: 6 of 8 are free
    bad = db.load_engine(snap(rows, [40, 16], num_blocks=8, num_free_blocks=7))
    (finding,) = bad.warnings
    assert finding.name == "diag_engine_free_count"
    assert finding.rows.column("reason").to_pylist() == [
        "pool 0 primary counts 7 free blocks, but 6 of its blocks are held by no request"
    ]
