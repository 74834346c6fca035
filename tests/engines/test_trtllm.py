"""TensorRT-LLM's kv_cache_block_offsets, with fixtures in its exact shape and dtype:
int32 [num_pools, num_seqs * beam, 2, max_blocks_per_seq] of KVCacheIndex values."""

from __future__ import annotations

import re

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines import trtllm
from pagedkv_sql.errors import InputError

from .helpers import BLOCK, KV, LAYERS, TPB, offsets
from .helpers import offsets as trtllm_offsets


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


def _v(o: np.ndarray, row: int, kv: int, value: int) -> np.ndarray:
    o = o.copy()
    o[0, row, kv, 1] = value
    return o


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


def test_trtllm_beam_width_defaults_to_1_and_0_is_refused() -> None:
    snap = trtllm.snapshot(trtllm_offsets([[(0, 5)]]), np.array([9], np.int32), BLOCK, 2)
    del snap.meta["beam_width"]
    state = trtllm.to_state(snap)
    assert state.requests.column("request_id").to_pylist() == ["0"]
    snap.meta["beam_width"] = 0
    with pytest.raises(InputError, match=r"metadata beam_width 0 is outside \[1, 65536\]"):
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


def test_trtllm_a_pool_without_a_size_takes_any_block_id(db: pagedkv_sql.Database) -> None:
    db.load_engine(trtllm.snapshot(trtllm_offsets([[(0, 200)]]), np.array([9], np.int32), BLOCK, 2))
    assert db.sql("SELECT physical_block_base FROM block_table_entry").fetchall() == [(200 * 256,)]


def test_trtllm_an_odd_block_index_of_a_k_only_one_layer_cache() -> None:
    k_only = np.zeros((1, 1, 2, 4), dtype=np.int32)
    k_only[0, 0, :, 0] = 5  # block 5 of 1 layer, K only: index 5
    snap = trtllm.snapshot(k_only, np.array([9], np.int32), BLOCK, 1, kv_factor=1)
    assert trtllm.to_state(snap).block_table.column("block_id").to_pylist() == [5]


def test_trtllm_a_sequence_of_no_token_yet() -> None:
    snap = trtllm.snapshot(trtllm_offsets([[(0, 5)], []]), np.array([9, 0], np.int32), BLOCK, 2)
    state = trtllm.to_state(snap)
    assert state.requests.column("num_tokens").to_pylist() == [9, 0]
    assert state.block_table.num_rows == 1


# -- refused by field: "layer_first": "false" is not true, uint64 pointers do not wrap
# negative, a kv_factor / num_layers of 0 divides nothing, an overflow names its field
@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({"layer_first": "false"}, r'metadata layer_first "false" is not a JSON boolean'),
        ({"layer_first": 1}, r"metadata layer_first 1 is not a JSON boolean"),
        ({"kv_factor": 0}, r"metadata kv_factor 0 is not one of 1, 2"),
        ({"kv_factor": 2.0}, r"metadata kv_factor 2\.0 is not one of 1, 2"),
        ({"num_layers": 0}, r"metadata num_layers 0 is outside \[1, 65536\]"),
        ({"num_layers": [0]}, r"metadata num_layers\[0\] 0 is outside"),
        ({"num_kv_heads": -8}, r"metadata num_kv_heads -8 is outside"),
        ({"beam_width": 0}, r"metadata beam_width 0 is outside"),
        ({"index_encoding": 30}, r"metadata index_encoding 30 is not one of"),
    ],
)
def test_trtllm_metadata_is_refused_not_coerced(
    db: pagedkv_sql.Database, meta: dict[str, object], message: str
) -> None:
    s = snap([[(0, 1)]], [10])
    s.meta.update(meta)  # type: ignore[attr-defined]
    with pytest.raises(InputError, match=message):
        db.load_engine(s)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pointers", "message"),
    [
        (np.array([[2**63, 0]], np.uint64), r"\[0, 0\] = 9223372036854775808 is past 2\^63 - 1"),
        (np.array([[0, 2**64 - 256]], np.uint64), r"\[0, 1\] = 18446744073709551360 is past"),
        (np.array([[-(2**40), 0]], np.int64), r"\[0, 0\] = -1099511627776 is a negative address"),
    ],
)
def test_trtllm_pool_pointers_outside_the_address_space_are_refused(
    db: pagedkv_sql.Database, pointers: np.ndarray, message: str
) -> None:
    s = snap([[(0, 1)]], [10], pool_pointers=pointers)
    with pytest.raises(InputError, match="bad value") as e:
        db.load_engine(s)  # type: ignore[arg-type]
    assert re.search(message, e.value.details[0]), e.value.details


def test_trtllm_block_addresses_past_64_bits_name_the_pool(db: pagedkv_sql.Database) -> None:
    # named by field, not DuckDB's "Overflow in multiplication"
    s = snap(
        [[(0, 3)]],
        [10],
        pool_pointers=np.array([[2**63 - 2**41, 0]], np.int64),
        num_kv_heads=1 << 16,
        size_per_head=1 << 16,
        dtype="float32",
        num_blocks=8,
    )
    with pytest.raises(InputError, match=r"block 3 of pool 0 \(pool 0 primary\) has no address"):
        db.load_engine(s)  # type: ignore[arg-type]
