"""One engine-neutral snapshot: an engine's own arrays, by its own names, plus metadata.

A snapshot is what a capture function returns and what ``import`` reads from a file. It
holds numpy arrays only: numpy and torch arrays (and anything with ``__dlpack__`` or
``__array__``) are taken without a copy through Python lists, and nothing here imports
torch or an engine. Files are ``.safetensors`` (read with the ``safetensors`` package,
numpy only: ``pip install 'pagedkv-sql[engines]'``) or ``.npz``; the metadata (engine,
block size, request ids, cache-tensor layouts...) travels inside the file as JSON.
"""

from __future__ import annotations

import json
import os
import stat
import zipfile
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..arguments import argument, is_int, shown
from ..errors import InputError, Problem, UsageError
from ..paths import atomic_output
from . import meta as schema

META_KEY = "pagedkv"  # safetensors __metadata__ key, and the .npz member holding the JSON
FORMAT_VERSION = 1
SUFFIXES = (".safetensors", ".npz")
HEADER_KEYS = ("format_version", "engine", "meta", "cache_tensors")
# An .npz member is decompressed only when an engine asks for it, and only when its declared
# size is within these (a real engine's largest index array, a block table or slot mapping,
# is tens of MB; its metadata a few MB of request ids and block hashes).
MAX_ARRAY_BYTES = 1 << 30
MAX_META_BYTES = 256 << 20
_ZIP_MAGIC = b"PK\x03\x04"


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
        """Record a live tensor's layout (torch or numpy) by reading attributes only."""
        shape = tuple(int(x) for x in tensor.shape)
        if hasattr(tensor, "data_ptr"):  # torch
            strides = tuple(int(x) for x in tensor.stride())
            itemsize = int(tensor.element_size())
            dtype = str(tensor.dtype).removeprefix("torch.")
            pointer = int(tensor.data_ptr())
        else:  # numpy and friends
            arr = np.asarray(tensor)
            itemsize = arr.itemsize
            strides = tuple(s // itemsize for s in arr.strides)
            dtype = str(arr.dtype)
            pointer = int(arr.__array_interface__["data"][0])
        if len(dims) != len(shape):
            raise UsageError(f"{name}: {len(dims)} dims named for a {len(shape)}-d tensor")
        return cls(name, shape, strides, dtype, itemsize, tuple(dims), pointer, kv, layer, pool)


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
                hint="a snapshot records it in its 'pagedkv' JSON member: write the file with "
                "Snapshot.save (the engine's snapshot() function), or add "
                'pagedkv=\'{"engine": "ENGINE", "meta": {"block_size": 16}}\' to np.savez',
            )
        try:
            return schema.integer(self.meta[key], key, 1, 256)
        except schema.Refused as e:
            raise InputError(
                f"{self.source}: {e}",
                hint="the spec keeps offset_in_block in [0, 255], so a block holds at most "
                "256 tokens",
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
                f"{self.source}: metadata has {len(ids)} request_ids for {count} sequence(s)"
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
            save, _ = _safetensors()
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
    """An array as numpy without copying through Python objects: numpy as is, DLPack
    (torch, cupy on the host, jax...) shared, else ``__array__``; lists are converted."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__"):
        if hasattr(value, "is_cuda") and getattr(value, "is_cuda", False):
            raise UsageError(f"{name} lives on a GPU; pass {name}.cpu() (a device-to-host copy)")
        try:
            return np.from_dlpack(value)
        except (BufferError, TypeError, RuntimeError) as e:
            if not hasattr(value, "__array__"):
                raise UsageError(f"{name}: cannot read it as a host array: {e}") from None
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as e:
        raise UsageError(f"{name}: cannot read it as an array: {e}") from None


def load(path: str | os.PathLike[str], engine: str | None = None) -> Snapshot:
    """Read a snapshot file. A truncated or foreign file is an InputError naming it."""
    argument(path, "snapshot", (str, os.PathLike), "a Snapshot or a file path (str or Path)")
    if engine is not None:
        argument(engine, "engine", str, "an engine name (a string)")
    source = str(path)
    target = Path(path)
    if target.suffix not in SUFFIXES:
        raise UsageError(
            f"{source}: a snapshot file ends in .safetensors or .npz, not '{target.suffix}'"
        )
    _regular_file(target, source)
    if target.suffix == ".safetensors":
        arrays, header = _read_safetensors(target)
    else:
        arrays, header = _read_npz(target)
    return _from_header(arrays, header, source, engine)


def _regular_file(target: Path, source: str) -> None:
    """A snapshot is read from a regular file: a FIFO would block (or be read whole), a
    directory or device is not one."""
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        raise InputError(f"no snapshot file at {source}") from None
    except OSError as e:
        raise InputError(f"{source}: cannot read it: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        what = (
            "a directory"
            if stat.S_ISDIR(mode)
            else "a FIFO (named pipe)"
            if stat.S_ISFIFO(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a device"
        )
        raise InputError(
            f"{source} is {what}, not a snapshot file; nothing was loaded",
            hint="a snapshot is read from a regular file: save it first (Snapshot.save)",
        )


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


class Members(MutableMapping[str, np.ndarray]):
    """A file's arrays by name, each read only when first used (an unused member costs
    nothing); arrays set or replaced by an engine (its aliases) are kept beside them."""

    def __init__(self, names: list[str], read: Callable[[str], np.ndarray]) -> None:
        self._names = list(names)
        self._read = read
        self._got: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._got:
            if name not in self._names:
                raise KeyError(name)
            self._got[name] = self._read(name)
        return self._got[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        if name not in self._names:
            self._names.append(name)
        self._got[name] = value

    def __delitem__(self, name: str) -> None:
        self._names.remove(name)
        self._got.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names


def _read_npz(path: Path) -> tuple[Members, Any]:
    """An .npz's metadata, and its arrays to be read when used. Each member's npy header
    (dtype, shape: a few bytes) is read now, so that a member of Python objects refuses the
    file at once; the data is decompressed only for the members an engine reads."""
    try:
        with zipfile.ZipFile(path) as z:
            declared = {
                i.filename.removesuffix(".npy"): _npz_header(path, z, i) for i in z.infolist()
            }
    except InputError:
        raise
    except (zipfile.BadZipFile, EOFError, OSError) as e:
        raise _not_npz(path, e) from None
    header = None
    if META_KEY in declared:
        value = _npz_member(path, META_KEY, declared.pop(META_KEY), MAX_META_BYTES)
        if value.ndim != 0 or value.dtype.kind != "U":
            raise InputError(f"{path}: the '{META_KEY}' member is not one JSON string")
        header = _parse_header(str(value), str(path))

    def read(name: str) -> np.ndarray:
        return _npz_member(path, name, declared[name], MAX_ARRAY_BYTES)

    return Members(list(declared), read), header


def _not_npz(path: Path, e: BaseException) -> InputError:
    """A file that is not a readable zip: maybe truncated (it starts as a zip does), else
    not an .npz at all."""
    try:
        with path.open("rb") as f:
            started = f.read(4) == _ZIP_MAGIC
    except OSError:
        started = False
    if started:
        return _unreadable(path, ".npz", e)
    return InputError(
        f"{path}: not a .npz (zip) file; nothing was loaded",
        hint="an .npz snapshot is what Snapshot.save (or np.savez) writes",
    )


def _npz_header(path: Path, z: zipfile.ZipFile, info: zipfile.ZipInfo) -> int:
    """The bytes one .npz member declares (its npy header's shape x itemsize, or the zip's
    own size if larger), reading no more than the header; Python objects are refused."""
    name = info.filename.removesuffix(".npy")
    try:
        with z.open(info) as f:
            version = np.lib.format.read_magic(f)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, _, dtype = read_header(f)
    except ValueError as e:
        if "dtype" in str(e) or "data type" in str(e) or "descr" in str(e):
            raise InputError(
                f"{path}: array '{name}' has a dtype numpy cannot read ({e}); nothing was loaded",
                hint="index arrays are int32 / int64: leave the KV data (bf16, fp8) out of "
                "the snapshot, or save it as its raw bytes",
            ) from None
        raise _unreadable(path, ".npz", e) from None
    except (zipfile.BadZipFile, EOFError, OSError, RuntimeError) as e:
        raise _unreadable(path, ".npz", e) from None
    if dtype.hasobject:
        raise InputError(
            f"{path}: not a readable .npz snapshot: array '{name}' holds Python objects "
            f"(dtype {dtype}); a snapshot holds numbers only and pickles are never loaded; "
            "nothing was loaded"
        )
    return max(int(np.prod(shape, dtype=object)) * dtype.itemsize, info.file_size)


def _npz_member(path: Path, name: str, declared: int, limit: int) -> np.ndarray:
    """One member of an .npz, its declared size checked against ``limit`` before a byte of
    its data is decompressed; an unreadable member is an InputError naming the file."""
    if declared > limit:
        raise InputError(
            f"{path}: array '{name}' declares {declared:,} bytes, more than the {limit:,} a "
            "snapshot member may hold; nothing was loaded",
            hint="a real engine's index arrays are far smaller: is this the KV data itself? "
            "a snapshot holds the page tables, not the cache",
        )
    try:
        with zipfile.ZipFile(path) as z, z.open(f"{name}.npy") as f:
            return np.lib.format.read_array(f, allow_pickle=False)
    except (zipfile.BadZipFile, EOFError, OSError, KeyError, ValueError, RuntimeError) as e:
        raise _unreadable(path, ".npz", e) from None


def _unreadable(path: Path, kind: str, e: BaseException) -> InputError:
    return InputError(
        f"{path}: not a readable {kind} snapshot ({type(e).__name__}: {e}); nothing was loaded",
        hint="the file may be truncated: write it again with Snapshot.save",
    )


def _read_safetensors(path: Path) -> tuple[Members, Any]:
    _, safe_open = _safetensors()
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            names = list(f.keys())
    except Exception as e:  # safetensors raises its own SafetensorError and friends
        raise _unreadable(path, ".safetensors", e) from None
    header = _parse_header(meta[META_KEY], str(path)) if META_KEY in meta else None
    return Members(names, lambda name: _safetensors_member(path, name)), header


def _safetensors_member(path: Path, name: str) -> np.ndarray:
    """One tensor of a .safetensors file (memory-mapped: its size is the file's)."""
    _, safe_open = _safetensors()
    try:
        with safe_open(str(path), framework="numpy") as f:
            dtype = f.get_slice(name).get_dtype()
            try:
                return np.asarray(f.get_tensor(name))
            except (AttributeError, TypeError, ValueError) as e:
                raise InputError(
                    f"{path}: tensor '{name}' has dtype {dtype}, which numpy cannot hold "
                    f"({e}); nothing was loaded",
                    hint="index arrays are int32 / int64: leave the KV data (bf16, fp8) out "
                    "of the snapshot",
                ) from None
    except InputError:
        raise
    except Exception as e:  # the file changed or was truncated since it was opened
        raise _unreadable(path, ".safetensors", e) from None


def _parse_header(text: str, source: str) -> Any:
    from ..limits import DuplicateKey, loads_strict

    try:
        return loads_strict(text)
    except DuplicateKey as e:  # the last would win: a second "meta" replacing the first
        raise InputError(
            f"{source}: pagedkv metadata names '{e}' twice in one object (JSON would keep "
            "only the last); nothing was loaded",
            hint="write the metadata with Snapshot.save (one value a key)",
        ) from None
    except json.JSONDecodeError as e:
        raise InputError(f"{source}: pagedkv metadata is not valid JSON: {e}") from None
    except RecursionError:
        raise InputError(f"{source}: pagedkv metadata is nested too deeply to read") from None
    except ValueError as e:  # an integer of more than 4300 digits
        raise InputError(f"{source}: pagedkv metadata cannot be read: {e}") from None


def _safetensors() -> tuple[Any, Any]:
    """(save, safe_open) of the safetensors package, numpy flavour."""
    try:
        from safetensors import safe_open
        from safetensors.numpy import save
    except ImportError:
        raise UsageError(
            ".safetensors snapshots need the safetensors package",
            hint="pip install 'pagedkv-sql[engines]' (or use .npz)",
        ) from None
    return save, safe_open
