"""The step log's format (docs/replay.md): its version, the event table's schema and how
it is written (`write_events`), the operations and keys of a step, the header (the log's
constants), and the validators of a step's fields, each raising a LogLineError that names
the field."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from .. import compression
from ..errors import InputError
from ..hashes import FIRST8, FOLDS
from ..kv_groups import FULL_ATTENTION, KINDS, REPLAYED_KINDS, WINDOW_KEYS
from ..limits import MAX_BLOCK_SIZE, MAX_POOL_TOKENS

FORMAT_VERSION = 2  # what this version writes
VERSIONS = (1, 2)  # what it reads: 1 lacks the witness of version 2 (hashes, free lists)
HEADER_KEY = "pagedkv_step_log"
MAX_PROBLEMS = 1000

EVENT_SCHEMA = pa.schema(
    [
        ("event", pa.int64()),
        ("step", pa.int64()),
        ("op", pa.string()),
        ("request", pa.string()),
        ("block_index", pa.int64()),
        ("block_id", pa.int64()),
        ("cpu_address", pa.int64()),
        ("token_from", pa.int64()),
        ("token_to", pa.int64()),
        ("value", pa.int64()),
        ("parent", pa.string()),
        ("group_id", pa.int64()),
    ]
)
# the columns an event table may lack (one written before they were added): their default
EVENT_DEFAULTS = {"group_id": 0}
EVENT_OPS = (
    "arrive",
    "allocate",
    "share",
    "fork",
    "swap_in",
    "append",
    "swap_out",
    "release",
    "free",
    "preempt",
    "evict",
    "observe_ref",
    "observe_free",
    "cache",
    "kept",
    "observe_free_list",
    "hit",
)
STEP_OPS = (
    "allocate",
    "share",
    "append",
    "fork",
    "free",
    "preempt",
    "release",
    "evict",
    "swap_out",
    "swap_in",
    "observe",
    "cache",
    "window_free",
)
# what only a version 2 log may carry: ops, and fields of ops and of ``new_requests``
V2_OPS = ("cache",)
V2_FIELDS = ("hashes", "handed", "free_list")
STEP_KEYS = (
    "step",
    "new_requests",
    "running",
    "scheduled_new_reqs",
    "scheduled_cached_reqs",
    "num_scheduled_tokens",
    "finished",
    "finished_req_ids",
    "preempted",
    "preempted_req_ids",
    "ops",
    "observed",
    "note",
    "time",
)
_REQ_KEYS = ("req", "req_id", "request_id")


@dataclass(frozen=True)
class Group:
    """One KV-cache group of the engine the log records (vLLM's ``kv_cache_groups``): its
    kind (kv_groups.KINDS), block size and window in tokens
    (a sliding window, or a local-attention chunk; None for the other kinds)."""

    kind: str
    block_size: int
    sliding_window: int | None = None
    attention_chunk_size: int | None = None

    def __str__(self) -> str:
        window = self.sliding_window or self.attention_chunk_size
        return f"{self.kind}{f' {window}' if window else ''} (block size {self.block_size})"


@dataclass(frozen=True)
class Header:
    """The log's constants (its first line, or defaults). ``groups`` empty: one
    full-attention group of ``block_size`` (every log written before groups)."""

    engine: str = ""
    block_size: int = 16
    block_bytes: int = 256
    gpu_base: int = 0
    num_gpu_blocks: int | None = None
    reserved_blocks: tuple[int, ...] = ()
    groups: tuple[Group, ...] = ()
    # how the log folds an engine's block hash to 64 bits (pagedkv_sql/hashes.py): vLLM's
    # published integer, or the first 8 bytes (a log without the key, written before)
    hash: str = FIRST8

    def to_json(self) -> str:
        fields = asdict(self)
        if not self.groups:  # one full-attention group: the header of every older log
            del fields["groups"]
        if self.hash == FIRST8:  # the fold of every log without the key
            del fields["hash"]
        return json.dumps({HEADER_KEY: FORMAT_VERSION, **fields})

    def base(self, block_id: int) -> int:
        """The spec's ``physical_block_base`` of a GPU block."""
        return self.gpu_base + block_id * self.block_bytes

    def unreplayable(self) -> str | None:
        """Why replay cannot check this log's KV-cache groups, or None: it replays
        full-attention, sliding-window and chunked-local-attention groups, any number of
        them, not a Mamba group (whose block tables the engine rewrites in place)."""
        for g, group in enumerate(self.groups):
            if group.kind not in REPLAYED_KINDS:
                described = "; ".join(f"group {i}: {x}" for i, x in enumerate(self.groups))
                return (
                    f"its KV cache is {len(self.groups)} KV-cache group(s) ({described}): "
                    f"group {g} is {group.kind}, whose block tables the engine rewrites in "
                    "place (copy-on-write, relocated state blocks); replay checks "
                    f"{', '.join(REPLAYED_KINDS)} groups only"
                )
        if self.groups and self.groups[self.primary].block_size != self.block_size:
            return (
                f"its primary group's block size {self.groups[self.primary].block_size} is "
                f"not the header's block_size {self.block_size}"
            )
        return None

    @property
    def primary(self) -> int:
        """The group the spec's relations describe: the first full-attention group, else
        group 0 (docs/decisions.md, "KV-cache groups")."""
        kinds = [g.kind for g in self.groups]
        return kinds.index(FULL_ATTENTION) if FULL_ATTENTION in kinds else 0

    def group(self, g: int) -> Group:
        """Group ``g`` (a log without groups: one full-attention group of block_size)."""
        if not self.groups:
            return Group(FULL_ATTENTION, self.block_size)
        return self.groups[g]


SNAPSHOT_HINT = (
    "check the engine's snapshots instead: record them beside the log with "
    "PAGEDKV_SNAPSHOT_EVERY=N (a capture every N steps, LOG.step<S>.npz), then "
    "`pagedkv-sql import vllm LOG.step<S>.npz` and `pagedkv-sql check`"
)


def log_groups(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The header's ``groups`` of an engine's groups (``engines.vllm.describe_groups``):
    kind, block size, the window of a kind that has one (none for one full-attention group:
    what a log without groups means)."""
    if len(groups) == 1 and groups[0]["kind"] == FULL_ATTENTION:
        return []
    return [
        {k: v for k, v in g.items() if k in {"kind", "block_size", WINDOW_KEYS.get(g["kind"])}}
        for g in groups
    ]


def unreplayable(groups: list[dict[str, Any]]) -> str | None:
    """Why replay will refuse a log of an engine's groups (``Header.unreplayable``), or
    None."""
    header = Header(groups=groups_from(log_groups(groups)))
    if not header.groups:
        return None
    size = header.groups[header.primary].block_size
    return Header(block_size=size, groups=header.groups).unreplayable()


def replayable(header: Header, source: str) -> Header:
    """``header``; an InputError, nothing replayed, for a log whose KV-cache groups replay
    cannot check: replayed as one full-attention group, the engine's window frees and
    placeholders would be findings, every one false."""
    why = header.unreplayable()
    if why is not None:
        raise InputError(
            f"{source}: the step log's header: {why}; the log was not replayed",
            hint=SNAPSHOT_HINT,
        )
    return header


class LogLineError(Exception):
    """One line of a log cannot be read; the reader collects these."""

    column: int | None = None
    cut: bool = False  # the line ends inside a character: cut off while written


def header_from(obj: Mapping[str, Any]) -> Header:
    """Validate a header object (raises LogLineError)."""
    version_of(obj)
    known = {HEADER_KEY, *Header.__dataclass_fields__}
    unknown = sorted(set(obj) - known)
    if unknown:
        raise LogLineError(f"unknown header key(s) {', '.join(unknown)}; known: {sorted(known)}")
    engine = obj.get("engine", "")
    if not isinstance(engine, str):
        raise LogLineError("header 'engine' must be a string")
    block_size = as_int(obj.get("block_size", 16), "header 'block_size'")
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise LogLineError(f"header 'block_size' must be in 1..{MAX_BLOCK_SIZE}, not {block_size}")
    block_bytes = as_int(obj.get("block_bytes", 256), "header 'block_bytes'")
    if block_bytes <= 0 or block_bytes % 256:
        raise LogLineError(
            f"header 'block_bytes' must be a positive multiple of 256, not {block_bytes}"
        )
    gpu_base = as_int(obj.get("gpu_base", 0), "header 'gpu_base'")
    if gpu_base % 256:
        raise LogLineError(f"header 'gpu_base' must be a multiple of 256, not {gpu_base}")
    pool = obj.get("num_gpu_blocks")
    if pool is not None:
        pool = as_int(pool, "header 'num_gpu_blocks'")
        if pool <= 0:
            raise LogLineError(f"header 'num_gpu_blocks' must be positive, not {pool}")
    reserved = tuple(as_ints(obj.get("reserved_blocks", []), "header 'reserved_blocks'"))
    groups = groups_from(obj.get("groups", []))
    fold = obj.get("hash", FIRST8)
    if fold not in FOLDS:
        raise LogLineError(
            f"header 'hash' must be one of {', '.join(FOLDS)}, not {json.dumps(fold)[:40]}"
        )
    return Header(engine, block_size, block_bytes, gpu_base, pool, reserved, groups, fold)


def groups_from(value: Any) -> tuple[Group, ...]:
    """The header's ``groups`` (raises LogLineError naming the group and field)."""
    out = []
    for g, obj in enumerate(as_list(value, "header 'groups'")):
        what = f"header 'groups'[{g}]"
        obj = as_object(obj, what)
        keys = {"kind", "block_size", *WINDOW_KEYS.values()}
        unknown = sorted(set(obj) - keys)
        if unknown:
            raise LogLineError(
                f"{what}: unknown key(s) {', '.join(unknown)}; known: {sorted(keys)}"
            )
        kind = obj.get("kind")
        if kind not in KINDS:
            raise LogLineError(
                f"{what}.kind must be one of {', '.join(KINDS)}, not {json.dumps(kind)}"
            )
        size = as_int(obj.get("block_size"), f"{what}.block_size")
        if not 1 <= size <= MAX_POOL_TOKENS:  # a block holds no more tokens than a pool
            raise LogLineError(
                f"{what}.block_size must be in 1..{MAX_POOL_TOKENS:,} (no block holds more "
                f"tokens than a pool), not {size}"
            )
        windows: dict[str, int | None] = {}
        for key in WINDOW_KEYS.values():
            window = obj.get(key)
            if window is not None:
                window = as_int(window, f"{what}.{key}")
                if window < 1:
                    raise LogLineError(f"{what}.{key} must be positive, not {window}")
            if window is None and WINDOW_KEYS.get(kind) == key:
                raise LogLineError(f"{what}.{key} is required for a {kind} group")
            if window is not None and WINDOW_KEYS.get(kind) != key:
                raise LogLineError(f"{what}.{key} is not a field of a {kind} group (null)")
            windows[key] = window
        out.append(Group(kind, size, **windows))
    return tuple(out)


def version_of(obj: Mapping[str, Any]) -> int:
    """The format version a header object names (raises LogLineError for one this does not
    read)."""
    version = obj.get(HEADER_KEY)
    if not isinstance(version, int) or isinstance(version, bool) or version not in VERSIONS:
        raise LogLineError(
            f"unsupported step log version {json.dumps(version)} (this reads 1 and 2)"
        )
    return int(version)


HASH_DIGITS = 16  # a block hash in a log: 64 bits, as 16 hex digits


def as_hash(value: Any, what: str) -> int:
    """A block hash of the log (16 hex digits: the engine's hash folded to 64 bits as the
    header's ``hash`` says) as the signed 64-bit integer the event table keeps."""
    if not (
        isinstance(value, str)
        and len(value) == HASH_DIGITS
        and all(c in "0123456789abcdefABCDEF" for c in value)
    ):
        raise LogLineError(
            f"{what} must be a block hash of {HASH_DIGITS} hex digits, not {json.dumps(value)[:40]}"
        )
    n = int(value, 16)
    return n - (1 << 64) if n >= 1 << 63 else n


def hash_text(value: int) -> str:
    """The event table's signed 64-bit hash as the log writes it (16 hex digits)."""
    return f"{value & ((1 << 64) - 1):016x}"


def as_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LogLineError(f"{what} must be an integer, not {json.dumps(value)}")
    if not -(1 << 63) <= value < (1 << 63):
        raise LogLineError(f"{what} {value} is out of the signed 64-bit range")
    return value


def as_count(value: Any, what: str) -> int:
    n = as_int(value, what)
    if n < 0:
        raise LogLineError(f"{what} must not be negative, not {n}")
    return n


def as_ints(value: Any, what: str) -> list[int]:
    if not isinstance(value, list):
        raise LogLineError(f"{what} must be a list of integers, not {json.dumps(value)}")
    out = [as_int(v, what) for v in value]
    for v in out:
        if v < 0:
            raise LogLineError(f"{what}: block id {v} is negative")
    return out


def as_block_ids(value: Any, what: str) -> list[int]:
    """A list of block ids, or vLLM's tuple of one list per KV-cache group (one group)."""
    if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        if len(value) != 1:
            raise LogLineError(
                f"{what} has {len(value)} KV-cache groups; a list of one group's blocks is "
                "needed here (ops carry 'group')"
            )
        value = value[0]
    return as_ints(value, what)


def as_block_slots(value: Any, what: str) -> list[int | None]:
    """A list of block ids that may hold ``null``: a placeholder entry (the index
    advances, no block is held: a sliding window's prefix-hit padding)."""
    if isinstance(value, list) and None in value:
        return [None if v is None else as_ints([v], what)[0] for v in value]
    return list(as_block_ids(value, what))


def request_of(obj: Mapping[str, Any], what: str) -> str:
    for key in _REQ_KEYS:
        if key in obj:
            return as_request_id(obj[key], what)
    raise LogLineError(f"{what} has no request id ('req')")


def as_request_id(value: Any, what: str) -> str:
    """A request id: a string (or an integer, as its decimal text) of valid Unicode."""
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise LogLineError(f"{what}: request id must be a string, not {json.dumps(value)[:60]}")
    text = str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise LogLineError(
            f"{what}: request id {text[:40]!r} is not valid Unicode (a lone surrogate escape)"
        ) from None
    return text


def as_object(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise LogLineError(f"{what} must be an object, not {json.dumps(value)[:60]}")
    return value


def as_list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise LogLineError(f"{what} must be a list, not {json.dumps(value)[:60]}")
    return value


EVENT_SUFFIXES = (".parquet", ".arrow", ".feather", ".arrows")


def events_format(path: str | os.PathLike[str]) -> str:
    """How an event table is written to ``path``: parquet, or arrow (an IPC file; also for
    a name without a suffix), by its suffix (``.gz``, ``.zst`` after it compress); any
    other suffix is refused."""
    suffix = Path(compression.strip(path)[0]).suffix.lower()
    if suffix not in ("", *EVENT_SUFFIXES):
        from ..errors import UsageError

        raise UsageError(
            f"{path}: an event table is written as {' '.join(EVENT_SUFFIXES)}, not "
            f"'{suffix}'; nothing was written",
            hint="name the file .parquet or .arrow (then .gz or .zst to compress it)",
        )
    return "parquet" if suffix == ".parquet" else "arrow"


def write_events(table: pa.Table, path: str | os.PathLike[str]) -> None:
    """Write the event table as Parquet (.parquet) or an Arrow IPC file (.arrow, .feather,
    .arrows), whole or not at all, compressed as a .gz or .zst after that says."""
    fmt = events_format(path)
    with compression.output(path) as f:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, f, compression="zstd")
        else:
            import pyarrow.ipc as ipc

            with ipc.new_file(f, table.schema) as w:
                w.write_table(table)
