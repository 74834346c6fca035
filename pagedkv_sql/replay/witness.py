"""What a step log of format version 2 carries beyond the block tables (docs/replay.md,
"The witness"): the hashes the engine caches blocks under and the hashes a prefix hit asked
for, the blocks a request's free actually gave back to the pool, and the blocks the
engine's free list holds. Replay cannot derive these from the block tables; its checks read
them (prefix_hash, leak, double_free, held_free_block, free_list_duplicate). The
Builder's helpers for them, and for the engine's observed counts."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..hashes import canonical
from .header import (
    V2_FIELDS,
    V2_OPS,
    LogLineError,
    as_block_ids,
    as_count,
    as_hash,
    as_int,
    as_list,
    as_object,
)

if TYPE_CHECKING:
    from .builder import Builder


def refuse_v2(version: int, obj: Mapping[str, Any], what: str) -> None:
    """A version 1 log may not carry what version 2 added (its header promised without)."""
    if version >= 2:
        return
    name = obj.get("op")
    found = [f"operation '{name}'"] if name in V2_OPS else []
    found += [f"'{key}'" for key in V2_FIELDS if key in obj]
    if found:
        raise LogLineError(
            f"{what}: {', '.join(found)} {'is' if len(found) == 1 else 'are'} format version 2, "
            'but the header says version 1 (write "pagedkv_step_log": 2)'
        )


def hashes(obj: Mapping[str, Any], count: int, what: str) -> list[int | None] | None:
    """The ``hashes`` of a share (or of a new request's prefix hits): per block, the hash
    the request asked for (null: not known); None when the field is absent."""
    if "hashes" not in obj:
        return None
    given = as_list(obj["hashes"], f"{what}.hashes")
    if len(given) != count:
        raise LogLineError(
            f"{what}.hashes has {len(given)} hash(es) for {count} shared block(s); give one "
            "a block (null where it is not known)"
        )
    return [None if h is None else as_hash(h, f"{what}.hashes[{i}]") for i, h in enumerate(given)]


def handed(obj: Mapping[str, Any], what: str) -> list[int] | None:
    """The ``handed`` of a free or a preemption: the blocks the engine's free gave back to
    the pool, each once per time (None: the request's table, once each)."""
    if "handed" not in obj:
        return None
    return as_block_ids(obj["handed"], f"{what}.handed")


def cache(builder: Builder, op: Mapping[str, Any], what: str) -> None:
    """``cache``: the engine's prefix cache now hands out these blocks for these hashes."""
    blocks = as_block_ids(op.get("blocks", []), f"{what}.blocks")
    if "hashes" not in op:
        raise LogLineError(f"{what} needs 'hashes', one a block")
    given = hashes(op, len(blocks), what) or []
    for i, (block, h) in enumerate(zip(blocks, given, strict=True)):
        if h is None:
            raise LogLineError(f"{what}.hashes[{i}]: a cached block's hash cannot be null")
        builder.emit("cache", block_id=block, value=h)


def observe(builder: Builder, obs: Mapping[str, Any], what: str) -> None:
    """The engine's own counts (an ``observe`` op or a step's ``observed``): each block's
    ref_cnt, the blocks its free list holds (a block once an entry), its free count."""
    unknown = sorted(set(obs) - {"op", "ref_cnt", "num_free_blocks", "free_list"})
    if unknown:
        raise LogLineError(f"{what}: unknown key(s) {', '.join(unknown)}")
    refs = as_object(obs.get("ref_cnt", {}), f"{what}.ref_cnt")
    for key, value in refs.items():
        try:
            block = int(key)
        except ValueError:
            raise LogLineError(f"{what}.ref_cnt: block id {key!r} is not a number") from None
        builder.emit("observe_ref", block_id=block, value=as_int(value, f"{what}.ref_cnt[{key}]"))
    if "free_list" in obs:
        listed = Counter(as_block_ids(obs["free_list"], f"{what}.free_list"))
        for block, times in listed.items():
            builder.emit("observe_free_list", block_id=block, value=times)
    if obs.get("num_free_blocks") is not None:
        free = as_count(obs["num_free_blocks"], f"{what}.num_free_blocks")
        builder.emit("observe_free", value=free)


def short_hash(value: Any) -> str | None:
    """An engine's block hash as a log writes it: vLLM's published integer (the digest's
    last 8 bytes, big-endian: ``hashes.canonical``) of a byte string, the low 64 bits of an
    integer, as 16 hex digits; None for no hash."""
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        return f"{canonical(bytes(value)):016x}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value & ((1 << 64) - 1):016x}"
    return hashlib.blake2b(repr(value).encode(), digest_size=8).hexdigest()
