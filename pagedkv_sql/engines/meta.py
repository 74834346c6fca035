"""What an engine snapshot's metadata may say: one declarative schema for every engine.

Each engine's metadata keys (``SCHEMAS``) and each cache-tensor layout field
(``TENSOR_FIELDS``) name a kind: an integer within a range, a JSON boolean, one of a few
values, a list of strings... ``check`` holds a snapshot to its engine's schema before any
array is read: a key of the wrong type (``16.9``, ``true``, ``"16"`` for an integer;
``"false"`` for a boolean), out of range, or unknown (a typo) is an ``InputError`` naming
the key, its path and the value. Nothing is coerced. Cache tensors are held to their
dimension names, shape, strides and the 64-bit address space (``check_tensor``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral
from typing import Any

from ..arguments import argument, is_int, shown
from ..errors import InputError, UsageError
from ..kv_groups import KINDS, WINDOW_KEYS
from ..limits import INT32_MAX, MAX_BLOCK_SIZE
from ..numbers import INT64_MAX

MAX_DEPTH = 16  # nesting of a free-form metadata value (lists in lists...)
DIMS = ("block", "slot", "token", "head", "dim", "kv", "kvdim", "layer")


# -- kinds ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Int:
    """An integer (a JSON number without a fraction; never a boolean or a string) in
    [low, high]; with ``per_pool`` also a list of such, one per pool."""

    low: int = 0
    high: int = INT64_MAX
    per_pool: bool = False


@dataclass(frozen=True)
class Bool:
    """A JSON boolean: ``true`` or ``false``, never ``"false"`` or 0."""


@dataclass(frozen=True)
class Choice:
    """One of ``values`` (strings or integers, compared with their type)."""

    values: tuple[str | int, ...]


@dataclass(frozen=True)
class Str:
    """A string."""


@dataclass(frozen=True)
class Strings:
    """A list of strings."""


@dataclass(frozen=True)
class Ints:
    """A list of integers in [low, high]."""

    low: int = 0
    high: int = INT64_MAX


@dataclass(frozen=True)
class HashMap:
    """An object mapping a block id (a decimal string) to its hash (a string)."""


@dataclass(frozen=True)
class Records:
    """A list of objects with exactly ``fields``, each a kind (``None`` allowed where
    ``optional``)."""

    fields: tuple[tuple[str, Any], ...]
    optional: tuple[str, ...] = ()


@dataclass(frozen=True)
class Free:
    """Any JSON value nested at most ``MAX_DEPTH`` deep: a key another module owns and
    checks itself."""


Kind = Int | Bool | Choice | Str | Strings | Ints | HashMap | Records | Free

BLOCK_SIZE = Int(1, MAX_BLOCK_SIZE)  # the spec keeps offset_in_block in [0, 255]
BLOCK_COUNT = Int(1, INT32_MAX)
COUNT = Int(0, INT32_MAX)
# block_size and its engine spellings: when more than one is given they must agree
BLOCK_SIZE_KEYS = ("block_size", "page_size", "tokens_per_block")
COMMON: dict[str, Kind] = {
    "block_size": BLOCK_SIZE,
    "page_size": BLOCK_SIZE,
    "request_ids": Strings(),
    # what `export` writes beside the arrays (engines/export.py)
    "seq_ids": Ints(),
    "refused": Records(
        (("seq_id", Int()), ("request_id", Str()), ("reason", Str())), ("request_id",)
    ),
}
# a snapshot's KV-cache groups (engines/groups.py): the kinds and window keys of kv_groups.py
KV_CACHE_GROUPS = Records(
    (
        ("kind", Choice(KINDS)),
        ("block_size", BLOCK_COUNT),
        *((key, BLOCK_COUNT) for key in WINDOW_KEYS.values()),
        ("layer_names", Strings()),
    ),
    (*WINDOW_KEYS.values(), "layer_names"),
)
TRTLLM_DTYPES = ("float16", "bfloat16", "float32", "fp8", "float8_e4m3fn", "int8")
SCHEMAS: dict[str, dict[str, Kind]] = {
    "flashinfer": {"kv_layout": Choice(("NHD", "HND")), "num_pages": BLOCK_COUNT},
    "vllm": {
        "num_blocks": BLOCK_COUNT,
        "null_block": COUNT,
        "num_free_blocks": COUNT,
        "free_queue_complete": Bool(),
        "num_kv_cache_groups": Int(1, 1024),
        "block_hashes": HashMap(),
        "request_block_hashes": Free(),  # the fast check's (engines/fastcheck.py)
        "kv_cache_groups": KV_CACHE_GROUPS,
        "kv_cache_coordinator": Str(),
    },
    "sglang": {
        "num_pages": BLOCK_COUNT,
        "free_rows": Ints(0, INT32_MAX),
        "swa_num_pages": BLOCK_COUNT,  # engines/sglang_swa.py
        "mamba_num_slots": BLOCK_COUNT,  # engines/sglang_mamba.py
        "kv_cache_groups": KV_CACHE_GROUPS,
    },
    "trtllm": {
        "tokens_per_block": BLOCK_SIZE,
        "num_layers": Int(1, 1 << 16, per_pool=True),
        "beam_width": Int(1, 1 << 16),
        "kv_factor": Choice((1, 2)),
        "layer_first": Bool(),
        "index_encoding": Choice(("pool_type_2bit", "secondary_bit31")),
        "num_kv_heads": Int(1, 1 << 16, per_pool=True),
        "size_per_head": Int(1, 1 << 16, per_pool=True),
        "dtype": Choice(TRTLLM_DTYPES),
        "num_blocks": Int(0, INT32_MAX, per_pool=True),
        "num_secondary_blocks": Int(0, INT32_MAX, per_pool=True),
        "num_free_blocks": Int(0, INT32_MAX, per_pool=True),
    },
}
TENSOR_FIELDS: dict[str, Kind] = {
    "name": Str(),
    "shape": Ints(1, INT64_MAX),
    "strides": Ints(0, INT64_MAX),
    "dtype": Str(),
    "itemsize": Int(1, 64),
    "dims": Strings(),
    "pointer": Int(0, INT64_MAX),
    "kv": Int(0, 1),
    "layer": Int(0, INT32_MAX),
    "pool": Int(0, INT32_MAX),
}
TENSOR_REQUIRED = ("name", "shape", "strides", "dtype", "itemsize", "dims")


class Refused(Exception):
    """A value that breaks its kind: ``path`` (``num_layers[1]``) and why."""

    def __init__(self, path: str, value: Any, why: str) -> None:
        super().__init__(f"{path} {shown(value)} {why}")
        self.path = path


def integer(value: Any, path: str, low: int = 0, high: int = INT64_MAX) -> int:
    if not is_int(value):
        raise Refused(path, value, "is not an integer")
    n = int(value)
    if not low <= n <= high:
        raise Refused(path, n, f"is outside [{low}, {_bound(high)}]")
    return n


def _bound(n: int) -> str:
    return {INT64_MAX: "2^63 - 1", INT32_MAX: "2^31 - 1"}.get(n, str(n))


def value(kind: Kind, v: Any, path: str, depth: int = 0) -> Any:
    """``v`` held to ``kind`` (raises Refused naming ``path``); returned unchanged."""
    if isinstance(kind, Int):
        if kind.per_pool and isinstance(v, list):
            return [integer(x, f"{path}[{i}]", kind.low, kind.high) for i, x in enumerate(v)]
        return integer(v, path, kind.low, kind.high)
    if isinstance(kind, Bool):
        if not isinstance(v, bool):
            raise Refused(path, v, "is not a JSON boolean (true or false)")
        return v
    if isinstance(kind, Choice):
        if not any(type(v) is type(c) and v == c for c in kind.values):
            raise Refused(path, v, f"is not one of {', '.join(map(shown, kind.values))}")
        return v
    if isinstance(kind, Str):
        if not isinstance(v, str):
            raise Refused(path, v, "is not a string")
        return v
    if isinstance(kind, Strings):
        items = _list(v, path)
        for i, x in enumerate(items):
            if not isinstance(x, str):
                raise Refused(f"{path}[{i}]", x, "is not a string")
        return v
    if isinstance(kind, Ints):
        items = _list(v, path)
        return [integer(x, f"{path}[{i}]", kind.low, kind.high) for i, x in enumerate(items)]
    if isinstance(kind, HashMap):
        if not isinstance(v, dict):
            raise Refused(path, v, "is not an object of block id -> hash")
        for k, h in v.items():
            if not (isinstance(k, str) and k.isdecimal() and k.isascii()):
                raise Refused(f"{path} key", k, "is not a block id (a decimal string)")
            if not isinstance(h, str):
                raise Refused(f"{path}[{k}]", h, "is not a string")
        return v
    if isinstance(kind, Records):
        names = {name for name, _ in kind.fields}
        for i, record in enumerate(_list(v, path)):
            where = f"{path}[{i}]"
            if not isinstance(record, dict):
                raise Refused(where, record, "is not an object")
            _known(record, names, where)
            for name, sub in kind.fields:
                field = record.get(name)
                if field is None and name in kind.optional:
                    continue
                value(sub, field, f"{where}.{name}")
        return v
    if depth > MAX_DEPTH:
        raise Refused(path, "...", f"is nested deeper than {MAX_DEPTH} levels")
    if isinstance(v, list):
        for i, x in enumerate(v):
            value(kind, x, f"{path}[{i}]", depth + 1)
    elif isinstance(v, dict):
        for k, x in v.items():
            value(kind, x, f"{path}.{k}", depth + 1)
    return v


def _list(v: Any, path: str) -> list[Any]:
    if not isinstance(v, list | tuple):
        raise Refused(path, v, "is not a list")
    return list(v)


def _known(obj: Mapping[str, Any], known: set[str] | dict[str, Any], path: str) -> None:
    for key in obj:
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise Refused(
                f"{path} key" if path else "key",
                key,
                f"is unknown{hint}; known: {', '.join(sorted(known))}",
            )


# -- snapshots -----------------------------------------------------------------------------
def check(engine: str, meta: Any, source: str) -> None:
    """Hold an engine's metadata to its schema: an InputError naming the first key (and
    index) that breaks it."""
    if not isinstance(meta, dict):
        raise InputError(f"{source}: metadata is not an object but {shown(meta)}")
    schema = {**COMMON, **SCHEMAS.get(engine, {})}
    try:
        _known(meta, schema, "")
        for key, kind in schema.items():
            if key in meta:
                value(kind, meta[key], key)
    except Refused as e:
        raise InputError(f"{source}: metadata {e}", hint=_hint(e.path)) from None
    sizes = {k: meta[k] for k in BLOCK_SIZE_KEYS if k in meta}
    if len(set(sizes.values())) > 1:
        said = ", ".join(f"{k} {v}" for k, v in sizes.items())
        raise InputError(f"{source}: metadata {said} disagree; they name one block size")


def _hint(path: str) -> str:
    if path.startswith("request_ids"):
        return "request_ids is a list of strings, one per sequence (str() an engine's numbers)"
    return "the metadata is the snapshot's JSON ('pagedkv' member): write it with Snapshot.save"


def tensor_fields(d: Any, path: str) -> dict[str, Any]:
    """A cache-tensor layout object held to ``TENSOR_FIELDS`` (raises Refused)."""
    if not isinstance(d, dict):
        raise Refused(path, d, "is not an object")
    _known(d, TENSOR_FIELDS, path)
    for key in TENSOR_REQUIRED:
        if key not in d:
            raise Refused(f"{path}.{key}", None, "is missing")
    for key, kind in TENSOR_FIELDS.items():
        if d.get(key) is not None:
            value(kind, d[key], f"{path}.{key}")
        elif key in TENSOR_REQUIRED:
            raise Refused(f"{path}.{key}", None, "is missing")
    return d


def check_tensor(t: Any, path: str) -> None:
    """A cache tensor's layout makes sense: dims known, one a dimension, shape and strides
    of the same length, its last byte inside the 64-bit address space (raises Refused)."""
    fields = {
        "name": t.name,
        "shape": list(t.shape),
        "strides": list(t.strides),
        "dtype": t.dtype,
        "itemsize": t.itemsize,
        "dims": list(t.dims),
        "pointer": t.pointer,
        "kv": t.kv,
        "layer": t.layer,
        "pool": t.pool,
    }
    tensor_fields(fields, path)
    dims = fields["dims"]
    for i, name in enumerate(dims):
        if name not in DIMS:
            close = difflib.get_close_matches(name, DIMS, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise Refused(
                f"{path}.dims[{i}]",
                name,
                f"is not a dimension name{hint}; known: {', '.join(DIMS)}",
            )
        if dims.index(name) != i:
            raise Refused(f"{path}.dims[{i}]", name, "names a dimension twice")
    for key in ("shape", "strides"):
        if len(fields[key]) != len(dims):
            raise Refused(
                f"{path}.{key}", fields[key], f"has {len(fields[key])} entries for {len(dims)} dims"
            )
    if "token" in dims and ("block" in dims or "slot" in dims):
        raise Refused(f"{path}.dims", dims, "has 'token' (a flat slot) and 'block' or 'slot'")
    if "token" not in dims and ("block" not in dims or "slot" not in dims):
        raise Refused(
            f"{path}.dims",
            dims,
            "has neither 'token' nor both 'block' and 'slot': every token would have one address",
        )
    if "kv" in dims and "kvdim" in dims:
        raise Refused(f"{path}.dims", dims, "has both 'kv' and 'kvdim'")
    shape = dict(zip(dims, fields["shape"], strict=True))
    if "kv" in shape and shape["kv"] != 2:
        raise Refused(f"{path}.shape", fields["shape"], "has a 'kv' dimension that is not 2")
    if "kvdim" in shape and shape["kvdim"] % 2:
        raise Refused(f"{path}.shape", fields["shape"], "has an odd 'kvdim' (K and V halves)")
    extent = sum((n - 1) * s for n, s in zip(fields["shape"], fields["strides"], strict=True))
    last = (t.pointer or 0) + extent * t.itemsize
    if last > INT64_MAX:
        raise Refused(
            f"{path}.pointer",
            t.pointer,
            f"+ the tensor's {extent * t.itemsize:,} bytes ends past 2^63 - 1 (shape, strides "
            "or itemsize too large)",
        )


def check_tensors(tensors: list[Any], source: str) -> None:
    """Every cache tensor of a snapshot held to ``check_tensor``: an InputError naming it."""
    for i, t in enumerate(tensors):
        try:
            check_tensor(t, f"cache_tensors[{i}]")
        except Refused as e:
            raise InputError(
                f"{source}: {e}",
                hint="a layout's dims name each dimension of its shape ('Byte addresses' in "
                "https://github.com/pagedkv-sql/pagedkv-sql/blob/main/docs/engines.md)",
            ) from None


def request_ids_argument(ids: Any) -> list[str] | None:
    """A snapshot function's ``request_ids``: None, or a sequence of strings (or integers,
    which TensorRT-LLM numbers its requests with), as strings; else a UsageError."""
    if ids is None:
        return None
    argument(ids, "request_ids", (list, tuple, Sequence), "a list of strings")
    if isinstance(ids, str | bytes):
        argument(ids, "request_ids", list, "a list of strings")
    what = "a string (or an integer)"
    return [str(argument(r, f"request_ids[{i}]", (str, Integral), what)) for i, r in enumerate(ids)]


# the keys a plain `np.savez` may carry as members rather than in the 'pagedkv' JSON
_SCALAR_KINDS = (Int, Bool, Choice, Str)


def members_to_meta(engine: str, arrays: Any, meta: dict[str, Any], source: str) -> None:
    """Move the metadata a plain ``np.savez`` carries as members into ``meta``: a 0-d member
    named after a scalar key of the engine's schema (FlashInfer's ``page_size=np.array(16)``,
    ``kv_layout``, vLLM's ``block_size``...: what plan() or the engine takes as a scalar) and
    a 1-d string member ``request_ids``. A key the JSON metadata also has must agree."""
    schema = {**COMMON, **SCHEMAS.get(engine, {})}
    for name in list(arrays):
        kind = schema.get(name)
        if kind is None:
            continue
        arr = arrays[name]
        if isinstance(kind, _SCALAR_KINDS) and getattr(arr, "ndim", None) == 0:
            got: Any = arr.item()
        elif name == "request_ids" and arr.ndim == 1 and arr.dtype.kind == "U":
            got = [str(r) for r in arr.tolist()]
        else:
            continue
        if name in meta and meta[name] != got:
            raise InputError(
                f"{source}: member {name!r} ({shown(got)}) and the metadata's "
                f"({shown(meta[name])}) disagree",
                hint=f"keep one {name}: the member or the 'pagedkv' JSON's",
            )
        meta[name] = got
        del arrays[name]


def complete(
    source: str,
    meta: dict[str, Any],
    *,
    block_size: int | None = None,
    request_ids: Sequence[str] | None = None,
) -> None:
    """What a file cannot carry, given by its importer (``import --page-size N
    --request-ids FILE``); a value the file records must agree with it."""
    if block_size is not None:
        if not 1 <= block_size <= MAX_BLOCK_SIZE:  # the option, not the file, is wrong
            raise UsageError(
                f"--page-size must be a number of tokens in [1, {MAX_BLOCK_SIZE}] (the spec's "
                f"offsets are below {MAX_BLOCK_SIZE}), not {block_size}",
                hint="give the engine's page (block) size, or leave --page-size out",
            )
        recorded = {k: meta[k] for k in BLOCK_SIZE_KEYS if k in meta}
        differ = {k: v for k, v in recorded.items() if v != block_size}
        if differ:
            said = ", ".join(f"{k} {shown(v)}" for k, v in differ.items())
            raise InputError(
                f"{source} records {said}, not the --page-size {block_size} given",
                hint="leave --page-size out: the file's own is used",
            )
        meta["block_size"] = block_size
    if request_ids is not None:
        ids = list(request_ids)
        if "request_ids" in meta and meta["request_ids"] != ids:
            raise InputError(
                f"{source} records request ids of its own, not those of --request-ids",
                hint="leave --request-ids out: the file's own are used",
            )
        meta["request_ids"] = ids
