"""arrays.py: what a user hands in as arrays becomes host numpy, shared where it is on the
host, copied once from a device; ``load_arrow`` takes a dict of such columns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pagedkv_sql
from pagedkv_sql.arrays import columns_table, host_array, on_device
from pagedkv_sql.errors import UsageError


class Device:
    """An array in a device's memory, as DLPack describes it (device type 2: CUDA)."""

    def __init__(self, host: np.ndarray, kind: int = 2) -> None:
        self.host, self.kind, self.copies = host, kind, 0

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.kind, 0)

    def __dlpack__(self, **kw: Any) -> Any:
        if self.kind not in (1, 3):
            raise AssertionError("device memory must not be read in place")
        return self.host.__dlpack__(**kw)


class Cupy(Device):
    def get(self) -> np.ndarray:  # cupy's device-to-host copy
        self.copies += 1
        return self.host


class Jax(Device):
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:  # jax copies here
        self.copies += 1
        return self.host


def test_where_an_array_lives_is_read_from_is_cuda_or_its_dlpack_device() -> None:
    a = np.arange(3)
    assert not on_device(a)
    assert on_device(Device(a)) and on_device(Device(a, kind=10))  # CUDA, ROCm
    assert not on_device(Device(a, kind=1)) and not on_device(Device(a, kind=3))  # host, pinned

    class Broken:
        def __dlpack_device__(self) -> Any:
            raise RuntimeError("no device")

    assert not on_device(Broken())


@pytest.mark.parametrize("kind", [Cupy, Jax])
def test_a_device_array_is_copied_once_by_its_own_means(kind: type[Device]) -> None:
    a = np.arange(4, dtype=np.int32)
    d = kind(a)
    assert host_array(d, "x") is a and d.copies == 1


def test_a_host_array_with_dlpack_is_shared() -> None:
    a = np.arange(4, dtype=np.int64)
    got = host_array(Device(a, kind=1))
    assert np.shares_memory(got, a)


def test_a_device_array_with_no_way_to_the_host_is_refused_by_name() -> None:
    with pytest.raises(UsageError, match=r"^kv_indices lives on a device and offers no copy") as e:
        host_array(Device(np.arange(2)), "kv_indices")
    assert "pass a numpy array of kv_indices" in e.value.hint


def test_columns_are_one_dimensional_named_and_of_one_length() -> None:
    t = columns_table({"a": [1, 2], "b": np.array([3, 4], np.int32)}, "x")
    assert t.column_names == ["a", "b"] and t.num_rows == 2
    with pytest.raises(UsageError, match=r"^x: a column name must be a string, not 1"):
        columns_table({1: [1]}, "x")
    with pytest.raises(UsageError, match=r"^x: column a has shape \[1, 2\]; a column is 1-D"):
        columns_table({"a": [[1, 2]]}, "x")
    with pytest.raises(UsageError, match=r"^x: the columns differ in length \(a 2, b 1\)"):
        columns_table({"a": [1, 2], "b": [1]}, "x")
    with pytest.raises(UsageError, match=r"^x: cannot read the columns as Arrow"):
        columns_table({"a": np.array([1, "a"], dtype=object)}, "x")


def test_load_arrow_takes_a_dict_of_device_and_host_columns(db: pagedkv_sql.Database) -> None:
    seq = Cupy(np.array([1, 2], np.int64))
    db.load_arrow("root_table", {"seq_id": seq, "block_table_ptr": np.array([10, 20], np.int32)})
    assert seq.copies == 1
    assert db.sql("SELECT * FROM root_table ORDER BY 1").fetchall() == [(1, 10), (2, 20)]
    # a column of floats is refused as an Arrow table's is, and nothing is loaded
    with pytest.raises(pagedkv_sql.InputError, match=r"column block_table_ptr has type double"):
        db.load_arrow("root_table", {"seq_id": [3], "block_table_ptr": [1.5]})
    assert db.sql("SELECT count(*) FROM root_table").fetchall() == [(2,)]
