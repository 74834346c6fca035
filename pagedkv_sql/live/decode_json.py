"""Decoding KV-cache events in JSON into the event classes of live/events.py:
TensorRT-LLM's `get_kv_cache_events()` objects, NVIDIA Dynamo's `RouterEvent` lines and
vLLM-shaped objects; a JSON array of them or JSON Lines. A malformed line is refused with
its line (and column) in an `InputError`; live/decode.py's `batches` picks JSON or
msgpack by a stream's first byte."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import IO, Any, Literal

import msgspec

from .. import limits
from ..errors import InputError, Problem
from ..limits import DuplicateKey, refuse_duplicate_keys
from .events import (
    CHUNK,
    MAX_SEQ,
    Batch,
    Cleared,
    Created,
    Event,
    Int64,
    JsonHash,
    Malformed,
    Reader,
    Removed,
    Stored,
    Updated,
)


class _TrtBlock(msgspec.Struct, gc=False):
    block_hash: JsonHash


class _TrtData(msgspec.Struct, gc=False):
    type: str
    parent_hash: JsonHash | None = None
    blocks: list[_TrtBlock] = []
    block_hashes: list[JsonHash] = []
    block_hash: JsonHash | None = None


class _TrtEvent(msgspec.Struct, gc=False):
    event_id: int
    data: _TrtData
    window_size: Int64 | None = None
    attention_dp_rank: int | None = None


class _DynStored(msgspec.Struct, gc=False):
    blocks: list[_TrtBlock]
    parent_hash: JsonHash | None = None


class _DynRemoved(msgspec.Struct, gc=False):
    block_hashes: list[JsonHash]


class _DynData(msgspec.Struct, gc=False):
    stored: _DynStored | None = None
    removed: _DynRemoved | None = None
    cleared: Any = None


class _DynEvent(msgspec.Struct, gc=False):
    event_id: int
    data: _DynData | Literal["cleared"]
    dp_rank: int | None = None


class _JStored(msgspec.Struct, tag_field="type", tag="BlockStored", gc=False):
    block_hashes: list[JsonHash]
    parent_block_hash: JsonHash | None = None
    medium: str | None = None
    group_idx: Int64 | None = None
    locality: str | None = None
    ownership: str | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: Int64 | None = None


class _JRemoved(msgspec.Struct, tag_field="type", tag="BlockRemoved", gc=False):
    block_hashes: list[JsonHash]
    medium: str | None = None
    group_idx: Int64 | None = None
    locality: str | None = None
    ownership: str | None = None


class _JCleared(msgspec.Struct, tag_field="type", tag="AllBlocksCleared", gc=False):
    pass


class _JBatch(msgspec.Struct, gc=False):
    events: list[_JStored | _JRemoved | _JCleared]
    ts: float | None = None
    data_parallel_rank: int | None = None


_JSON_ANY = msgspec.json.Decoder()
_JSON_OUT = msgspec.json.Encoder()
MAX_DOCUMENT = 2 * limits.MAX_LINE_BYTES  # one JSON array of events (TensorRT-LLM's list)


def json_value(text: bytes) -> Any:
    """A JSON text of KV events, read by msgspec and strictly: a key named twice in one
    object (msgspec, like every JSON reader, keeps the last: an event dropped) is Malformed."""
    obj = _JSON_ANY.decode(text)
    try:
        refuse_duplicate_keys(text, _JSON_OUT.encode(obj))
    except DuplicateKey as e:
        raise Malformed(
            f"duplicate key '{e}' in one object (JSON would keep only the last one)"
        ) from None
    return obj


def _vllm_json(e: _JStored | _JRemoved | _JCleared) -> Event:
    if isinstance(e, _JCleared):
        return Cleared()
    if isinstance(e, _JStored):
        out = _stored(
            list(e.block_hashes),
            e.parent_block_hash,
            e.medium,
            e.group_idx,
            e.locality,
            e.ownership,
        )
        out.spec_kind = e.kv_cache_spec_kind
        out.spec_window = e.kv_cache_spec_sliding_window
        return out
    return _removed(list(e.block_hashes), e.medium, e.group_idx, e.locality, e.ownership)


def _stored(hashes: list[Any], parent: Any, *scope: Any, window: int | None = None) -> Stored:
    """A JSON event's BlockStored (its hashes may be text: JSON has no bytes)."""
    e = Stored(hashes, parent, *scope)
    e.window = window
    return e


def _removed(hashes: list[Any], *scope: Any, window: int | None = None) -> Removed:
    e = Removed(hashes, *scope)
    e.window = window
    return e


def json_batch(obj: Any, where: str) -> Batch:
    """One JSON object (already parsed, untyped) as a batch; `Malformed` if it is none."""
    if not isinstance(obj, dict):
        raise Malformed("not a KV event (a JSON object)")
    try:
        if "event_id" in obj and isinstance(obj.get("data"), dict) and "type" in obj["data"]:
            return _trtllm(msgspec.convert(obj, _TrtEvent), where)
        if "event" in obj or ("event_id" in obj and "data" in obj):
            return _dynamo(obj, where)
        if "events" in obj:
            b = msgspec.convert(obj, _JBatch)
            rank = b.data_parallel_rank
            return Batch(f"dp {rank or 0}", None, b.ts, where, [_vllm_json(e) for e in b.events])
        if "type" in obj:
            e = msgspec.convert(obj, _JStored | _JRemoved | _JCleared)
            return Batch("dp 0", None, None, where, [_vllm_json(e)])
    except msgspec.ValidationError as e:
        raise Malformed(str(e)) from None
    raise Malformed(
        "not a KV event: TensorRT-LLM (event_id, data.type), Dynamo (worker_id, event) or "
        "vLLM (type / events)"
    )


def _trtllm(ev: _TrtEvent, where: str) -> Batch:
    d = ev.data
    window = ev.window_size
    event: Event
    if d.type == "stored":
        event = _stored([b.block_hash for b in d.blocks], d.parent_hash, window=window)
    elif d.type == "removed":
        event = _removed(list(d.block_hashes), window=window)
    elif d.type == "updated":
        if d.block_hash is None:
            raise Malformed("an updated event names its block_hash")
        event = Updated([d.block_hash], window)
    elif d.type == "created":
        event = Created(window)
    else:
        raise Malformed(f"data.type {d.type!r} is not stored, removed, created or updated")
    _check_seq(ev.event_id)
    return Batch(f"dp {ev.attention_dp_rank or 0}", ev.event_id, None, where, [event])


def _dynamo(obj: dict[str, Any], where: str) -> Batch:
    worker = None
    ev: Any = obj
    while isinstance(ev, dict) and "event_id" not in ev and isinstance(ev.get("event"), dict):
        worker = ev.get("worker_id", worker)
        ev = ev["event"]
    if worker is not None and (not isinstance(worker, int | str) or isinstance(worker, bool)):
        raise Malformed("worker_id must be an integer or a string")
    d = msgspec.convert(ev, _DynEvent)
    _check_seq(d.event_id)
    event: Event
    if d.data == "cleared" or (isinstance(d.data, _DynData) and d.data.cleared is not None):
        event = Cleared()
    elif isinstance(d.data, _DynData) and d.data.stored is not None:
        event = _stored([b.block_hash for b in d.data.stored.blocks], d.data.stored.parent_hash)
    elif isinstance(d.data, _DynData) and d.data.removed is not None:
        event = _removed(list(d.data.removed.block_hashes))
    else:
        raise Malformed("data must be stored, removed or cleared")
    stream = (f"worker {worker}" if worker is not None else "worker") + f" dp {d.dp_rank or 0}"
    return Batch(stream, d.event_id, None, where, [event])


def _check_seq(n: int) -> None:
    if not -(2**63) <= n <= MAX_SEQ:
        raise Malformed(f"event_id {n} is out of the 64-bit range")


def json_batches(stream: IO[bytes] | Reader, source: str) -> Iterator[Batch]:
    """Batches of JSON Lines, or of one JSON array of events (TensorRT-LLM's list)."""
    first = stream.read(CHUNK)
    head = first.lstrip()[:1]
    if head == b"[":  # one JSON document: an array of event objects
        data = _read_at_most(first, stream, MAX_DOCUMENT)
        if stream.read(1):  # `(echo [; cat /dev/zero)` was read until memory ran out
            raise InputError(
                f"{source}: a JSON array of KV events longer than {MAX_DOCUMENT:,} bytes",
                hint="write long streams as JSON Lines (one event a line)",
            )
        try:
            items = json_value(data)
        except (msgspec.DecodeError, RecursionError, ValueError, Malformed) as e:
            raise InputError(
                f"{source}: not a JSON array of KV events",
                [Problem(source, None, None, f"malformed JSON: {e}")],
            ) from None
        if not isinstance(items, list):
            raise InputError(f"{source}: not a JSON array of KV events")
        problems: list[Problem] = []
        out: list[Batch] = []
        for i, item in enumerate(items):
            try:
                out.append(json_batch(item, f"{source}[{i}]"))
            except (Malformed, ValueError) as e:
                problems.append(Problem(source, None, None, f"item {i}: {e}"))
        _raise_lines(source, problems)
        yield from out
        return
    yield from _json_lines(_lines(first, stream, source), source)


def _read_at_most(first: bytes, stream: IO[bytes] | Reader, limit: int) -> bytes:
    """``first`` and what follows it, up to ``limit`` bytes in all, read a chunk at a time
    (one read(limit) makes CPython allocate all of it at once, whatever the file holds)."""
    pieces = [first]
    held = len(first)
    while held < limit and (chunk := stream.read(min(CHUNK, limit - held))):
        pieces.append(chunk)
        held += len(chunk)
    return b"".join(pieces)


def _lines(first: bytes, stream: IO[bytes] | Reader, source: str = "") -> Iterator[bytes]:
    def chunks() -> Iterator[bytes]:
        chunk = first
        while chunk:
            yield chunk
            chunk = stream.read(CHUNK)

    try:
        yield from limits.split_lines(chunks())
    except limits.LineTooLong as e:  # `kv-events /dev/zero` held the whole line
        raise InputError(
            f"{source}:{e.number}: a line longer than {e.limit:,} bytes",
            hint="a JSON Lines kv-event file has one event a line",
        ) from None


def _json_lines(lines: Iterable[bytes], source: str) -> Iterator[Batch]:
    problems: list[Problem] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            batch = json_batch(json_value(line), f"{source}:{number}")
        except (msgspec.DecodeError, RecursionError, ValueError) as e:
            problems.append(Problem(source, number, _column(e), f"malformed JSON: {e}"))
            continue
        except Malformed as e:
            problems.append(Problem(source, number, None, str(e)))
            continue
        if not problems:
            yield batch
    _raise_lines(source, problems)


def _column(e: Exception) -> int | None:
    """The 1-based column msgspec's message names as a 0-based byte, if it does."""
    m = re.search(r"\(byte (\d+)\)", str(e))
    return int(m.group(1)) + 1 if m else None


def _raise_lines(source: str, problems: list[Problem]) -> None:
    if problems:
        raise InputError(
            f"{source}: {len(problems)} line(s) are not KV events",
            problems[:100],
            len(problems),
            hint="the accepted layouts: 'Prefix-cache events' in https://github.com/pagedkv-sql/pagedkv-sql/blob/main/docs/replay.md",
        )
