"""One engine-neutral snapshot: an engine's own arrays, by its own names, plus metadata.

A snapshot is what a capture function returns and what ``import`` reads from a file. It
holds host numpy arrays only: numpy and torch arrays (and anything with ``__dlpack__`` or
``__array__``) are shared, never copied through Python lists; a CUDA tensor is copied to
the host once (``arrays.host_array``); nothing here imports torch or an engine. Files are
``.safetensors`` (read with the ``safetensors`` package, numpy only: ``pip install
'pagedkv-sql[engines]'``) or ``.npz``; the metadata (engine, block size, request ids,
cache-tensor layouts...) travels inside the file as JSON. Reading the files' members is
engines/snapshot_files.py's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import compression
from ..arguments import argument, is_int, shown
from ..arrays import host_array, on_device
from ..errors import InputError, Problem, UsageError
from ..limits import MAX_BLOCK_SIZE
from ..paths import atomic_output
from . import meta as schema
from .snapshot_files import (
    META_KEY,
    Members,
    read_npz,
    read_safetensors,
    regular_file,
    safetensors_io,
)

FORMAT_VERSION = 1
SUFFIXES = (".safetensors", ".npz")
HEADER_KEYS = ("format_version", "engine", "meta", "cache_tensors")


@dataclass(frozen=True)
class CacheTensor:
    """Where one KV-cache tensor lives and how it is laid out, as the engine recorded it.

    ``dims`` names each dimension: ``block`` (engine block / page id), ``slot`` (token in
    the block), ``token`` (a flat slot: block * block_size + slot), ``head``, ``dim``,
    ``kv`` (0 = K, 1 = V), ``kvdim`` (K and V concatenated: kv * head_dim + dim),
    ``layer``. ``strides`` are in elements, as torch and numpy-divided-by-itemsize give
    them. ``kv`` / ``layer`` are set when the tensor holds only K or V / one layer."""

    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    itemsize: int
    dims: tuple[str, ...]
    pointer: int | None = None
    kv: int | None = None
    layer: int | None = None
    pool: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "strides": list(self.strides),
            "dtype": self.dtype,
            "itemsize": self.itemsize,
            "dims": list(self.dims),
            "pointer": self.pointer,
            "kv": self.kv,
            "layer": self.layer,
            "pool": self.pool,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "cache tensor") -> CacheTensor:
        """A layout as ``to_dict`` wrote it, every field held to ``meta.TENSOR_FIELDS``
        (nothing coerced: a shape of 4.7 or a pointer of "0x10" is refused)."""
        try:
            d = schema.tensor_fields(d, where)
        except schema.Refused as e:
            raise InputError(f"cache tensor layout is malformed: {e}") from None
        return cls(
            name=d["name"],
            shape=tuple(int(x) for x in d["shape"]),
            strides=tuple(int(x) for x in d["strides"]),
            dtype=d["dtype"],
            itemsize=int(d["itemsize"]),
            dims=tuple(d["dims"]),
            pointer=None if d.get("pointer") is None else int(d["pointer"]),
            kv=None if d.get("kv") is None else int(d["kv"]),
            layer=None if d.get("layer") is None else int(d["layer"]),
            pool=int(d.get("pool") or 0),
        )

    @classmethod
    def of(
        cls,
        name: str,
        tensor: Any,
        dims: tuple[str, ...] | list[str],
        *,
        kv: int | None = None,
        layer: int | None = None,
        pool: int = 0,
    ) -> CacheTensor:
        """Record a live tensor's layout by reading attributes only, wherever it lives:
        torch (``shape``, ``stride()``, ``element_size()``, ``data_ptr()``: a CUDA tensor's
        pointer is its device address), ``__cuda_array_interface__`` (cupy, numba) or numpy
        and friends. Nothing is copied: a device array with no pointer to read is refused."""
        shape = tuple(int(x) for x in tensor.shape)
        if hasattr(tensor, "data_ptr"):  # torch, on any device
            strides = tuple(int(x) for x in tensor.stride())
            itemsize = int(tensor.element_size())
            dtype = str(tensor.dtype).removeprefix("torch.")
            pointer = int(tensor.data_ptr())
        else:
            iface = getattr(tensor, "__cuda_array_interface__", None)
            if iface is None and on_device(tensor):
                raise UsageError(
                    f"{name}: a device array with neither data_ptr() nor "
                    "__cuda_array_interface__: its address cannot be read",
                    hint="record the torch tensor (or cupy array) that holds the cache",
                )
            if iface is None:  # numpy and friends, on the host
                iface = np.asarray(tensor).__array_interface__
            pointer, strides, dtype, itemsize = _interface_layout(iface, shape)
        if len(dims) != len(shape):
            raise UsageError(f"{name}: {len(dims)} dims named for a {len(shape)}-d tensor")
        return cls(name, shape, strides, dtype, itemsize, tuple(dims), pointer, kv, layer, pool)


def _interface_layout(
    iface: Mapping[str, Any], shape: tuple[int, ...]
) -> tuple[int, tuple[int, ...], str, int]:
    """(pointer, strides in elements, dtype, itemsize) from an array interface (numpy's or
    CUDA's: the same fields; strides None means C-contiguous)."""
    kind = np.dtype(iface["typestr"])
    itemsize = kind.itemsize
    byte_strides = iface.get("strides")
    if byte_strides is None:
        byte_strides = tuple(
            int(np.prod(shape[i + 1 :], dtype=np.int64)) * itemsize for i in range(len(shape))
        )
    strides = tuple(int(b) // itemsize for b in byte_strides)
    return int(iface["data"][0]), strides, str(kind), itemsize


@dataclass
class Snapshot:
    """An engine's state: ``arrays`` by the engine's own names, ``meta`` (JSON-able):
    ``block_size`` (tokens a block / page), ``request_ids`` (strings, one per sequence
    row), ``cache_tensors`` (``CacheTensor`` layouts) and engine-specific entries."""

    engine: str
    arrays: MutableMapping[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    cache_tensors: list[CacheTensor] = field(default_factory=list)
    source: str = "<snapshot>"

    def __post_init__(self) -> None:
        argument(self.engine, "Snapshot engine", str, "an engine name (a string)")
        argument(self.arrays, "Snapshot arrays", Mapping, "a dict of arrays by name")
        argument(self.meta, "Snapshot meta", dict, "a dict (the JSON metadata)")
        argument(self.cache_tensors, "Snapshot cache_tensors", list, "a list of CacheTensor")
        for i, t in enumerate(self.cache_tensors):
            argument(t, f"Snapshot cache_tensors[{i}]", CacheTensor, "a CacheTensor")
        argument(self.source, "Snapshot source", str, "a string")
        if not isinstance(self.arrays, Members):  # a file's members stay unread until used
            self.arrays = {
                argument(name, "a Snapshot array name", str, "a string"): as_numpy(value, name)
                for name, value in self.arrays.items()
            }

    def check_meta(self) -> None:
        """The metadata and cache-tensor layouts held to the engine's schema (engines/meta.py):
        an InputError naming the first field that breaks it. Every ``to_state`` starts here."""
        schema.check(self.engine, self.meta, self.source)
        schema.check_tensors(self.cache_tensors, self.source)

    # -- construction --------------------------------------------------------------------
    def put(self, name: str, value: Any) -> None:
        self.arrays[name] = as_numpy(value, name)

    @property
    def block_size(self) -> int:
        key = next((k for k in schema.BLOCK_SIZE_KEYS if k in self.meta), None)
        if key is None:
            raise InputError(
                f"{self.source}: metadata has no block_size (tokens a block)",
                hint="give it: `pagedkv-sql import ENGINE PATH --page-size N`, or save it in "
                "the file (np.savez(..., page_size=np.array(N)), or Snapshot.save)",
            )
        try:
            return schema.integer(self.meta[key], key, 1, MAX_BLOCK_SIZE)
        except schema.Refused as e:
            raise InputError(
                f"{self.source}: {e}",
                hint=f"the spec keeps offset_in_block in [0, {MAX_BLOCK_SIZE - 1}], so a block "
                f"holds at most {MAX_BLOCK_SIZE} tokens",
            ) from None

    @property
    def request_ids(self) -> list[str] | None:
        ids = self.meta.get("request_ids")
        if ids is None:
            return None
        try:
            return list(schema.value(schema.Strings(), ids, "request_ids"))
        except schema.Refused as e:
            raise InputError(f"{self.source}: metadata {e}") from None

    def request_names(self, count: int) -> list[str]:
        """The metadata's request ids, which must be ``count``, or the row numbers."""
        ids = self.request_ids
        if ids is None:
            return [str(i) for i in range(count)]
        if len(ids) != count:
            raise InputError(
                f"{self.source}: {len(ids)} request ids for {count} sequence(s)",
                hint="one request id a sequence, in the snapshot's order (the metadata's "
                "request_ids, or the lines of --request-ids)",
            )
        return ids

    def array(self, name: str, *, ndim: int | None = None) -> np.ndarray:
        """A required array, or an error naming it."""
        if name not in self.arrays:
            have = ", ".join(sorted(self.arrays)) or "none"
            raise InputError(
                f"{self.source}: array '{name}' is missing (a {self.engine} snapshot needs it; "
                f"arrays present: {have})"
            )
        arr = self.arrays[name]
        if ndim is not None and arr.ndim != ndim:
            raise InputError(
                f"{self.source}: array '{name}' has shape {list(arr.shape)}; expected "
                f"{ndim} dimension(s)"
            )
        return arr

    def integers(
        self,
        name: str,
        *,
        ndim: int,
        dtypes: tuple[str, ...] = ("int32", "int64"),
        convert: tuple[str, ...] = (),
        why: str = "",
        hint: str = "",
    ) -> np.ndarray:
        """A required integer array of ``ndim`` dimensions and one of ``dtypes``, as
        int64. A dtype in ``convert`` is accepted too (the caller was asked to convert);
        any other dtype is an error naming the array."""
        arr = self.array(name, ndim=ndim)
        kind = str(arr.dtype)
        if kind not in dtypes and kind not in convert:
            raise InputError(
                f"{self.source}: array '{name}' has dtype {kind}; a {self.engine} snapshot "
                f"has {' or '.join(dtypes)} here{why}",
                hint=hint,
            )
        return arr.astype(np.int64, copy=False)

    def counted(
        self, name: str, count: int, of: str, dtypes: tuple[str, ...] = ("int32", "int64")
    ) -> np.ndarray:
        """A required 1-D integer array (see ``integers``) with one entry for each of
        ``count`` things, ``of`` naming them (``"block_table row(s)"``); another length is
        an error naming the array."""
        arr = self.integers(name, ndim=1, dtypes=dtypes)
        if arr.size != count:
            raise InputError(
                f"{self.source}: array '{name}' has {arr.size} entries for {count} {of}"
            )
        return arr

    def refuse(self, name: str, bad: np.ndarray, describe: Any, hint: str = "") -> None:
        """Raise an InputError naming each offending index of array ``name`` (where
        ``bad`` is true; ``describe(i)`` says what is wrong at index ``i``), if any."""
        where = np.flatnonzero(bad)
        if where.size == 0:
            return
        problems = [
            Problem(self.source, None, None, f"{name}{describe(int(i))}") for i in where[:100]
        ]
        raise InputError(
            f"{where.size} bad value(s) in array '{name}' of {self.source}; nothing was loaded",
            problems,
            int(where.size),
            hint=hint,
        )

    # -- files ---------------------------------------------------------------------------
    def header(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "engine": self.engine,
            "meta": self.meta,
            "cache_tensors": [t.to_dict() for t in self.cache_tensors],
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the snapshot as ``.safetensors`` or ``.npz`` (by the suffix)."""
        target = Path(argument(path, "Snapshot.save path", (str, os.PathLike), "a file path"))
        try:
            header = json.dumps(self.header(), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise UsageError(
                f"cannot write {target}: the snapshot's meta is not JSON ({e})",
                hint="meta holds JSON values only: numbers, strings, lists, dicts, booleans",
            ) from None
        arrays = {k: np.ascontiguousarray(v) for k, v in self.arrays.items()}
        if target.suffix == ".safetensors":
            save, _ = safetensors_io()
            data = save(arrays, metadata={META_KEY: header})
            with atomic_output(target) as f:  # complete or absent, as every output
                f.write(data)
        elif target.suffix == ".npz":
            if META_KEY in arrays:
                raise UsageError(f"an array may not be called '{META_KEY}' in an .npz snapshot")
            savez: Any = np.savez  # numpy's stub types **arrays as its keyword flags
            with atomic_output(target) as f:
                savez(f, **arrays, **{META_KEY: np.array(header)})
        else:
            raise UsageError(f"cannot write {target}: a snapshot file ends in .safetensors or .npz")
        return target


def as_numpy(value: Any, name: str = "array") -> np.ndarray:
    """An array as host numpy without copying through Python objects: numpy as is, DLPack
    (torch, cupy on the host, jax...) shared, else ``__array__``; lists are converted; an
    array on a GPU copied to the host once (``arrays.host_array``)."""
    return host_array(value, name)


def load(path: str | os.PathLike[str], engine: str | None = None) -> Snapshot:
    """Read a snapshot file. A truncated or foreign file is an InputError naming it."""
    argument(path, "snapshot", (str, os.PathLike), "a Snapshot or a file path (str or Path)")
    if engine is not None:
        argument(engine, "engine", str, "an engine name (a string)")
    source = str(path)
    target = Path(path)
    packed = compression.strip(target)[1] or compression.compressed_file(target)
    if packed is not None:  # read lazily, member by member: never through a codec
        raise UsageError(
            f"{source}: a {packed}-compressed snapshot; nothing was loaded",
            hint=f"decompress it first ({'gunzip' if packed == 'gzip' else 'unzstd'} FILE); "
            "an .npz compresses its own members (np.savez_compressed)",
        )
    if target.suffix not in SUFFIXES:
        raise UsageError(
            f"{source}: a snapshot file ends in .safetensors or .npz, not '{target.suffix}'"
        )
    regular_file(target, source)
    if target.suffix == ".safetensors":
        arrays, header = read_safetensors(target)
    else:
        arrays, header = read_npz(target)
    return _from_header(arrays, header, source, engine)


def _from_header(
    arrays: MutableMapping[str, np.ndarray], header: Any, source: str, engine: str | None
) -> Snapshot:
    if header is None:
        if engine is None:
            raise InputError(
                f"{source}: no pagedkv metadata in the file; name the engine",
                hint="pass the engine: `pagedkv-sql import ENGINE PATH` (and record the block "
                "size in the file: write it with Snapshot.save)",
            )
        header = {"engine": engine, "meta": {}}
    if not isinstance(header, dict):
        raise InputError(f"{source}: pagedkv metadata is not a JSON object")
    unknown = sorted(set(header) - set(HEADER_KEYS))
    if unknown:
        raise InputError(
            f"{source}: pagedkv metadata has unknown key(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(HEADER_KEYS)}"
        )
    version = header.get("format_version", FORMAT_VERSION)
    if not (is_int(version) and version == FORMAT_VERSION):
        raise InputError(
            f"{source}: pagedkv metadata format_version {shown(version)} is not "
            f"{FORMAT_VERSION} (the one this version reads)"
        )
    recorded = header.get("engine")
    if recorded is not None and recorded not in schema.SCHEMAS:
        raise InputError(
            f"{source}: pagedkv metadata 'engine' {shown(recorded)} is not an engine; "
            f"engines: {', '.join(schema.SCHEMAS)}"
        )
    if engine is not None and recorded is not None and recorded != engine:
        raise InputError(
            f"{source} is a {recorded} snapshot, not {engine}",
            hint=f"import it with `pagedkv-sql import {recorded} {source}`",
        )
    meta = header.get("meta")
    meta = {} if meta is None else meta
    if not isinstance(meta, dict):
        raise InputError(f"{source}: pagedkv metadata 'meta' is not a JSON object")
    layouts = header.get("cache_tensors")
    layouts = [] if layouts is None else layouts
    if not isinstance(layouts, list):
        raise InputError(f"{source}: pagedkv metadata 'cache_tensors' is not a JSON list")
    try:
        tensors = [CacheTensor.from_dict(t, f"cache_tensors[{i}]") for i, t in enumerate(layouts)]
    except InputError as e:
        raise InputError(f"{source}: {e}") from None
    return Snapshot(str(recorded or engine), arrays, meta, tensors, source)
