"""Decoding KV-cache event streams into batches of typed events (issue 26).

Every engine's layout is decoded by msgspec into the same event classes (`Stored`,
`Removed`, `Cleared`, `Updated`, `Created`), whose attributes the checker reads:

- vLLM (`vllm/distributed/kv_events.py`): `KVEventBatch` is an array `[ts, events,
  data_parallel_rank]`; each event a map tagged by `"type"` (0.32: `omit_defaults`, no
  `array_like`), or, in older releases, a tagged array in vLLM's field order.
- SGLang (`srt/disaggregation/kv_events.py`): `[ts, events]`, each event a tagged array in
  SGLang's own field order (`BlockStored`: hashes, parent, tokens, block_size, lora_id,
  medium; `BlockRemoved`: hashes, medium).
- msgpack streams are framed by `msgpack.Unpacker` (objects back to back, or ZMQ frames
  `[topic, seq, payload]` / `[seq, payload]` as a subscriber writes them).
- JSON: TensorRT-LLM's `get_kv_cache_events()` objects (`event_id`, `data.type` stored /
  removed / created / updated, `window_size`, `attention_dp_rank`), NVIDIA Dynamo's
  `RouterEvent` lines, and vLLM-shaped objects; a JSON array of them or JSON Lines.

Malformed input is refused with the byte offset (msgpack) or line (JSON) of the first bad
object: every decoding error of msgspec/msgpack (depth, opcodes, types, integer range,
invalid UTF-8) becomes an `InputError`, never a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, ClassVar, Literal, Protocol

import msgspec

from .. import limits
from ..errors import InputError, Problem, UsageError
from ..limits import DuplicateKey, refuse_duplicate_keys

Hash = int | bytes  # vLLM's ExternalBlockHash; SGLang's int
JsonHash = int | str
MAX_SEQ = 2**63 - 1
ENGINES = ("auto", "vllm", "sglang")
Engine = Literal["auto", "vllm", "sglang"]


_NIL = msgspec.Raw(b"\xc0")


# -- the common event classes (map layout: vLLM 0.32's field names) ------------------------
class Stored(msgspec.Struct, tag_field="type", tag="BlockStored", gc=False):
    kind: ClassVar[str] = "stored"
    hashes: list[Hash] = msgspec.field(name="block_hashes", default_factory=list)
    parent: Hash | None = msgspec.field(name="parent_block_hash", default=None)
    medium: str | None = None
    group: int | None = msgspec.field(name="group_idx", default=None)
    locality: str | None = None
    ownership: str | None = None
    window: int | None = None
    # read past, not decoded: what the checks do not use (Raw is a view of the bytes)
    token_ids: msgspec.Raw = _NIL
    block_size: msgspec.Raw = _NIL
    lora_id: msgspec.Raw = _NIL
    lora_name: msgspec.Raw = _NIL
    extra_keys: msgspec.Raw = _NIL


class Removed(msgspec.Struct, tag_field="type", tag="BlockRemoved", gc=False):
    kind: ClassVar[str] = "removed"
    hashes: list[Hash] = msgspec.field(name="block_hashes", default_factory=list)
    medium: str | None = None
    group: int | None = msgspec.field(name="group_idx", default=None)
    locality: str | None = None
    ownership: str | None = None
    window: int | None = None
    parent: ClassVar[None] = None


class _Unscoped(msgspec.Struct, gc=False):
    """An event without a block's scope: what the checker reads of one is None."""

    parent: ClassVar[None] = None
    medium: ClassVar[None] = None
    group: ClassVar[None] = None
    locality: ClassVar[None] = None
    ownership: ClassVar[None] = None


class Cleared(_Unscoped, tag_field="type", tag="AllBlocksCleared"):
    kind: ClassVar[str] = "cleared"
    hashes: ClassVar[list[Any]] = []
    window: ClassVar[None] = None


class Updated(_Unscoped):
    """TensorRT-LLM's `updated` (a stored block's cache level or priority changed)."""

    kind: ClassVar[str] = "updated"
    hashes: list[Any]
    window: int | None = None


class Created(_Unscoped):
    """TensorRT-LLM's `created` (a cache came up: nothing is stored in it yet)."""

    kind: ClassVar[str] = "created"
    window: int | None = None
    hashes: ClassVar[list[Any]] = []


Event = Stored | Removed | Cleared | Updated | Created


# -- array layouts: each engine's own field order --------------------------------------------
class _VStored(msgspec.Struct, tag="BlockStored", array_like=True, gc=False):
    hashes: list[Hash]
    parent: Hash | None = None
    token_ids: msgspec.Raw = msgspec.Raw(b"\xc0")
    block_size: msgspec.Raw = msgspec.Raw(b"\xc0")
    lora_id: msgspec.Raw = msgspec.Raw(b"\xc0")
    medium: str | None = None
    lora_name: msgspec.Raw = msgspec.Raw(b"\xc0")
    extra_keys: msgspec.Raw = msgspec.Raw(b"\xc0")
    group: int | None = None
    spec_kind: msgspec.Raw = msgspec.Raw(b"\xc0")
    spec_window: msgspec.Raw = msgspec.Raw(b"\xc0")
    locality: str | None = None
    ownership: str | None = None


class _VRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True, gc=False):
    hashes: list[Hash]
    medium: str | None = None
    group: int | None = None
    locality: str | None = None
    ownership: str | None = None


class _Cleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True, gc=False):
    pass


class _SStored(msgspec.Struct, tag="BlockStored", array_like=True, gc=False):
    hashes: list[Hash]
    parent: Hash | None = None
    token_ids: msgspec.Raw = msgspec.Raw(b"\xc0")
    block_size: msgspec.Raw = msgspec.Raw(b"\xc0")
    lora_id: msgspec.Raw = msgspec.Raw(b"\xc0")
    medium: str | None = None


class _SRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True, gc=False):
    hashes: list[Hash]
    medium: str | None = None


class _MapBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Stored | Removed | Cleared]
    rank: int | None = None


class _VBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_VStored | _VRemoved | _Cleared]
    rank: int | None = None


class _SBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_SStored | _SRemoved | _Cleared]
    rank: int | None = None


_MAP_BATCH = msgspec.msgpack.Decoder(_MapBatch)
_ARRAY_BATCH: dict[str, msgspec.msgpack.Decoder[Any]] = {
    "vllm": msgspec.msgpack.Decoder(_VBatch),
    "sglang": msgspec.msgpack.Decoder(_SBatch),
}
# a batch may also be a map {"ts", "events", "data_parallel_rank"} (vLLM-shaped JSON, tests)
_ANY = msgspec.msgpack.Decoder()


def _from_array(e: Any) -> Event:
    if isinstance(e, _Cleared):
        return Cleared()
    if isinstance(e, _VStored | _SStored):
        return Stored(
            e.hashes,
            e.parent,
            e.medium,
            getattr(e, "group", None),
            getattr(e, "locality", None),
            getattr(e, "ownership", None),
        )
    return Removed(
        e.hashes,
        e.medium,
        getattr(e, "group", None),
        getattr(e, "locality", None),
        getattr(e, "ownership", None),
    )


class Reader(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


@dataclass(slots=True)
class Batch:
    """One published batch (or one JSON event): what a sequence number numbers."""

    stream: str  # the publisher's data-parallel rank / worker, within its source
    seq: int | None
    ts: float | None
    where: str  # file@byte, file:line, or endpoint#seq
    events: list[Any]  # Stored | Removed | Cleared | Updated | Created


class _Bad(Exception):
    pass


# the map decoder meeting an event in the array layout (the other decoder's business)
_AN_ARRAY_EVENT = re.compile(r"Expected `object`, got `array` - at `\$\[1\]\[\d+\]`")


class PayloadDecoder:
    """Decode one msgpack `KVEventBatch` payload, remembering which layout the stream uses."""

    def __init__(self, engine: Engine = "auto") -> None:
        self.engine = engine
        self.layout: str | None = "array" if engine == "sglang" else None

    def decode(self, payload: bytes | memoryview) -> tuple[float | None, list[Any], int | None]:
        order = "sglang" if self.engine == "sglang" else "vllm"
        try:
            if self.layout != "array":
                try:
                    b = _MAP_BATCH.decode(payload)
                    self.layout = "map"
                    return b.ts, b.events, b.rank
                except msgspec.ValidationError as e:
                    if self.layout == "map" or not _AN_ARRAY_EVENT.fullmatch(str(e)):
                        raise
            a = _ARRAY_BATCH[order].decode(payload)
            self.layout = "array"
            return a.ts, [_from_array(e) for e in a.events], a.rank
        except msgspec.ValidationError as e:
            if str(e) == "Expected `array`, got `object`":  # the batch itself is a map
                return self._map_batch(payload)
            raise _Bad(f"not a KVEventBatch: {e}") from None
        except (msgspec.DecodeError, RecursionError, ValueError) as e:
            raise _Bad(f"not msgpack: {e}") from None

    def _map_batch(
        self, payload: bytes | memoryview
    ) -> tuple[float | None, list[Event], int | None]:
        obj = _ANY.decode(payload)
        if not isinstance(obj, dict):
            raise _Bad("not a KVEventBatch ([ts, events, dp_rank] or {ts, events})")
        try:  # as the array a vLLM batch is (Raw fields are read from bytes, not objects)
            array = [obj.get("ts", 0.0), obj.get("events"), obj.get("data_parallel_rank")]
            b = _MAP_BATCH.decode(msgspec.msgpack.encode(array))
        except msgspec.ValidationError as e:
            raise _Bad(f"not a KVEventBatch: {e}") from None
        return b.ts, list(b.events), b.rank


def seq_number(raw: Any) -> int:
    """A sequence-number frame: 8 big-endian bytes (vLLM, SGLang) or an integer."""
    if isinstance(raw, bytes | bytearray | memoryview):
        if len(raw) != 8:
            raise _Bad(f"a sequence number is 8 bytes, not {len(raw)}")
        return int.from_bytes(raw, "big", signed=True)
    if isinstance(raw, int) and not isinstance(raw, bool) and -(2**63) <= raw <= MAX_SEQ:
        return raw
    raise _Bad("a sequence number is 8 big-endian bytes or a 64-bit integer")


# -- msgpack files and streams ----------------------------------------------------------------
_FRAME = msgspec.msgpack.Decoder(list[msgspec.Raw])
CHUNK = 1 << 20
MAX_DOCUMENT = 2 * limits.MAX_LINE_BYTES  # one JSON array of events (TensorRT-LLM's list)


def msgpack_batches(
    stream: IO[bytes] | Reader, source: str, engine: Engine = "auto"
) -> Iterator[Batch]:
    """Batches of a msgpack file or pipe: objects framed by `msgpack.Unpacker`."""
    try:
        import msgpack
    except ImportError:
        raise UsageError(
            "reading msgpack KV events needs msgpack", hint="pip install 'pagedkv-sql[live]'"
        ) from None
    payloads = PayloadDecoder(engine)
    unpacker = msgpack.Unpacker(max_buffer_size=1 << 31)
    buf = bytearray()
    base = 0  # stream offset of buf[0]
    start = 0  # offset of the next object in buf
    while True:
        chunk = stream.read(CHUNK)
        if chunk:
            unpacker.feed(chunk)
            buf += chunk
        while True:
            try:
                unpacker.skip()
            except msgpack.OutOfData:
                break
            except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
                if isinstance(e, msgpack.StackError):
                    why = "not msgpack: nested too deeply"
                elif isinstance(e, msgpack.FormatError):
                    why = f"not msgpack: byte 0x{buf[start]:02x} starts no msgpack object"
                else:
                    why = f"not msgpack: {e}"
                raise _refuse(source, base + start, why) from None
            end = unpacker.tell() - base
            offset = base + start
            yield from _object(bytes(buf[start:end]), source, offset, payloads)
            start = end
        if start:
            del buf[:start]
            base += start
            start = 0
        if not chunk:
            if buf:
                raise _refuse(source, base, "truncated msgpack object at the end of the stream")
            return


def _object(obj: bytes, source: str, offset: int, payloads: PayloadDecoder) -> Iterator[Batch]:
    where = f"{source}@{offset}"
    try:
        head = obj[0]
        seq: int | None = None
        payload: bytes | memoryview = obj
        # a ZMQ frame [topic?, seq, payload]? (a batch starts [ts (a float), events, ...])
        if (0x91 <= head <= 0x9F or head == 0xDC) and obj[1 if head != 0xDC else 3] not in (
            0xCA,
            0xCB,
        ):
            try:
                parts = _FRAME.decode(obj)
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
                raise _Bad(f"not msgpack: {e}") from None
            if len(parts) in (2, 3) and bytes(parts[-1])[:1] in (b"\xc4", b"\xc5", b"\xc6"):
                seq = seq_number(_ANY.decode(parts[-2]))
                payload = _ANY.decode(parts[-1])
            elif parts and all(bytes(p)[:1] in _BATCH_HEADS for p in parts):
                # a file holding one array of batches
                out = [payloads.decode(p) for p in parts]
                for ts, events, rank in out:
                    yield Batch(f"dp {rank or 0}", None, ts, where, events)
                return
        ts, events, rank = payloads.decode(payload)
    except _Bad as e:
        raise _refuse(source, offset, str(e)) from None
    yield Batch(f"dp {rank or 0}", seq, ts, where, events)


# the first byte of a batch: an array (fixarray of 2-3, array 16) or a map (fixmap, map 16)
_BATCH_HEADS = {b"\x92", b"\x93", b"\xdc", b"\xde", *(bytes([b]) for b in range(0x81, 0x90))}


def _refuse(source: str, offset: int, message: str) -> InputError:
    return InputError(
        f"{source}: not a stream of KV event batches (byte {offset})",
        [Problem(source, None, None, f"byte {offset}: {message}")],
        hint="the accepted layouts are in docs/replay.md (Prefix-cache events)",
    )


# -- JSON (TensorRT-LLM, Dynamo, vLLM-shaped) --------------------------------------------------
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
    window_size: int | None = None
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
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class _JRemoved(msgspec.Struct, tag_field="type", tag="BlockRemoved", gc=False):
    block_hashes: list[JsonHash]
    medium: str | None = None
    group_idx: int | None = None
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


def json_value(text: bytes) -> Any:
    """A JSON text of KV events, read by msgspec and strictly: a key named twice in one
    object (msgspec, like every JSON reader, keeps the last: an event dropped) is _Bad."""
    obj = _JSON_ANY.decode(text)
    try:
        refuse_duplicate_keys(text, _JSON_OUT.encode(obj))
    except DuplicateKey as e:
        raise _Bad(
            f"duplicate key '{e}' in one object (JSON would keep only the last one)"
        ) from None
    return obj


def _vllm_json(e: _JStored | _JRemoved | _JCleared) -> Event:
    if isinstance(e, _JCleared):
        return Cleared()
    if isinstance(e, _JStored):
        return _stored(
            list(e.block_hashes),
            e.parent_block_hash,
            e.medium,
            e.group_idx,
            e.locality,
            e.ownership,
        )
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
    """One JSON object (already parsed, untyped) as a batch; `_Bad` if it is none."""
    if not isinstance(obj, dict):
        raise _Bad("not a KV event (a JSON object)")
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
        raise _Bad(str(e)) from None
    raise _Bad(
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
            raise _Bad("an updated event names its block_hash")
        event = Updated([d.block_hash], window)
    elif d.type == "created":
        event = Created(window)
    else:
        raise _Bad(f"data.type {d.type!r} is not stored, removed, created or updated")
    _check_seq(ev.event_id)
    return Batch(f"dp {ev.attention_dp_rank or 0}", ev.event_id, None, where, [event])


def _dynamo(obj: dict[str, Any], where: str) -> Batch:
    worker = None
    ev: Any = obj
    while isinstance(ev, dict) and "event_id" not in ev and isinstance(ev.get("event"), dict):
        worker = ev.get("worker_id", worker)
        ev = ev["event"]
    if worker is not None and (not isinstance(worker, int | str) or isinstance(worker, bool)):
        raise _Bad("worker_id must be an integer or a string")
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
        raise _Bad("data must be stored, removed or cleared")
    stream = (f"worker {worker}" if worker is not None else "worker") + f" dp {d.dp_rank or 0}"
    return Batch(stream, d.event_id, None, where, [event])


def _check_seq(n: int) -> None:
    if not -(2**63) <= n <= MAX_SEQ:
        raise _Bad(f"event_id {n} is out of the 64-bit range")


def json_batches(stream: IO[bytes] | Reader, source: str) -> Iterator[Batch]:
    """Batches of JSON Lines, or of one JSON array of events (TensorRT-LLM's list)."""
    first = stream.read(CHUNK)
    head = first.lstrip()[:1]
    if head == b"[":  # one JSON document: an array of event objects
        data = first + stream.read(MAX_DOCUMENT)
        if stream.read(1):  # `(echo [; cat /dev/zero)` was read until memory ran out
            raise InputError(
                f"{source}: a JSON array of KV events longer than {MAX_DOCUMENT:,} bytes",
                hint="write long streams as JSON Lines (one event a line)",
            )
        try:
            items = json_value(data)
        except (msgspec.DecodeError, RecursionError, ValueError, _Bad) as e:
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
            except (_Bad, ValueError) as e:
                problems.append(Problem(source, None, None, f"item {i}: {e}"))
        _raise_lines(source, problems)
        yield from out
        return
    yield from _json_lines(_lines(first, stream, source), source)


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
        except _Bad as e:
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
            hint="the accepted layouts are in docs/replay.md (Prefix-cache events)",
        )


def batches(stream: IO[bytes] | Reader, source: str, engine: Engine = "auto") -> Iterator[Batch]:
    """Every batch of a recorded stream, JSON or msgpack by its first byte (not its name)."""
    peek = _Peek(stream)
    head = peek.first_byte()
    if head in b"{[":  # a msgpack stream never starts with a positive fixint '{' or '['
        return json_batches(peek, source)
    return msgpack_batches(peek, source, engine)


class _Peek:
    """A stream with its first non-blank bytes read ahead and given back."""

    def __init__(self, stream: IO[bytes] | Reader) -> None:
        self._stream = stream
        self._ahead = b""

    def first_byte(self) -> bytes:
        while True:
            chunk = self._stream.read(CHUNK)
            self._ahead += chunk
            stripped = self._ahead.lstrip()
            if stripped or not chunk:
                return stripped[:1]

    def read(self, n: int = -1) -> bytes:
        if self._ahead:
            out, self._ahead = self._ahead, b""
            if n is None or n < 0:
                return out + self._stream.read()
            return out
        return self._stream.read(n)
