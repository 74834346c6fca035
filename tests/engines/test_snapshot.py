"""The snapshot container: arrays in without a copy, files out and back."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql import engines
from pagedkv_sql.engines import CacheTensor, Snapshot, engine, flashinfer, read, trtllm
from pagedkv_sql.engines.snapshot import as_numpy
from pagedkv_sql.errors import InputError, UsageError

from .helpers import (
    BLOCK,
    CSR,
    I32,
    flashinfer_header,
    import_module,
    load_engine_file,
    sglang_snapshot,
    vllm_snapshot,
    write_npz,
)
from .helpers import offsets as trtllm_offsets
from .snapshots import csr_arrays


class ArrayOnly:
    """Something with __array__ only (no DLPack)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.a


class OnGpu:
    """A CUDA tensor as a snapshot sees it: read only through one ``cpu()`` copy."""

    is_cuda = True

    def __init__(self, host: np.ndarray) -> None:
        self.host, self.copies = host, 0

    def __dlpack__(self, **kw: Any) -> Any:
        raise AssertionError("a GPU tensor's memory must not be read in place")

    def cpu(self) -> np.ndarray:
        self.copies += 1
        return self.host


def test_arrays_are_shared_not_copied() -> None:
    a = np.arange(10, dtype=np.int32)
    assert as_numpy(a) is a
    assert np.shares_memory(as_numpy(ArrayOnly(a)), a)
    assert as_numpy(memoryview(a)).tolist() == a.tolist()


def test_a_gpu_array_is_copied_to_the_host_once_wherever_arrays_are_taken() -> None:
    indptr = OnGpu(np.array([0, 1, 3], np.int32))
    snap = flashinfer.snapshot(indptr, np.array([4, 1, 2], np.int32), np.array([3, 16], I32), BLOCK)
    assert indptr.copies == 1 and snap.arrays["kv_indptr"] is indptr.host
    with pagedkv_sql.connect(":memory:") as db:
        db.load_engine(snap)  # the host copy is the snapshot's array from then on
        assert indptr.copies == 1
        seq = OnGpu(np.array([7], np.int64))
        db.load_arrow("root_table", {"seq_id": seq, "block_table_ptr": np.array([70])})
        assert seq.copies == 1
        assert db.sql("SELECT * FROM root_table").fetchall() == [(7, 70)]


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_save_and_read_keep_arrays_metadata_and_layouts(tmp_path: Path, suffix: str) -> None:
    cache = CacheTensor.of(
        "k", np.zeros((4, 16, 2, 8), np.float16), ("block", "slot", "head", "dim"), kv=0
    )
    snap = Snapshot(
        "flashinfer",
        {"kv_indptr": np.array([0, 1], np.int32), "big": np.arange(3, dtype=np.int64)},
        {"page_size": 16, "request_ids": ["a"]},
        [cache],
    )
    back = read(snap.save(tmp_path / f"s{suffix}"))
    assert back.engine == "flashinfer" and back.meta == snap.meta
    assert back.cache_tensors == [cache]
    for name, array in snap.arrays.items():
        assert back.arrays[name].dtype == array.dtype
        np.testing.assert_array_equal(back.arrays[name], array)


def test_a_file_of_another_engine_is_refused(tmp_path: Path) -> None:
    path = Snapshot("trtllm", {}, {"block_size": 16}).save(tmp_path / "t.npz")
    with pytest.raises(InputError, match=r"is a trtllm snapshot, not flashinfer"):
        read(path, "flashinfer")
    with pytest.raises(UsageError, match=r"\.safetensors or \.npz"):
        read(tmp_path / "t.json")


def test_block_size_must_fit_the_spec() -> None:
    with pytest.raises(InputError, match=r"block_size 512 is outside \[1, 256\]"):
        _ = Snapshot("vllm", {}, {"block_size": 512}).block_size


@pytest.mark.engines
def test_torch_tensors_are_shared_through_dlpack(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(12, dtype=torch.int32)
    a = as_numpy(t)
    assert a.dtype == np.int32
    assert a.__array_interface__["data"][0] == t.data_ptr()  # no copy
    cache = torch.zeros((3, 2, 16, 4, 8), dtype=torch.bfloat16)
    layout = CacheTensor.of("kv", cache, ("block", "kv", "slot", "head", "dim"))
    assert (layout.pointer, layout.strides, layout.dtype) == (
        cache.data_ptr(),
        cache.stride(),
        "bfloat16",
    )
    snap = Snapshot("flashinfer", {"kv_indptr": t}, {"page_size": 16}, [layout])
    back = read(snap.save(tmp_path / "s.safetensors"))
    np.testing.assert_array_equal(back.arrays["kv_indptr"], t.numpy())


def test_a_device_tensor_is_recorded_from_its_attributes_never_copied() -> None:
    class CudaArray:  # cupy / numba: __cuda_array_interface__, strides in bytes or None
        shape = (4, 16, 2, 8)

        def __init__(self, strides: tuple[int, ...] | None) -> None:
            self.__cuda_array_interface__ = {
                "shape": self.shape,
                "typestr": "<f2",
                "data": (0x7F0000000000, False),
                "strides": strides,
                "version": 3,
            }

    dims = ("block", "slot", "head", "dim")
    dense = CacheTensor.of("k", CudaArray(None), dims, kv=0)
    assert (dense.pointer, dense.strides, dense.dtype, dense.itemsize) == (
        0x7F0000000000,
        (256, 16, 8, 1),
        "float16",
        2,
    )
    strided = CacheTensor.of("k", CudaArray((1024, 32, 16, 2)), dims, kv=0)
    assert strided.strides == (512, 16, 8, 1)

    class Opaque(OnGpu):  # on a device, and no pointer to read: never copied to record one
        shape = (4, 16, 2, 8)

    with pytest.raises(UsageError, match=r"^k: a device array with neither data_ptr\(\)"):
        CacheTensor.of("k", Opaque(np.zeros(1)), dims, kv=0)


def test_the_core_imports_no_engine_code() -> None:
    import subprocess
    import sys

    code = (
        "import sys, pagedkv_sql, pagedkv_sql.cli\n"
        "bad = [m for m in sys.modules if m.startswith(('pagedkv_sql.engines', 'torch', "
        "'safetensors', 'vllm', 'sglang'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


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


@pytest.mark.parametrize("name", ["flashinfer", "vllm", "sglang", "trtllm"])
def test_each_engine_refuses_int64_indices_unless_told_to_convert(name: str) -> None:
    # to_state's own default is convert=False, as load_engine's is
    module = engine(name)
    with pytest.raises(InputError, match="int64"):
        module.to_state(int64_snapshots()[name])
    state = module.to_state(int64_snapshots()[name], convert=True)
    assert state.block_table.num_rows > 0


def test_an_engine_module_missing_from_the_build_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(engines.ENGINES, "ghost", "ghost")
    with pytest.raises(UsageError, match="engine 'ghost' is not available in this build"):
        engine("ghost")


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


def test_load_engine_reports_the_engine_invariants_by_default(db: pagedkv_sql.Database) -> None:
    from pagedkv_sql.engines import load

    from .example import example

    report = load(db, example())  # chat-43's kv_last_page_len is 0
    assert [w.name for w in report.warnings] == ["diag_engine_csr_row"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.engine = "other"  # type: ignore[misc]
    with pytest.raises(InputError, match="int64"):  # and refuses int64 unless told to convert
        load(db, int64_snapshots()["vllm"])


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


# -- a cache tensor's layout is refused by the field it gets wrong, before any arithmetic ----


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (  # a misspelled dimension never leaves every block at the same K/V address
            {"dims": ["blocks", "kv", "slot", "head", "dim"]},
            r"dims\[0\] \"blocks\" is not a dimension name \(did you mean 'block'\?\)",
        ),
        ({"dims": ["block"]}, r"shape \[8, 2, 16, 8, 128\] has 5 entries for 1 dims"),
        ({"strides": [1, 1]}, r"strides \[1, 1\] has 2 entries for 5 dims"),
        ({"dims": ["block", "kv", "block", "head", "dim"]}, r"names a dimension twice"),
        ({"dims": ["kv", "slot", "head", "dim", "layer"]}, r"neither 'token' nor both"),
        ({"dims": ["block", "token", "slot", "head", "dim"]}, r"has 'token' \(a flat slot\)"),
        ({"shape": [8, 3, 16, 8, 128]}, r"a 'kv' dimension that is not 2"),
        ({"itemsize": 0}, r"itemsize 0 is outside \[1, 64\]"),
        ({"itemsize": -2}, r"itemsize -2 is outside \[1, 64\]"),
        ({"pointer": -(2**40)}, r"pointer -1099511627776 is outside \[0, 2\^63 - 1\]"),
        ({"pointer": 2**70}, r"pointer 1180591620717411303424 is outside"),
        (  # named by field, not DuckDB's "Overflow in addition of INT64"
            {"pointer": 2**63 - 2**20, "strides": [2**40, 16384, 1024, 128, 1]},
            r"pointer 9223372036853727232 \+ the tensor's [0-9,]+ bytes ends past 2\^63 - 1",
        ),
        ({"shape": [8, 2, 16, 8, 4.7]}, r"shape\[4\] 4\.7 is not an integer"),
        ({"shape": [8, 2, 0, 8, 128]}, r"shape\[2\] 0 is outside"),
        ({"strides": [32768, 16384, -1024, 128, 1]}, r"strides\[2\] -1024 is outside"),
        ({"pointer": "0x10"}, r'pointer "0x10" is not an integer'),
        ({"kv": True}, r"kv true is not an integer"),
        ({"kv": 2}, r"kv 2 is outside \[0, 1\]"),
        ({"name": 5}, r"name 5 is not a string"),
        ({"extra": 1}, r'key "extra" is unknown'),
    ],
)
def test_a_cache_tensor_layout_is_held_to_its_schema(
    tmp_path: Path, tensor: dict[str, Any], message: str
) -> None:
    path = write_npz(tmp_path / "t.npz", flashinfer_header(**tensor))
    with pytest.raises(InputError, match=rf"t\.npz: .*cache_tensors\[0\].*{message}"):
        load_engine_file(path)


def test_a_recorded_layout_of_a_live_tensor_is_held_to_the_same_schema() -> None:
    cache = np.zeros((4, 2, 16, 1, 8), np.float16)
    layout = CacheTensor.of("kv", cache, ("block", "kv", "slot", "head", "blocks"))
    snap = Snapshot("flashinfer", dict(CSR), {"page_size": 16}, [layout])
    with pytest.raises(InputError, match=r"dims\[4\] \"blocks\" is not a dimension name"):
        import_module("pagedkv_sql.engines.flashinfer").to_state(snap)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda db: db.load_engine(123), r"snapshot must be a Snapshot or a file path.*not int"),
        (lambda db: db.load_engine(None), r"snapshot must be a Snapshot or a file path.*not None"),
        (lambda db: db.load_engine(b"x.npz"), r"snapshot must be .* not bytes"),
        (lambda db: db.load_engine("x.npz", 5), r"engine must be an engine name.* not int 5"),
        (lambda db: db.export_engine(None), r"engine must be an engine name.* not None"),
        (lambda db: Snapshot("vllm", {}, None), r"Snapshot meta must be a dict.* not None"),
        (lambda db: Snapshot("vllm", {}, [1]), r"Snapshot meta must be a dict.* not list"),
        (lambda db: Snapshot(5), r"Snapshot engine must be an engine name"),
        (lambda db: Snapshot("vllm", [1]), r"Snapshot arrays must be a dict of arrays"),
        (lambda db: Snapshot("vllm", {}, {}, [1]), r"Snapshot cache_tensors\[0\] must be a Cache"),
        (lambda db: Snapshot("vllm", {}, {"x": object()}).save("x.npz"), r"meta is not JSON"),
        (lambda db: Snapshot("vllm", {}, {"x": float("nan")}).save("x.npz"), r"meta is not JSON"),
        (lambda db: Snapshot("vllm").save(5), r"Snapshot\.save path must be a file path"),
    ],
)
def test_library_calls_with_wrong_types_are_usage_errors_naming_the_argument(
    call: Any, message: str
) -> None:
    # a UsageError naming the argument, never an AttributeError / TypeError from inside
    import pagedkv_sql

    with pagedkv_sql.connect(":memory:") as db, pytest.raises(UsageError, match=message):
        call(db)


def test_a_snapshot_function_takes_request_ids_as_strings_or_numbers_only() -> None:
    from pagedkv_sql.engines import flashinfer, trtllm

    a = (CSR["kv_indptr"], CSR["kv_indices"], CSR["kv_last_page_len"])
    assert flashinfer.snapshot(*a, 16, request_ids=["a", 7]).meta["request_ids"] == ["a", "7"]
    for ids, message in [
        (5, r"request_ids must be a list of strings, not int 5"),
        ("ab", r'request_ids must be a list of strings, not str "ab"'),
        ([None], r"request_ids\[0\] must be a string \(or an integer\), not None"),
        ([{"x": 1}], r"request_ids\[0\] must be a string"),
    ]:
        with pytest.raises(UsageError, match=message):
            flashinfer.snapshot(*a, 16, request_ids=ids)
    for page_size in ("x", 16.0, None):
        with pytest.raises(UsageError, match=r"page_size must be an integer"):
            flashinfer.snapshot(*a, page_size)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"tokens_per_block must be an integer"):
        trtllm.snapshot(np.zeros((1, 1, 2, 1), I32), np.zeros(1, I32), "16", 2)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["snap.npz.gz", "snap.npz"])
def test_a_compressed_snapshot_is_refused_saying_how_to_read_it(tmp_path: Path, name: str) -> None:
    """Snapshots are read lazily, member by member, within declared sizes: never through a
    codec. A gzipped one (by its name or by its first bytes) says so and how to undo it."""
    import gzip

    from ..helpers import DATA

    (tmp_path / name).write_bytes(gzip.compress((DATA / "engines" / "flashinfer.npz").read_bytes()))
    with pytest.raises(UsageError, match=r"a gzip-compressed snapshot; nothing was loaded") as e:
        read(tmp_path / name)
    assert e.value.hint.startswith("decompress it first (gunzip FILE)")
