"""The snapshot container: arrays in without a copy, files out and back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pagedkv_sql.engines import CacheTensor, Snapshot, read
from pagedkv_sql.engines.snapshot import as_numpy
from pagedkv_sql.errors import InputError, UsageError


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
