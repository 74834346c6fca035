"""The snapshot container: arrays in without a copy, files out and back."""

from __future__ import annotations

import dataclasses
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql import engines
from pagedkv_sql.engines import (
    CacheTensor,
    Snapshot,
    engine,
    flashinfer,
    read,
    trtllm,
)
from pagedkv_sql.engines.snapshot import as_numpy
from pagedkv_sql.errors import InputError, UsageError

from .snapshots import csr_arrays
from .test_invariants import BLOCK
from .test_trtllm import offsets as trtllm_offsets
from .test_vllm_sglang_snapshots import sglang_snapshot, vllm_snapshot


class ArrayOnly:
    """Something with __array__ only (no DLPack)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.a


class OnGpu:
    is_cuda = True

    def __dlpack__(self, **kw: Any) -> Any:
        raise AssertionError("a GPU tensor must not be read")


def test_arrays_are_shared_not_copied() -> None:
    a = np.arange(10, dtype=np.int32)
    assert as_numpy(a) is a
    assert np.shares_memory(as_numpy(ArrayOnly(a)), a)
    assert as_numpy(memoryview(a)).tolist() == a.tolist()
    with pytest.raises(UsageError, match=r"x lives on a GPU; pass x\.cpu\(\)"):
        as_numpy(OnGpu(), "x")


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


def test_a_snapshot_with_pickled_objects_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "pickled.npz"
    np.savez(path, block_table=np.array([{"a": 1}], dtype=object))
    with pytest.raises(InputError, match=r"not a readable \.npz snapshot"):
        read(path, "vllm")


def test_safetensors_missing_is_a_usage_error_with_the_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "safetensors", None)  # an install without the extra
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    with pytest.raises(UsageError, match="need the safetensors package"):
        Snapshot("vllm", {}, {"block_size": 16}).save(tmp_path / "s.safetensors")


# -- issue 28 (findings/reliability-3.md SW2-SW6, T1, T5, U2-U4, U10, H1, H4) ---------------
I32 = np.int32
CSR = {
    "kv_indptr": np.array([0, 2, 3], I32),
    "kv_indices": np.array([1, 2, 3], I32),
    "kv_last_page_len": np.array([5, 16], I32),
}
TENSOR = {
    "name": "kv",
    "shape": [8, 2, 16, 8, 128],
    "strides": [32768, 16384, 1024, 128, 1],
    "dtype": "float16",
    "itemsize": 2,
    "dims": ["block", "kv", "slot", "head", "dim"],
    "pointer": 2**40,
}


def write_npz(path: Path, header: Any, arrays: dict[str, np.ndarray] | None = None) -> Path:
    text = header if isinstance(header, str) else json.dumps(header)
    np.savez(path, **(CSR if arrays is None else arrays), pagedkv=np.array(text))
    return path


def flashinfer_header(meta: dict[str, Any] | None = None, **tensor: Any) -> dict[str, Any]:
    header: dict[str, Any] = {"engine": "flashinfer", "meta": {"page_size": 16, **(meta or {})}}
    if tensor:
        header["cache_tensors"] = [{**TENSOR, **tensor}]
    return header


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({"page_size": 16.9}, r"metadata page_size 16\.9 is not an integer"),
        ({"page_size": True}, r"metadata page_size true is not an integer"),
        ({"page_size": "16"}, r'metadata page_size "16" is not an integer'),
        ({"page_size": 16.0}, r"metadata page_size 16\.0 is not an integer"),
        ({"request_ids": "ab"}, r'metadata request_ids "ab" is not a list'),
        ({"request_ids": 5}, r"metadata request_ids 5 is not a list"),
        ({"request_ids": [{"x": 1}, None]}, r'metadata request_ids\[0\] \{"x": 1\} is not a str'),
        ({"request_ids": ["a", 7]}, r"metadata request_ids\[1\] 7 is not a string"),
        ({"num_pages": "abc"}, r'metadata num_pages "abc" is not an integer'),
        ({"num_pages": 0}, r"metadata num_pages 0 is outside \[1, 2\^31 - 1\]"),
        ({"kv_layout": "nhd"}, r'metadata kv_layout "nhd" is not one of "NHD", "HND"'),
        ({"page_sise": 16}, r"key \"page_sise\" is unknown \(did you mean 'page_size'\?\)"),
        ({"block_size": 32}, r"metadata block_size 32, page_size 16 disagree"),
        ({"seq_ids": [0, -1]}, r"metadata seq_ids\[1\] -1 is outside"),
        ({"refused": [{"seq_id": 1, "reason": 5}]}, r"refused\[0\]\.reason 5 is not a string"),
    ],
)
def test_flashinfer_metadata_of_the_wrong_type_or_range_is_refused_naming_the_key(
    tmp_path: Path, meta: dict[str, Any], message: str
) -> None:
    # SW4, T1: coerced before (16.9 -> 16, true -> 1, "ab" -> two requests 'a', 'b')
    path = write_npz(tmp_path / "m.npz", flashinfer_header(meta))
    with pytest.raises(InputError, match=message):
        load_engine_file(path)


def load_engine_file(path: Path, engine: str | None = None) -> Any:
    import pagedkv_sql

    with pagedkv_sql.connect(":memory:") as db:
        return db.load_engine(path, engine)


@pytest.mark.parametrize(
    ("engine", "meta", "message"),
    [
        ("vllm", {"null_block": "x"}, r'metadata null_block "x" is not an integer'),
        ("vllm", {"num_blocks": "x"}, r'metadata num_blocks "x" is not an integer'),
        ("vllm", {"num_free_blocks": "abc"}, r"metadata num_free_blocks \"abc\" is not an"),
        ("vllm", {"block_hashes": [1]}, r"metadata block_hashes \[1\] is not an object"),
        ("vllm", {"block_hashes": {"1": 5}}, r"metadata block_hashes\[1\] 5 is not a string"),
        ("vllm", {"block_hashes": {"one": "ab"}}, r'block_hashes key "one" is not a block id'),
        ("vllm", {"free_queue_complete": "yes"}, r"free_queue_complete \"yes\" is not a JSON"),
        ("sglang", {"num_pages": "x"}, r'metadata num_pages "x" is not an integer'),
        ("sglang", {"free_rows": [1, 2.5]}, r"metadata free_rows\[1\] 2\.5 is not an integer"),
        ("trtllm", {"beam_width": "x"}, r'metadata beam_width "x" is not an integer'),
        ("trtllm", {"num_layers": ["two"]}, r'metadata num_layers\[0\] "two" is not an integer'),
        ("trtllm", {"layer_first": "false"}, r'layer_first "false" is not a JSON boolean'),
        ("trtllm", {"layer_first": 0}, r"layer_first 0 is not a JSON boolean"),
        ("trtllm", {"kv_factor": 0}, r"metadata kv_factor 0 is not one of 1, 2"),
        ("trtllm", {"kv_factor": True}, r"metadata kv_factor true is not one of 1, 2"),
        ("trtllm", {"num_layers": 0}, r"metadata num_layers 0 is outside \[1, 65536\]"),
        ("trtllm", {"dtype": "half"}, r'metadata dtype "half" is not one of "float16"'),
        ("trtllm", {"tokens_per_block": 8}, r"block_size 16, tokens_per_block 8 disagree"),
    ],
)
def test_every_engine_holds_its_metadata_to_the_schema(
    engine: str, meta: dict[str, Any], message: str
) -> None:
    # SW3, SW6, T1: "false" was true, kv_factor / num_layers 0 divided by zero, "x" a ValueError
    snap = Snapshot(engine, {}, {"block_size": 16, **meta})
    with pytest.raises(InputError, match=message):
        import_module(f"pagedkv_sql.engines.{engine}").to_state(snap)


def import_module(name: str) -> Any:
    import importlib

    return importlib.import_module(name)


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (  # SW2: every block had the same K/V address
            {"dims": ["blocks", "kv", "slot", "head", "dim"]},
            r"dims\[0\] \"blocks\" is not a dimension name \(did you mean 'block'\?\)",
        ),
        ({"dims": ["block"]}, r"shape \[8, 2, 16, 8, 128\] has 5 entries for 1 dims"),  # U10
        ({"strides": [1, 1]}, r"strides \[1, 1\] has 2 entries for 5 dims"),
        ({"dims": ["block", "kv", "block", "head", "dim"]}, r"names a dimension twice"),
        ({"dims": ["kv", "slot", "head", "dim", "layer"]}, r"neither 'token' nor both"),
        ({"dims": ["block", "token", "slot", "head", "dim"]}, r"has 'token' \(a flat slot\)"),
        ({"shape": [8, 3, 16, 8, 128]}, r"a 'kv' dimension that is not 2"),
        ({"itemsize": 0}, r"itemsize 0 is outside \[1, 64\]"),  # SW5
        ({"itemsize": -2}, r"itemsize -2 is outside \[1, 64\]"),
        ({"pointer": -(2**40)}, r"pointer -1099511627776 is outside \[0, 2\^63 - 1\]"),
        ({"pointer": 2**70}, r"pointer 1180591620717411303424 is outside"),  # U3
        (  # U3: "Overflow in addition of INT64" from DuckDB before
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
    ("header", "message"),
    [
        (flashinfer_header() | {"cache_tensors": [5]}, r"cache_tensors\[0\] 5 is not an object"),
        (flashinfer_header() | {"cache_tensors": "abc"}, r"'cache_tensors' is not a JSON list"),
        (flashinfer_header() | {"cache_tensors": [{"a": 1}]}, r'cache_tensors\[0\] key "a"'),
        (flashinfer_header() | {"meta": [1]}, r"'meta' is not a JSON object"),
        ({"engine": 5, "meta": {}}, r"'engine' 5 is not an engine; engines: flashinfer"),
        ({"engine": "flashinfer", "format_version": 2}, r"format_version 2 is not 1"),
        ({"engine": "flashinfer", "extra": 1}, r"unknown key\(s\) 'extra'"),
        (  # RecursionError before
            '{"engine":"flashinfer","meta":{"page_size":16,"x":' + "[" * 3000 + "]" * 3000 + "}}",
            r"nested too deeply to read|nested deeper than",
        ),
        ('{"engine":"flashinfer","meta":{"page_size":Infinity}}', r"page_size Infinity is not"),
        (  # Python's 4300-digit limit: a ValueError before
            '{"engine":"flashinfer","meta":{"page_size":' + "9" * 5000 + "}}",
            r"pagedkv metadata cannot be read",
        ),
    ],
)
def test_a_malformed_header_is_one_error_naming_the_file(
    tmp_path: Path, header: Any, message: str
) -> None:
    path = write_npz(tmp_path / "h.npz", header)
    with pytest.raises(InputError, match=rf"h\.npz: .*{message}"):
        load_engine_file(path)


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
    # T5: AttributeError / TypeError from inside before
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


def test_a_file_that_is_not_a_regular_file_is_refused_at_once(tmp_path: Path) -> None:
    # H1: a FIFO blocked forever; U4: a directory said "may be truncated"
    import os

    for suffix in (".npz", ".safetensors"):
        fifo = tmp_path / f"q{suffix}"
        os.mkfifo(fifo)
        with pytest.raises(InputError, match=r"is a FIFO \(named pipe\), not a snapshot file"):
            read(fifo)
        folder = tmp_path / f"d{suffix}"
        folder.mkdir()
        with pytest.raises(InputError, match=r"is a directory, not a snapshot file") as e:
            read(folder)
        assert "truncated" not in e.value.hint
    with pytest.raises(InputError, match=r"no snapshot file at"):
        read(tmp_path / "absent.npz")


def test_an_unreadable_npz_says_truncated_only_when_it_may_be(tmp_path: Path) -> None:
    # U4, S3: random bytes got numpy's pickle advice and "may be truncated"
    noise = tmp_path / "g.npz"
    noise.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(InputError, match=r"g\.npz: not a \.npz \(zip\) file") as e:
        read(noise)
    assert "truncated" not in e.value.hint and "pickle" not in str(e.value)
    whole = write_npz(tmp_path / "w.npz", flashinfer_header()).read_bytes()
    cut = tmp_path / "c.npz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match=r"not a readable \.npz snapshot") as e:
        read(cut)
    assert "truncated" in e.value.hint


def test_an_unused_npz_member_is_never_decompressed_and_a_used_one_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # H4: every member was decompressed (1.9 MB file, 2 GB RSS)
    from pagedkv_sql.engines import snapshot_files

    monkeypatch.setattr(snapshot_files, "MAX_ARRAY_BYTES", 1 << 20)
    big = np.zeros(1 << 20, I32)  # 4 MiB declared, a few KB compressed
    path = tmp_path / "z.npz"
    header = json.dumps(flashinfer_header())
    np.savez_compressed(path, **CSR, extra=big, pagedkv=np.array(header))
    state = import_module("pagedkv_sql.engines.flashinfer").to_state(read(path))
    assert state.requests.num_rows == 2  # "extra" was never read
    np.savez_compressed(path, **{**CSR, "kv_indices": big}, pagedkv=np.array(header))
    with pytest.raises(InputError, match=r"array 'kv_indices' declares 4,194,\d+ bytes, more"):
        import_module("pagedkv_sql.engines.flashinfer").to_state(read(path))
    monkeypatch.setattr(snapshot_files, "MAX_META_BYTES", 64)
    with pytest.raises(InputError, match=r"array 'pagedkv' declares \d+ bytes, more than the 64"):
        read(path)


def test_an_array_numpy_cannot_read_is_named_by_its_dtype(tmp_path: Path) -> None:
    # U4: bf16 / f8 tensors got "the file may be truncated"
    path = write_npz(tmp_path / "b.npz", flashinfer_header())
    with zipfile.ZipFile(path, "a") as z:
        z.writestr(
            "kv.npy",
            b"\x93NUMPY\x01\x00v\x00{'descr': 'bfloat16', 'fortran_order': False, 'shape': (2,), }"
            + b" " * 55  # the header padded to the 118 bytes it declares (v\x00)
            + b"\n"
            + b"\x00" * 4,  # the data: two bf16 zeros
        )
    with pytest.raises(InputError, match=r"array 'kv' has a dtype numpy cannot read") as e:
        read(path)
    assert "truncated" not in e.value.hint
    objects = tmp_path / "o.npz"
    np.savez(objects, block_table=np.array([{"a": 1}], dtype=object))
    with pytest.raises(InputError, match=r"array 'block_table' holds Python objects"):
        read(objects, "vllm")


def test_a_file_without_metadata_says_how_to_record_the_block_size(tmp_path: Path) -> None:
    # U2: the hint named a --block-size option that `import` does not have
    path = tmp_path / "raw.npz"
    np.savez(path, **CSR)
    with pytest.raises(InputError, match=r"name the engine") as e:
        read(path)
    assert "--block-size" not in e.value.hint and "import ENGINE PATH" in e.value.hint
    with pytest.raises(InputError, match=r"metadata has no block_size") as e:
        load_engine_file(path, "flashinfer")
    # issue 29: the hint names the option `import` has now, and the plain member
    assert "--page-size N" in e.value.hint and "page_size=np.array(N)" in e.value.hint


def test_a_plain_npz_carries_its_metadata_as_members(tmp_path: Path) -> None:
    # issue 29: np.savez with the engine's own names, page_size and request ids beside
    path = tmp_path / "plain.npz"
    np.savez(path, **CSR, page_size=np.array(16), request_ids=np.array(["a", "b"]))
    snap = engines.read(path, "flashinfer")
    assert snap.meta == {"page_size": 16, "request_ids": ["a", "b"]}
    assert sorted(snap.arrays) == sorted(CSR)  # the metadata members are no arrays
    assert load_engine_file(path, "flashinfer").rows["engine_request"] == 2
    # a member the 'pagedkv' JSON contradicts is refused, naming both
    header = json.dumps({"engine": "flashinfer", "meta": {"page_size": 32}})
    np.savez(path, **CSR, page_size=np.array(16), pagedkv=np.array(header))
    with pytest.raises(InputError, match=r"member 'page_size' \(16\) and the metadata's \(32\)"):
        engines.read(path)


# -- numpy's "load it unsafely" advice never reaches the user (issue 28, S3) ----------------


def _unreadable_npz(path: Path, kind: str) -> None:
    import os
    import pickle
    import zipfile

    if kind == "random bytes":
        path.write_bytes(os.urandom(4096))
    elif kind == "text":
        path.write_text("hello world\n")
    elif kind == "a pickle":
        path.write_bytes(pickle.dumps({"kv_indptr": [0, 1]}))
    elif kind == "an object array":
        np.savez(path, kv_indptr=np.array([{"x": 1}], dtype=object))
    elif kind == "a .npy":
        with path.open("wb") as f:
            np.save(f, np.arange(3))
    elif kind == "an object .npy":
        with path.open("wb") as f:
            np.save(f, np.array([None], dtype=object), allow_pickle=True)
    elif kind == "a pickled member":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("kv_indptr.npy", pickle.dumps([0, 1]))
    elif kind == "empty":
        path.write_bytes(b"")


@pytest.mark.parametrize(
    "kind",
    [
        "random bytes",
        "text",
        "a pickle",
        "an object array",
        "a .npy",
        "an object .npy",
        "a pickled member",
        "empty",
    ],
)
def test_an_unreadable_npz_is_refused_without_numpys_pickle_advice(
    cli: Any, tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "bad.npz"
    _unreadable_npz(path, kind)
    r = cli("import", "flashinfer", str(path), "--db", str(tmp_path / "x.duckdb"))
    assert r.exit_code == 1, r.output
    assert r.output.startswith(f"Error: {path}: ")
    assert "Traceback" not in r.output
    assert "allow_pickle" not in r.output and "unsafe" not in r.output
    assert "pickle.load" not in r.output and "If you trust" not in r.output
    assert "nothing was loaded" in r.output
    with pytest.raises(InputError) as e:
        read(path, "flashinfer")
    assert "allow_pickle" not in f"{e.value} {e.value.hint}"


# -- a metadata key named twice is refused, never "the last wins" (issue 28, SW11's class) ---
# (round three's helper "rel": `"meta": {...}, "meta": {...}` imported the second silently)
@pytest.mark.parametrize(
    "text",
    [
        '{"engine": "flashinfer", "meta": {"page_size": 16}, "meta": {"page_size": 32}}',
        '{"engine": "flashinfer", "meta": {"page_size": 16, "page_size": 32}}',
        '{"engine": "vllm", "engine": "flashinfer", "meta": {"page_size": 16}}',
        '{"engine": "flashinfer", "meta": {"page_size": 16}, "cache_tensors": [{"name": "kv",'
        ' "name": "kv2"}]}',
    ],
    ids=["meta", "page_size", "engine", "tensor-field"],
)
@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_snapshot_metadata_naming_a_key_twice_is_refused(
    tmp_path: Path, text: str, suffix: str
) -> None:
    path = tmp_path / f"m{suffix}"
    if suffix == ".npz":
        write_npz(path, text)
    else:
        from safetensors.numpy import save_file

        save_file(dict(CSR), str(path), metadata={"pagedkv": text})
    with pytest.raises(InputError, match=r"pagedkv metadata names '\w+' twice in one object"):
        load_engine_file(path)
