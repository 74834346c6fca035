"""FlashInfer's CSR page table in and out, with fixtures in its exact shapes and dtypes."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.engines import Snapshot, flashinfer, read
from pagedkv_sql.errors import InputError, UsageError

from ..helpers import DATA, PAGE, csr, snap
from .helpers import BLOCK
from .snapshots import csr_arrays


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_round_trip_gives_identical_arrays(
    db: pagedkv_sql.Database, tmp_path: Path, suffix: str
) -> None:
    original = snap([35, 16, 1], [[5, 7, 9], [2], [11]], request_ids=["a", "b", "c"])
    path = original.save(tmp_path / f"s{suffix}")
    report = db.load_engine(path)
    assert report.rows["virtual_token"] == 52
    exported = db.export_engine("flashinfer")
    assert exported.refused == []
    for name in flashinfer.ARRAYS:
        got = exported.snapshot.arrays[name]
        assert got.dtype == np.int32, name
        np.testing.assert_array_equal(got, original.arrays[name], err_msg=name)
    assert exported.snapshot.meta["request_ids"] == ["a", "b", "c"]
    written = exported.write(tmp_path / "out")
    assert {p.name for p in written} >= {"kv_indptr.npy", "flashinfer.npz"}
    again = read(tmp_path / "out" / "flashinfer.npz")
    np.testing.assert_array_equal(again.arrays["kv_indices"], original.arrays["kv_indices"])


def test_tokens_and_addresses(db: pagedkv_sql.Database) -> None:
    db.load_engine(snap([18], [[3, 8]]))
    rows = db.resolve_table().to_pylist()
    assert len(rows) == 18
    # no layout recorded: page p's base is p * 256, so the address is p * 256 + slot
    assert rows[0]["physical_address"] == 3 * 256
    assert rows[17]["physical_address"] == 8 * 256 + 1
    ids = db.sql("SELECT request_id FROM engine_request").to_arrow_table().column(0).to_pylist()
    assert ids == ["0"]


def test_int64_is_refused_unless_converted(db: pagedkv_sql.Database) -> None:
    a = {k: v.astype(np.int64) for k, v in csr([20], [[1, 2]]).items()}
    bad = Snapshot("flashinfer", a, {"page_size": PAGE})
    with pytest.raises(InputError, match=r"'kv_indptr' has dtype int64.*#725"):
        db.load_engine(bad)
    assert db.sql("SELECT count(*) AS n FROM virtual_token").to_arrow_table().column(
        0
    ).to_pylist() == [0]
    db.load_engine(bad, convert=True)
    assert db.sql("SELECT count(*) AS n FROM virtual_token").to_arrow_table().column(
        0
    ).to_pylist() == [20]
    assert db.export_engine("flashinfer").snapshot.arrays["kv_indices"].dtype == np.int32


GOOD = csr([35, 16], [[5, 7, 9], [2]])


def bad(**arrays: object) -> Snapshot:
    merged = {**GOOD, **arrays}
    return Snapshot(
        "flashinfer",
        {k: v for k, v in merged.items() if v is not None},
        {"page_size": PAGE, "num_pages": 10},
    )


@pytest.mark.parametrize(
    ("snapshot", "message"),
    [
        (bad(kv_indices=GOOD["kv_indices"].astype(np.float32)), r"'kv_indices' has dtype float32"),
        (bad(kv_indices=None), r"array 'kv_indices' is missing"),
        (
            bad(kv_last_page_len=np.array([3], np.int32)),
            r"'kv_last_page_len' has 1 entries but kv_indptr describes 2",
        ),
        (
            bad(kv_indptr=GOOD["kv_indptr"].reshape(1, 3)),
            r"'kv_indptr' has shape \[1, 3\]; expected 1",
        ),
        (
            bad(kv_indices=np.array([5, 7, 12, 2], np.int32)),
            r"kv_indices\[2\] = 12 is outside the pool's 10 pages",
        ),
        (bad(kv_indices=np.array([5, -1, 9, 2], np.int32)), r"kv_indices\[1\] = -1 is outside"),
        (bad(kv_indptr=np.array([0, 3, 9], np.int32)), r"kv_indptr\[2\] = 9 is outside \[0, 4\]"),
    ],
)
def test_bad_snapshot_names_array_and_index(
    db: pagedkv_sql.Database, snapshot: Snapshot, message: str
) -> None:
    db.load(DATA)
    before = (
        db.sql("SELECT count(*) AS n FROM virtual_token").to_arrow_table().column(0).to_pylist()
    )
    with pytest.raises(InputError) as e:
        db.load_engine(snapshot)
    assert re.search(message, "\n".join([e.value.message, *e.value.details]))
    assert (
        db.sql("SELECT count(*) AS n FROM virtual_token").to_arrow_table().column(0).to_pylist()
        == before
    )


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_truncated_file_is_refused_and_nothing_changes(
    cli: object, tmp_path: Path, suffix: str
) -> None:
    path = snap([35, 16], [[5, 7, 9], [2]]).save(tmp_path / f"s{suffix}")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[operator]
    r = cli("import", "flashinfer", str(path))  # type: ignore[operator]
    assert r.exit_code == 1
    assert f"Error: {path}: not a readable {suffix} snapshot" in r.output
    assert "Traceback" not in r.output
    assert cli("resolve").output.count("\n") == 7  # type: ignore[operator]


def test_file_without_metadata_needs_a_block_size(db: pagedkv_sql.Database, tmp_path: Path) -> None:
    np.savez(tmp_path / "raw.npz", **GOOD)
    with pytest.raises(InputError, match="no block_size"):
        db.load_engine(tmp_path / "raw.npz", "flashinfer")
    with pytest.raises(InputError, match="name the engine"):
        db.load_engine(tmp_path / "raw.npz")


def test_export_refuses_sequences_naming_why(db: pagedkv_sql.Database) -> None:
    db.load(DATA)  # the spec's data: seq 1 has a swapped block, seq 2 a page fault
    result = db.export_engine("flashinfer")
    reasons = {seq: why for seq, _, why in result.refused}
    assert reasons[1].startswith("hole:") or reasons[1].startswith("swapped")
    assert set(reasons) == {1, 2}
    assert result.snapshot.arrays["kv_indptr"].tolist() == [0]


def test_the_shipped_example_is_what_the_code_builds() -> None:
    from .example import PATH, example

    shipped, built = read(PATH), example()
    assert shipped.header() == built.header()
    assert shipped.arrays.keys() == built.arrays.keys()
    for name, array in built.arrays.items():
        assert shipped.arrays[name].dtype == array.dtype
        np.testing.assert_array_equal(shipped.arrays[name], array)


def test_capture_reads_a_planned_wrapper(db: pagedkv_sql.Database) -> None:
    from types import SimpleNamespace

    a = csr([35, 16], [[5, 7, 9], [2]])
    # a CUDA-graph wrapper: buffers sized for 4 requests, 2 planned
    indptr = np.zeros(5, np.int32)
    indptr[:3] = a["kv_indptr"]
    indices = np.zeros(16, np.int32)
    indices[:4] = a["kv_indices"]
    last = np.zeros(4, np.int32)
    last[:2] = a["kv_last_page_len"]
    wrapper = SimpleNamespace(
        _paged_kv_indptr_buf=indptr,
        _paged_kv_indices_buf=indices,
        _paged_kv_last_page_len_buf=last,
        _fixed_batch_size=2,
        _kv_layout="HND",
    )
    snap = flashinfer.capture(wrapper, PAGE, request_ids=["a", "b"])
    assert snap.meta["kv_layout"] == "HND"
    db.load_engine(snap)
    exported = db.export_engine("flashinfer").snapshot.arrays
    for name in flashinfer.ARRAYS:
        np.testing.assert_array_equal(exported[name], a[name])


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


def test_flashinfer_reads_the_paged_kv_spellings(db: pagedkv_sql.Database) -> None:
    indptr, indices, last = csr_arrays()
    arrays = {"paged_kv_indptr": indptr, "paged_kv_indices": indices}
    arrays["paged_kv_last_page_len"] = last
    db.load_engine(Snapshot("flashinfer", arrays, {"page_size": BLOCK}))
    assert db.sql("SELECT count(*) FROM block_table_entry").fetchall() == [(3,)]


def test_flashinfer_an_empty_batch_and_an_empty_indptr(db: pagedkv_sql.Database) -> None:
    empty = np.zeros(0, np.int32)
    db.load_engine(flashinfer.snapshot(np.array([0], np.int32), empty, empty, BLOCK))
    assert db.sql("SELECT count(*) FROM engine_request").fetchall() == [(0,)]
    with pytest.raises(InputError, match="array 'kv_indptr' is empty"):
        db.load_engine(flashinfer.snapshot(empty, empty, empty, BLOCK))


def test_flashinfer_a_page_id_equal_to_num_pages_is_outside(db: pagedkv_sql.Database) -> None:
    indptr, _, last = csr_arrays()
    snap = flashinfer.snapshot(indptr, np.array([5, 7, 8], np.int32), last, BLOCK)
    snap.meta["num_pages"] = 8
    with pytest.raises(InputError) as e:
        db.load_engine(snap)
    assert "kv_indices[2] = 8 is outside the pool's 8 pages" in str(e.value.problems)


def test_flashinfer_records_the_cache_of_every_layer() -> None:
    indptr, indices, last = csr_arrays()
    cache = np.zeros((8, 2, BLOCK, 1, 4), np.float16)
    snap = flashinfer.snapshot(indptr, indices, last, BLOCK, layers=[cache, cache.copy()])
    assert [(t.name, t.layer) for t in snap.cache_tensors] == [
        ("paged_kv_cache.0", 0),
        ("paged_kv_cache.1", 1),
    ]


# -- a kv_last_page_len of 2^31-1 is refused before it expands to 2^31 tokens (12 GB) ---------
@pytest.mark.parametrize(
    ("arrays", "meta", "message"),
    [
        (  # the finding: one page, 2^31-1 tokens in its "last page"
            {"kv_indptr": [0, 1], "kv_indices": [1], "kv_last_page_len": [2**31 - 1]},
            {},
            r"kv_last_page_len\[0\] = 2147483647 makes sequence 0 hold 2,147,483,647 tokens, "
            r"more than the pool's 2 pages x 16 tokens",
        ),
        (  # a pool size claimed in the metadata bounds it too
            {"kv_indptr": [0, 1], "kv_indices": [1], "kv_last_page_len": [100_000]},
            {"num_pages": 4096},
            r"kv_last_page_len\[0\] = 100000 makes sequence 0 hold 100,000 tokens, more than "
            r"the pool's 4,096 pages",
        ),
        (  # many sequences each just inside the pool, together past it
            {"kv_indptr": list(range(41)), "kv_indices": [1] * 40, "kv_last_page_len": [32] * 40},
            {},
            r"kv_last_page_len\[2\] = 32: sequences 0\.\.2 claim 48 tokens past their own pages, "
            r"more than the pool's 32 token slots",
        ),
        (  # a claimed pool no engine holds
            {"kv_indptr": [0, 1], "kv_indices": [1], "kv_last_page_len": [2**31 - 1]},
            {"num_pages": 2**31 - 1},
            r"a pool of 2,147,483,647 pages x 16 tokens .* is more than the 536,870,912 token",
        ),
    ],
)
def test_tokens_past_what_the_pool_holds_are_refused_before_any_is_made(
    db: pagedkv_sql.Database, arrays: dict[str, list[int]], meta: dict[str, int], message: str
) -> None:
    given = {k: np.array(v, np.int32) for k, v in arrays.items()}
    with pytest.raises(InputError) as e:
        db.load_engine(Snapshot("flashinfer", given, {"page_size": PAGE, **meta}))
    assert re.search(message, "\n".join([str(e.value), *e.value.details])), e.value.details
    assert db.sql("SELECT count(*) FROM virtual_token").fetchall() == [(0,)]


def test_a_last_page_past_page_size_but_inside_the_pool_stays_a_warning(
    db: pagedkv_sql.Database,
) -> None:
    given = csr([PAGE + 4], [[1]])  # 20 tokens on one page of 16
    report = db.load_engine(Snapshot("flashinfer", given, {"page_size": PAGE}))
    assert {w.name for w in report.warnings} >= {"diag_engine_csr_row"}


def test_num_pages_past_the_recorded_tensor_is_refused(db: pagedkv_sql.Database) -> None:
    cache = np.zeros((4, 2, PAGE, 1, 8), np.float16)
    s = snap([5], [[3]], paged_kv_cache=cache)
    s.meta["num_pages"] = 64
    with pytest.raises(InputError, match=r"metadata num_pages 64 is more than the 4 pages"):
        db.load_engine(s)


def aligned(shape: tuple[int, ...]) -> np.ndarray:
    """A float16 array starting on a 256-byte boundary, as CUDA allocations do: its pool's
    addresses are then its real byte addresses."""
    size = int(np.prod(shape)) * 2
    raw = np.zeros(size + 256, np.uint8)
    start = -raw.ctypes.data % 256
    return raw[start : start + size].view(np.float16).reshape(shape)


def addresses(db: pagedkv_sql.Database) -> list[tuple[int, ...]]:
    """Every token's physical address and its layer-1 head-1 K and V byte addresses, by
    request id (an export numbers its sequences in seq_id order)."""
    return db.sql(
        "SELECT r.request_id, a.token_pos, a.physical_address, k.kv, k.address "
        "FROM resolved_kv_address a JOIN pagedkv_kv_address(1, 1) k USING (seq_id, token_pos) "
        "JOIN engine_request r USING (seq_id) ORDER BY ALL"
    ).fetchall()


@pytest.mark.parametrize("source", ["flashinfer", "sglang", "vllm"])
@pytest.mark.parametrize("target", ["flashinfer", "vllm"])
def test_an_export_imports_again_with_every_address_it_had(
    db: pagedkv_sql.Database, tmp_path: Path, source: str, target: str
) -> None:
    """The export carries the cache-tensor layouts the import recorded, so that its import
    gives every block, token and K/V vector the address it had (not block_id * 256)."""
    from pagedkv_sql.engines import CacheTensor

    from .helpers import sglang_snapshot, vllm_snapshot

    if source == "flashinfer":
        layers = [aligned((12, 2, 2, PAGE, 8)) for _ in range(2)]  # HND
        original = snap([35, 16, 1], [[5, 7, 9], [2], [11]])
        original.cache_tensors = [
            t for i, c in enumerate(layers) for t in flashinfer.cache_tensors(c, "HND", i)
        ]
    elif source == "sglang":  # per-layer [slots, H, D] buffers, seq_ids 3 and 4
        original = sglang_snapshot()
        dims = ("token", "head", "dim")
        original.cache_tensors = [
            CacheTensor.of(
                f"{'kv'[kv]}.{layer}", aligned((8 * BLOCK, 2, 8)), dims, kv=kv, layer=layer
            )
            for layer in range(2)
            for kv in range(2)
        ]
    else:  # vLLM's (2, num_blocks, block_size, H, D) a layer
        original = vllm_snapshot()
        dims = ("kv", "block", "slot", "head", "dim")
        original.cache_tensors = [
            CacheTensor.of(f"kv.{layer}", aligned((2, 8, BLOCK, 2, 8)), dims, layer=layer)
            for layer in range(2)
        ]
    db.load_engine(original)
    rule = db.sql("SELECT value FROM engine_info WHERE name = 'pool 0 addresses'").fetchall()
    assert rule == [("pointer + block_id * block_bytes",)]
    before = addresses(db)
    assert len(before) == 2 * db.sql("SELECT count(*) FROM virtual_token").fetchall()[0][0]
    exported = db.export_engine(target)
    assert exported.refused == [] and exported.snapshot.cache_tensors == [
        dataclasses.replace(t, pool=0) for t in original.cache_tensors
    ]
    exported.write(tmp_path / "out")
    with pagedkv_sql.connect(":memory:") as again:
        again.load_engine(tmp_path / "out" / f"{target}.npz")
        assert addresses(again) == before
    if target == "flashinfer":  # the layout FlashInfer is planned with
        assert exported.snapshot.meta["kv_layout"] == ("HND" if source == "flashinfer" else "NHD")
