"""Decoding KV-cache event streams into batches of typed events.

Every engine's layout is decoded by msgspec straight into event classes that say the same
attributes the checker and the store read (`kind`, `hashes`, `parent` and the scope): the
map layout and JSON into `Stored`, `Removed`, `Cleared`, `Updated`, `Created`, each array
layout into classes of its own field order:

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

The event classes are live/events.py's, the JSON layouts live/decode_json.py's; this module
decodes msgpack and is where importers find them all.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import IO, Any, ClassVar, Literal

import msgspec

from .. import faces, limits
from ..errors import InputError, Problem, UsageError
from .decode_json import json_batch, json_batches, json_value
from .events import (
    CHUNK,
    MAX_SEQ,
    Batch,
    Cleared,
    Created,
    Event,
    Hash,
    Int64,
    JsonHash,
    Malformed,
    Reader,
    Removed,
    Stored,
    Updated,
)

# the event classes live in events.py, JSON in decode_json.py; importers keep this path
__all__ = [
    "CHUNK",
    "ENGINES",
    "MAX_SEQ",
    "Batch",
    "Cleared",
    "Created",
    "Engine",
    "Event",
    "Hash",
    "JsonHash",
    "PayloadDecoder",
    "Reader",
    "Removed",
    "Stored",
    "Updated",
    "batches",
    "json_batch",
    "json_batches",
    "json_value",
    "msgpack_batches",
    "seq_number",
]

ENGINES = ("auto", *faces.EVENT_LAYOUTS)  # `auto`, or the engines whose layout is their own
Engine = Literal["auto", "vllm", "sglang"]


# -- array layouts: each engine's own field order --------------------------------------------
# Decoded straight into what the checker and the store read (the attributes of live/events.py's
# classes: `kind`, `hashes`, `parent` and the scope; what a layout lacks is None on its
# class), never converted event by event: converting cost more than decoding.
class _VStored(msgspec.Struct, tag="BlockStored", array_like=True, gc=False):
    kind: ClassVar[str] = "stored"
    window: ClassVar[None] = None
    hashes: list[Hash]
    parent: Hash | None = None
    token_ids: msgspec.Raw = msgspec.Raw(b"\xc0")
    block_size: msgspec.Raw = msgspec.Raw(b"\xc0")
    lora_id: msgspec.Raw = msgspec.Raw(b"\xc0")
    medium: str | None = None
    lora_name: msgspec.Raw = msgspec.Raw(b"\xc0")
    extra_keys: msgspec.Raw = msgspec.Raw(b"\xc0")
    group: Int64 | None = None
    spec_kind: str | None = None
    spec_window: Int64 | None = None
    locality: str | None = None
    ownership: str | None = None


class _VRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True, gc=False):
    kind: ClassVar[str] = "removed"
    parent: ClassVar[None] = None
    window: ClassVar[None] = None
    spec_kind: ClassVar[None] = None
    spec_window: ClassVar[None] = None
    hashes: list[Hash]
    medium: str | None = None
    group: Int64 | None = None
    locality: str | None = None
    ownership: str | None = None


class _Cleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True, gc=False):
    kind: ClassVar[str] = "cleared"
    hashes: ClassVar[list[Any]] = []
    parent: ClassVar[None] = None
    medium: ClassVar[None] = None
    group: ClassVar[None] = None
    locality: ClassVar[None] = None
    ownership: ClassVar[None] = None
    window: ClassVar[None] = None
    spec_kind: ClassVar[None] = None
    spec_window: ClassVar[None] = None


class _SStored(msgspec.Struct, tag="BlockStored", array_like=True, gc=False):
    kind: ClassVar[str] = "stored"
    group: ClassVar[None] = None
    locality: ClassVar[None] = None
    ownership: ClassVar[None] = None
    window: ClassVar[None] = None
    spec_kind: ClassVar[None] = None
    spec_window: ClassVar[None] = None
    hashes: list[Hash]
    parent: Hash | None = None
    token_ids: msgspec.Raw = msgspec.Raw(b"\xc0")
    block_size: msgspec.Raw = msgspec.Raw(b"\xc0")
    lora_id: msgspec.Raw = msgspec.Raw(b"\xc0")
    medium: str | None = None


class _SRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True, gc=False):
    kind: ClassVar[str] = "removed"
    parent: ClassVar[None] = None
    group: ClassVar[None] = None
    locality: ClassVar[None] = None
    ownership: ClassVar[None] = None
    window: ClassVar[None] = None
    spec_kind: ClassVar[None] = None
    spec_window: ClassVar[None] = None
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


# the map decoder meeting an event in the array layout (the other decoder's business)
_AN_ARRAY_EVENT = re.compile(r"Expected `object`, got `array` - at `\$\[1\]\[\d+\]`")


class PayloadDecoder:
    """Decode one msgpack `KVEventBatch` payload, remembering which layout the stream uses."""

    def __init__(self, engine: Engine = "auto") -> None:
        self.engine = engine
        self.layout: str | None = "array" if engine == "sglang" else None

    def decode(
        self, payload: bytes | bytearray | memoryview
    ) -> tuple[float | None, list[Any], int | None]:
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
            return a.ts, a.events, a.rank
        except msgspec.ValidationError as e:
            if str(e) == "Expected `array`, got `object`":  # the batch itself is a map
                return self._map_batch(payload)
            raise Malformed(f"not a KVEventBatch: {e}") from None
        except (msgspec.DecodeError, RecursionError, ValueError) as e:
            raise Malformed(f"not msgpack: {e}") from None

    def _map_batch(
        self, payload: bytes | bytearray | memoryview
    ) -> tuple[float | None, list[Event], int | None]:
        obj = _ANY.decode(payload)
        if not isinstance(obj, dict):
            raise Malformed("not a KVEventBatch ([ts, events, dp_rank] or {ts, events})")
        try:  # as the array a vLLM batch is (Raw fields are read from bytes, not objects)
            array = [obj.get("ts", 0.0), obj.get("events"), obj.get("data_parallel_rank")]
            b = _MAP_BATCH.decode(msgspec.msgpack.encode(array))
        except msgspec.ValidationError as e:
            raise Malformed(f"not a KVEventBatch: {e}") from None
        return b.ts, list(b.events), b.rank


def seq_number(raw: Any) -> int:
    """A sequence-number frame: 8 big-endian bytes (vLLM, SGLang) or an integer."""
    if isinstance(raw, bytes | bytearray | memoryview):
        if len(raw) != 8:
            raise Malformed(f"a sequence number is 8 bytes, not {len(raw)}")
        return int.from_bytes(raw, "big", signed=True)
    if isinstance(raw, int) and not isinstance(raw, bool) and -(2**63) <= raw <= MAX_SEQ:
        return raw
    raise Malformed("a sequence number is 8 big-endian bytes or a 64-bit integer")


# -- msgpack files and streams ----------------------------------------------------------------
_FRAME = msgspec.msgpack.Decoder(list[msgspec.Raw])


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
    array = _ARRAY_BATCH["sglang" if engine == "sglang" else "vllm"]
    streams: dict[int | None, str] = {}  # rank -> its stream's name, made once
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
            obj = buf[start:end]
            start = end
            # a stream of batches [ts, events, rank?] in the layout it began with (the files
            # an engine writes): decoded here; anything else, or any error, goes the whole
            # way (_object) from the start
            layout = payloads.layout
            if layout is not None and obj[0] in _ARRAY_2_3 and obj[1] in _FLOAT:
                try:
                    b = (_MAP_BATCH if layout == "map" else array).decode(obj)
                except (msgspec.MsgspecError, RecursionError, ValueError):
                    pass  # said by _object, as any other stream's error
                else:
                    stream_name = streams.get(b.rank)
                    if stream_name is None:
                        stream_name = streams[b.rank] = f"dp {b.rank or 0}"
                    yield Batch(stream_name, None, b.ts, f"{source}@{offset}", b.events)
                    continue
            yield from _object(obj, source, offset, payloads)
        if start:
            del buf[:start]
            base += start
            start = 0
        if not chunk:
            if buf:
                raise _refuse(source, base, "truncated msgpack object at the end of the stream")
            return


def _object(
    obj: bytearray, source: str, offset: int, payloads: PayloadDecoder
) -> tuple[Batch, ...]:
    """The batches of one msgpack object (a slice of the stream's buffer, copied once)."""
    where = f"{source}@{offset}"
    try:
        head = obj[0]
        seq: int | None = None
        payload: bytes | bytearray | memoryview = obj
        # a ZMQ frame [topic?, seq, payload]? (a batch starts [ts (a float), events, ...])
        if (0x91 <= head <= 0x9F or head == 0xDC) and obj[1 if head != 0xDC else 3] not in (
            0xCA,
            0xCB,
        ):
            try:
                parts = _FRAME.decode(obj)
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
                raise Malformed(f"not msgpack: {e}") from None
            if len(parts) in (2, 3) and bytes(parts[-1])[:1] in (b"\xc4", b"\xc5", b"\xc6"):
                seq = seq_number(_ANY.decode(parts[-2]))
                payload = _ANY.decode(parts[-1])
            elif parts and all(bytes(p)[:1] in _BATCH_HEADS for p in parts):
                # a file holding one array of batches
                out = [payloads.decode(p) for p in parts]
                return tuple(
                    Batch(f"dp {rank or 0}", None, ts, where, events) for ts, events, rank in out
                )
        ts, events, rank = payloads.decode(payload)
    except Malformed as e:
        raise _refuse(source, offset, str(e)) from None
    return (Batch(f"dp {rank or 0}", seq, ts, where, events),)


_ARRAY_2_3 = (0x92, 0x93)  # fixarray of 2 or 3
_FLOAT = (0xCA, 0xCB)  # float 32, float 64


# the first byte of a batch: an array (fixarray of 2-3, array 16) or a map (fixmap, map 16)
_BATCH_HEADS = {b"\x92", b"\x93", b"\xdc", b"\xde", *(bytes([b]) for b in range(0x81, 0x90))}


def _refuse(source: str, offset: int, message: str) -> InputError:
    return InputError(
        f"{source}: not a stream of KV event batches (byte {offset})",
        [Problem(source, None, None, f"byte {offset}: {message}")],
        hint="the accepted layouts: 'Prefix-cache events' in https://github.com/pagedkv-sql/pagedkv-sql/blob/main/docs/replay.md",
    )


def batches(stream: IO[bytes] | Reader, source: str, engine: Engine = "auto") -> Iterator[Batch]:
    """Every batch of a recorded stream, JSON or msgpack by its first byte (not its name)."""
    peek = _Peek(stream)
    head = peek.first_byte(source)
    if head in b"{[":  # a msgpack stream never starts with a positive fixint '{' or '['
        return json_batches(peek, source)
    return msgpack_batches(peek, source, engine)


class _Peek:
    """A stream with its first non-blank bytes read ahead and given back."""

    def __init__(self, stream: IO[bytes] | Reader) -> None:
        self._stream = stream
        self._ahead = b""

    def first_byte(self, source: str) -> bytes:
        """The first non-blank byte (b"" for none), reading ahead no more blank bytes than
        one line may hold: `yes '' | kv-events -` grew without bound."""
        pieces: list[bytes] = []
        held = 0
        while True:
            chunk = self._stream.read(CHUNK)
            pieces.append(chunk)
            held += len(chunk)
            if chunk.strip() or not chunk:
                self._ahead = b"".join(pieces)
                return self._ahead.lstrip()[:1]
            if held > limits.MAX_LINE_BYTES:
                raise InputError(
                    f"{source}: more than {limits.MAX_LINE_BYTES:,} blank bytes and no event",
                    hint="a KV event stream starts with its first event (JSON or msgpack)",
                )

    def read(self, n: int = -1) -> bytes:
        if self._ahead:
            out, self._ahead = self._ahead, b""
            if n is None or n < 0:
                return out + self._stream.read()
            return out
        return self._stream.read(n)
