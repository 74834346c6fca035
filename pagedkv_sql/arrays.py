"""Arrays handed in by a user as host numpy arrays: numpy as is, anything with DLPack
(torch, cupy on the host, jax...) shared without a copy, else ``__array__``; lists
converted. An array on a GPU (a CUDA torch tensor, a cupy array) is copied to the host
once (``tensor.cpu()``, ``array.get()``: a device-to-host copy, which waits for the work
queued on that device), and the copy is used from then on: nothing here keeps a device
array or imports torch. The engine snapshots (``engines.Snapshot``) and ``load_arrow``'s
columns take arrays through here, so both take the same things.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from .errors import UsageError

DLPACK_HOST = (1, 3)  # kDLCPU, kDLCUDAHost (pinned host memory): numpy reads them in place


def on_device(value: Any) -> bool:
    """Whether ``value`` lives in a device's memory rather than the host's."""
    if getattr(value, "is_cuda", False) is True:
        return True
    device = getattr(value, "__dlpack_device__", None)
    if device is None:
        return False
    try:
        kind = int(device()[0])
    except (TypeError, ValueError, IndexError, RuntimeError, AttributeError):
        return False
    return kind not in DLPACK_HOST


def to_host(value: Any, name: str) -> Any:
    """One device-to-host copy of ``value``: ``.cpu()`` (torch), ``.get()`` (cupy), else
    ``__array__`` (jax copies there); a UsageError when it offers none."""
    for method in ("cpu", "get"):
        copy = getattr(value, method, None)
        if callable(copy):
            return copy()
    if hasattr(value, "__array__"):
        return np.asarray(value)
    raise UsageError(
        f"{name} lives on a device and offers no copy to the host (.cpu(), .get() or __array__)",
        hint=f"copy it to the host first: pass a numpy array of {name}",
    )


def host_array(value: Any, name: str = "array") -> np.ndarray:
    """``value`` as a host numpy array: shared where it is on the host already, copied once
    from a device (module docstring)."""
    if isinstance(value, np.ndarray):
        return value
    if on_device(value):
        value = to_host(value, name)
        if isinstance(value, np.ndarray):
            return value
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except (BufferError, TypeError, RuntimeError) as e:
            if not hasattr(value, "__array__"):
                raise UsageError(f"{name}: cannot read it as a host array: {e}") from None
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{name}: cannot read it as an array: {e}") from None


def columns_table(columns: Mapping[Any, Any], label: str) -> pa.Table:
    """A table from a mapping of column name -> 1-D array (anything ``host_array`` takes),
    each shared with Arrow where numpy's layout allows it."""
    arrays = {}
    for name, value in columns.items():
        if not isinstance(name, str):
            raise UsageError(f"{label}: a column name must be a string, not {name!r}")
        array = host_array(value, f"column {name}")
        if array.ndim != 1:
            raise UsageError(
                f"{label}: column {name} has shape {list(array.shape)}; a column is 1-D"
            )
        arrays[name] = array
    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        said = ", ".join(f"{name} {n:,}" for name, n in lengths.items())
        raise UsageError(f"{label}: the columns differ in length ({said})")
    try:
        return pa.table(arrays)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise UsageError(f"{label}: cannot read the columns as Arrow: {e}") from None
