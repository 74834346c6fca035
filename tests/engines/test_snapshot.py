"""The snapshot container: arrays in without a copy, files out and back."""

from __future__ import annotations

import dataclasses
import json
import sys
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


# =================================================================================================
# Moved from the mutation runs' files (issue 24, tests by subject): each test pins a
# boundary or a branch a mutant of `make mutate` moved (docs/mutation.md); its comment
# names the run and the file it was first written in.
# =================================================================================================


# -- the engine modules' import checks -----------------------------------------------------
# (from tests/engines/test_mutation_kills_engines.py)


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


# killed a mutant of the engine modules (mutation run, 2026-11-30)
@pytest.mark.parametrize("name", ["flashinfer", "vllm", "sglang", "trtllm"])
def test_each_engine_refuses_int64_indices_unless_told_to_convert(name: str) -> None:
    # to_state's own default is convert=False, as load_engine's is
    module = engine(name)
    with pytest.raises(InputError, match="int64"):
        module.to_state(int64_snapshots()[name])
    state = module.to_state(int64_snapshots()[name], convert=True)
    assert state.block_table.num_rows > 0


# killed a mutant of the engine modules (mutation run, 2026-11-30)
def test_an_engine_module_missing_from_the_build_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(engines.ENGINES, "ghost", "ghost")
    with pytest.raises(UsageError, match="engine 'ghost' is not available in this build"):
        engine("ghost")


# -- snapshot files and layouts ------------------------------------------------------------
# (from tests/engines/test_mutation_kills_engines.py)


# killed a mutant of the engine modules (mutation run, 2026-11-30)
def test_a_snapshot_file_records_format_version_1(tmp_path: Path) -> None:
    path = Snapshot("vllm", {}, {"block_size": 16}).save(tmp_path / "s.npz")
    with np.load(path) as npz:
        assert json.loads(str(npz["pagedkv"]))["format_version"] == 1


# killed a mutant of the engine modules (mutation run, 2026-11-30)
def test_metadata_that_is_not_json_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, pagedkv=np.array("{not json"))
    with pytest.raises(InputError, match="pagedkv metadata is not valid JSON"):
        read(path)


# killed a mutant of the engine modules (mutation run, 2026-11-30)
def test_a_block_size_that_is_not_a_number_is_named() -> None:
    for value in ("sixteen", [16]):
        with pytest.raises(InputError, match="is not an integer"):
            _ = Snapshot("vllm", {}, {"block_size": value}).block_size


# killed a mutant of the engine modules (mutation run, 2026-11-30)
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


# killed a mutant of the engine modules (mutation run, 2026-11-30)
def test_a_failed_dlpack_export_falls_back_to_array_and_else_is_named() -> None:
    a = np.arange(4)
    assert as_numpy(DLPackRefused(a)) is a
    with pytest.raises(UsageError, match="x: cannot read it as a host array: cannot export"):
        as_numpy(DLPackOnly(), "x")


# killed a mutant of the engine modules (mutation run, 2026-11-30)
@pytest.mark.parametrize("error", [BufferError, TypeError, RuntimeError])
def test_each_dlpack_failure_falls_back_to_array(error: type[Exception]) -> None:
    class Refusing(DLPackRefused):
        def __dlpack__(self, **kw: Any) -> Any:
            raise error("cannot export")

    a = np.arange(3)
    assert as_numpy(Refusing(a)) is a


# killed a mutant of the engine modules (mutation run, 2026-11-30)
def test_what_is_no_array_is_named() -> None:
    class Broken:
        def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
            raise TypeError("no")

    for value in ([[1, 2], [3]], Broken()):
        with pytest.raises(UsageError, match="x: cannot read it as an array"):
            as_numpy(value, "x")


# killed a mutant of the engine modules (mutation run, 2026-11-30)
def test_load_engine_reports_the_engine_invariants_by_default(db: pagedkv_sql.Database) -> None:
    from pagedkv_sql.engines import load_engine

    from .example import example

    report = load_engine(db.con, example())  # chat-43's kv_last_page_len is 0
    assert [w.name for w in report.warnings] == ["diag_engine_csr_row"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.engine = "other"  # type: ignore[misc]
    with pytest.raises(InputError, match="int64"):  # and refuses int64 unless told to convert
        load_engine(db.con, int64_snapshots()["vllm"])


# killed a mutant of the engine modules (mutation run, 2026-11-30)
def test_refusals_name_at_most_100_values_and_count_them_all() -> None:
    snap = Snapshot("vllm", {}, {"block_size": 16})
    with pytest.raises(InputError) as e:
        snap.refuse("x", np.ones(150, dtype=bool), lambda i: f"[{i}] is bad")
    assert len(e.value.problems) == 100 and e.value.total == 150


# killed a mutant of the engine modules (mutation run, 2026-11-30)
def test_a_missing_array_names_the_arrays_present() -> None:
    with pytest.raises(InputError, match=r"arrays present: none\)"):
        Snapshot("vllm", {}, {}).array("block_table")
    with pytest.raises(InputError, match=r"arrays present: a, b\)"):
        Snapshot("vllm", {"b": np.zeros(1), "a": np.zeros(1)}, {}).array("block_table")


# killed a mutant of the engine modules (mutation run, 2026-11-30)
def test_a_snapshot_with_pickled_objects_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "pickled.npz"
    np.savez(path, block_table=np.array([{"a": 1}], dtype=object))
    with pytest.raises(InputError, match=r"not a readable \.npz snapshot"):
        read(path, "vllm")


# killed a mutant of the engine modules (mutation run, 2026-11-30)
def test_safetensors_missing_is_a_usage_error_with_the_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "safetensors", None)  # an install without the extra
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    with pytest.raises(UsageError, match="need the safetensors package"):
        Snapshot("vllm", {}, {"block_size": 16}).save(tmp_path / "s.safetensors")


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
