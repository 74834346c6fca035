"""Reading snapshot files: the members of an ``.npz`` or ``.safetensors`` file, each read
only when an engine first asks for it and only within a declared size, and a foreign,
truncated or non-regular file refused as an ``InputError`` naming it (engines/snapshot.py's
``load`` and ``Snapshot.save`` are the API)."""

from __future__ import annotations

import json
import stat
import zipfile
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError, UsageError

META_KEY = "pagedkv"  # safetensors __metadata__ key, and the .npz member holding the JSON
# An .npz member is decompressed only when an engine asks for it, and only when its declared
# size is within these (a real engine's largest index array, a block table or slot mapping,
# is tens of MB; its metadata a few MB of request ids and block hashes).
MAX_ARRAY_BYTES = 1 << 30
MAX_META_BYTES = 256 << 20
_ZIP_MAGIC = b"PK\x03\x04"


def regular_file(target: Path, source: str) -> None:
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


def read_npz(path: Path) -> tuple[Members, Any]:
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


def read_safetensors(path: Path) -> tuple[Members, Any]:
    _, safe_open = safetensors_io()
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
    _, safe_open = safetensors_io()
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


def safetensors_io() -> tuple[Any, Any]:
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
