"""Prefix-cache events: read a recorded stream of vLLM / SGLang KV-cache events (msgpack
``EventBatch`` of ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``) or NVIDIA
Dynamo's JSON Lines of the same events, and check it.

Layouts accepted (docs/replay.md, "Prefix-cache events"):
- msgpack, decoded with msgspec (the ``events`` extra): a file of one or more msgpack
  objects back to back, each an ``EventBatch`` — an array ``[ts, events, dp_rank?]`` (the
  tagged-array layout, ``array_like=True``) or a map ``{"ts", "events", ...}`` — or a
  frame ``[seq, batch]`` / ``[topic, seq, batch]`` as a ZMQ subscriber receives it (seq an
  integer or 8 big-endian bytes, batch the encoded bytes). An event is an array whose first
  item is its tag (``["BlockStored", block_hashes, parent_block_hash, token_ids,
  block_size, lora_id, medium?, ...]``) or a map with ``"type"``.
- JSON Lines: Dynamo's ``RouterEvent`` (``{"worker_id", "event": {"event_id", "data":
  {"stored": {"parent_hash", "blocks": [{"block_hash"}]}} | {"removed": {"block_hashes"}}
  | "cleared", "dp_rank"}}``, optionally wrapped in ``{"timestamp", "event"}``), or
  vLLM-shaped objects (``{"type": "BlockStored", ...}``, or a batch ``{"ts", "events"}``).

Checks: removal of an unknown hash, a stored block whose parent hash is unknown, gaps (and
steps back) in sequence numbers, and events after ``AllBlocksCleared`` that name a hash
from before it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, Problem, UsageError

KINDS = {"BlockStored": "stored", "BlockRemoved": "removed", "AllBlocksCleared": "cleared"}
CHECKS = {
    "unknown_removal": "a BlockRemoved names a hash that is not stored",
    "unknown_parent": "a BlockStored's parent hash is not stored",
    "sequence_gap": "sequence numbers of a stream skip or step back",
    "after_clear": "an event after AllBlocksCleared names a hash stored before it",
}


@dataclass(frozen=True)
class KVEvent:
    position: int  # 0-based, in the order read
    where: str  # file:line (JSON Lines) or file@byte offset (msgpack)
    stream: str  # worker / data-parallel rank the sequence numbers belong to
    seq: int | None
    kind: str  # stored, removed, cleared
    hashes: tuple[Any, ...]
    parent: Any
    medium: str | None
    group: int | None


@dataclass(frozen=True)
class KVFinding:
    check: str
    position: int
    where: str
    stream: str
    seq: int | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class KVReport:
    events: int
    stored: int
    removed: int
    cleared: int
    findings: list[KVFinding]

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["findings"] = [f.to_dict() for f in self.findings]
        return d


class _Bad(Exception):
    pass


def _show(h: Any) -> str:
    return h.hex() if isinstance(h, bytes | bytearray) else str(h)


def _key(h: Any) -> Any:
    return bytes(h) if isinstance(h, bytearray) else h


# -- msgpack -----------------------------------------------------------------------------
def _skip(buf: bytes, i: int) -> int:
    """The offset just past the msgpack object starting at ``i`` (framing only)."""
    b = buf[i]
    if b <= 0x7F or b >= 0xE0 or b in (0xC0, 0xC2, 0xC3):
        return i + 1
    if 0x80 <= b <= 0x8F:
        return _skip_n(buf, i + 1, 2 * (b & 0x0F))
    if 0x90 <= b <= 0x9F:
        return _skip_n(buf, i + 1, b & 0x0F)
    if 0xA0 <= b <= 0xBF:
        return i + 1 + (b & 0x1F)
    fixed = {
        0xCC: 1,
        0xCD: 2,
        0xCE: 4,
        0xCF: 8,
        0xD0: 1,
        0xD1: 2,
        0xD2: 4,
        0xD3: 8,
        0xCA: 4,
        0xCB: 8,
        0xD4: 2,
        0xD5: 3,
        0xD6: 5,
        0xD7: 9,
        0xD8: 17,
    }
    if b in fixed:
        return i + 1 + fixed[b]
    sized = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC7: 1, 0xC8: 2, 0xC9: 4}
    if b in sized:
        width = sized[b]
        n = int.from_bytes(buf[i + 1 : i + 1 + width], "big")
        extra = 1 if b in (0xC7, 0xC8, 0xC9) else 0  # ext: a type byte
        return i + 1 + width + extra + n
    if b in (0xDC, 0xDD, 0xDE, 0xDF):
        width = 2 if b in (0xDC, 0xDE) else 4
        n = int.from_bytes(buf[i + 1 : i + 1 + width], "big")
        return _skip_n(buf, i + 1 + width, n * (2 if b >= 0xDE else 1))
    raise _Bad(f"byte 0x{b:02x} does not start a msgpack object")


def _skip_n(buf: bytes, i: int, n: int) -> int:
    for _ in range(n):
        if i >= len(buf):
            raise _Bad("truncated msgpack object")
        i = _skip(buf, i)
    return i


def _msgpack_objects(buf: bytes, source: str) -> Iterator[tuple[int, Any]]:
    try:
        import msgspec
    except ImportError:
        raise UsageError(
            "reading msgpack KV events needs msgspec",
            hint="pip install 'pagedkv-sql[events]' (or pip install msgspec)",
        ) from None
    i = 0
    while i < len(buf):
        try:
            end = _skip(buf, i)
            if end > len(buf):
                raise _Bad("truncated msgpack object")
            yield i, msgspec.msgpack.decode(buf[i:end])
        except (_Bad, IndexError, msgspec.DecodeError) as e:
            raise InputError(
                f"{source}: not a msgpack stream of KV events",
                [Problem(source, None, None, f"byte {i}: {e}")],
            ) from None
        i = end


def _unframe(obj: Any) -> tuple[int | None, Any]:
    """A ZMQ-style frame [seq, payload] / [topic, seq, payload] -> (seq, batch object)."""
    if isinstance(obj, list) and len(obj) in (2, 3) and isinstance(obj[-1], bytes):
        seq = obj[-2]
        if isinstance(seq, bytes):
            seq = int.from_bytes(seq, "big", signed=True)
        if isinstance(seq, int):
            import msgspec

            return seq, msgspec.msgpack.decode(obj[-1])
    return None, obj


# -- one batch or event, either layout -----------------------------------------------------
def _batch(obj: Any) -> tuple[list[Any], int | None]:
    """(events, data_parallel_rank) of an EventBatch in the array or the map layout."""
    if isinstance(obj, list) and len(obj) >= 2 and isinstance(obj[1], list):
        rank = obj[2] if len(obj) > 2 and isinstance(obj[2], int) else None
        return obj[1], rank
    if isinstance(obj, dict) and isinstance(obj.get("events"), list):
        rank = obj.get("data_parallel_rank")
        return obj["events"], rank if isinstance(rank, int) else None
    raise _Bad("not an EventBatch ([ts, events, dp_rank] or {ts, events})")


_FIELDS = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}


def _vllm_event(obj: Any) -> dict[str, Any]:
    """A vLLM event (tagged array or map with 'type') as a dict of its fields."""
    if isinstance(obj, list) and obj and isinstance(obj[0], str):
        tag, values = obj[0], obj[1:]
        if tag not in _FIELDS:
            raise _Bad(f"unknown event tag {tag!r}")
        return {"type": tag, **dict(zip(_FIELDS[tag], values, strict=False))}
    if isinstance(obj, dict) and isinstance(obj.get("type"), str):
        if obj["type"] not in _FIELDS:
            raise _Bad(f"unknown event type {obj['type']!r}")
        return obj
    raise _Bad("not a KV cache event (a tagged array or a map with 'type')")


def _hashes(value: Any, what: str) -> tuple[Any, ...]:
    if not isinstance(value, list):
        raise _Bad(f"{what} must be a list of hashes")
    for h in value:
        if not isinstance(h, int | bytes | str) or isinstance(h, bool):
            raise _Bad(f"{what}: {h!r} is not a hash")
    return tuple(_key(h) for h in value)


def _from_vllm(e: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    kind = KINDS[e["type"]]
    if kind == "cleared":
        return {**base, "kind": kind, "hashes": (), "parent": None}
    group = e.get("group_idx")
    medium = e.get("medium")
    return {
        **base,
        "kind": kind,
        "hashes": _hashes(e.get("block_hashes"), "block_hashes"),
        "parent": _key(e.get("parent_block_hash")),
        "medium": medium if isinstance(medium, str) else None,
        "group": group if isinstance(group, int) else None,
    }


def _from_dynamo(obj: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    ev = obj
    worker = None
    while isinstance(ev, dict) and "event_id" not in ev and isinstance(ev.get("event"), dict):
        worker = ev.get("worker_id", worker)
        ev = ev["event"]
    if not isinstance(ev, dict) or "data" not in ev:
        raise _Bad("not a Dynamo KV event (event_id, data)")
    seq = ev.get("event_id")
    stream = f"worker {worker}" if worker is not None else "worker"
    stream += f" dp {ev.get('dp_rank', 0)}"
    base = {**base, "seq": seq if isinstance(seq, int) else None, "stream": stream}
    data = ev["data"]
    if data == "cleared" or (isinstance(data, dict) and "cleared" in data):
        return {**base, "kind": "cleared", "hashes": (), "parent": None}
    if isinstance(data, dict) and isinstance(data.get("stored"), dict):
        blocks = data["stored"].get("blocks")
        if not isinstance(blocks, list):
            raise _Bad("stored.blocks must be a list")
        hashes = [b.get("block_hash") if isinstance(b, dict) else b for b in blocks]
        return {
            **base,
            "kind": "stored",
            "hashes": _hashes(hashes, "stored.blocks"),
            "parent": _key(data["stored"].get("parent_hash")),
        }
    if isinstance(data, dict) and isinstance(data.get("removed"), dict):
        return {
            **base,
            "kind": "removed",
            "parent": None,
            "hashes": _hashes(data["removed"].get("block_hashes"), "removed.block_hashes"),
        }
    raise _Bad("data must be stored, removed or cleared")


# -- reading ---------------------------------------------------------------------------------
def read_kv_events(path: str | os.PathLike[str]) -> list[KVEvent]:
    """Every event of a recorded stream, in order; an unreadable file is refused whole."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"no KV event file at {p}")
    data = p.read_bytes()
    head = data.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            return list(_json_events(data, str(p)))
        except _JsonNot:
            pass
    return list(_msgpack_events(data, str(p)))


class _JsonNot(Exception):
    pass


def _json_events(data: bytes, source: str) -> Iterator[KVEvent]:
    out: list[KVEvent] = []
    problems: list[Problem] = []
    position = 0
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            if number == 1:
                raise _JsonNot from None
            problems.append(Problem(source, number, e.colno, f"malformed JSON: {e.msg}"))
            continue
        base = {
            "where": f"{source}:{number}",
            "stream": "stream",
            "seq": None,
            "medium": None,
            "group": None,
        }
        try:
            if isinstance(obj, dict) and ("event" in obj or "data" in obj):
                items = [_from_dynamo(obj, base)]
            elif isinstance(obj, dict) and "events" in obj:
                events, rank = _batch(obj)
                base["stream"] = f"dp {rank or 0}"
                items = [_from_vllm(_vllm_event(e), base) for e in events]
            else:
                items = [_from_vllm(_vllm_event(obj), base)]
        except _Bad as e:
            problems.append(Problem(source, number, None, str(e)))
            continue
        for item in items:
            out.append(KVEvent(position=position, **item))
            position += 1
    if problems:
        raise InputError(
            f"{source}: {len(problems)} line(s) are not KV events; nothing read",
            problems[:100],
            len(problems),
            hint="the accepted layouts are in docs/replay.md",
        )
    yield from out


def _msgpack_events(data: bytes, source: str) -> Iterator[KVEvent]:
    position = 0
    for offset, obj in _msgpack_objects(data, source):
        where = f"{source}@{offset}"
        try:
            seq, batch = _unframe(obj)
            if isinstance(batch, list) and batch and all(_is_batch(b) for b in batch):
                batches = batch  # a file holding one array of batches
            else:
                batches = [batch]
            for b in batches:
                events, rank = _batch(b)
                base = {
                    "where": where,
                    "stream": f"dp {rank or 0}",
                    "seq": seq,
                    "medium": None,
                    "group": None,
                }
                for e in events:
                    yield KVEvent(position=position, **_from_vllm(_vllm_event(e), base))
                    position += 1
        except _Bad as e:
            raise InputError(
                f"{source}: not a stream of KV event batches",
                [Problem(source, None, None, f"byte {offset}: {e}")],
                hint="the accepted layouts are in docs/replay.md",
            ) from None


def _is_batch(obj: Any) -> bool:
    try:
        _batch(obj)
    except _Bad:
        return False
    return not (isinstance(obj, list) and obj and isinstance(obj[0], str))


# -- checking --------------------------------------------------------------------------------
def check_kv_events(events: list[KVEvent]) -> KVReport:
    """Replay the hash-level cache and name every event that does not fit it."""
    findings: list[KVFinding] = []
    stored: dict[tuple[Any, ...], int] = {}  # (stream, medium, group, hash) -> event position
    before_clear: dict[tuple[Any, ...], int] = {}  # hashes dropped by a clear -> clear position
    last_seq: dict[str, int] = {}
    seen_batch: dict[str, tuple[str, int | None]] = {}
    counts = {"stored": 0, "removed": 0, "cleared": 0}

    def found(check: str, e: KVEvent, message: str) -> None:
        findings.append(KVFinding(check, e.position, e.where, e.stream, e.seq, message))

    for e in events:
        counts[e.kind] += 1
        if e.seq is not None and seen_batch.get(e.stream) != (e.where, e.seq):
            # one sequence number per batch: check it once, at the batch's first event
            seen_batch[e.stream] = (e.where, e.seq)
            prev = last_seq.get(e.stream)
            if prev is not None and e.seq != prev + 1:
                what = "skips" if e.seq > prev + 1 else "steps back"
                found(
                    "sequence_gap",
                    e,
                    f"sequence number {e.seq} follows {prev} in {e.stream} "
                    f"({what}: {abs(e.seq - prev - 1) or 1} batch(es) missing or repeated)",
                )
            last_seq[e.stream] = e.seq
        scope = (e.stream, e.medium, e.group)
        if e.kind == "cleared":
            for key in [k for k in stored if k[0] == e.stream]:  # every medium and group
                before_clear[key] = e.position
                del stored[key]
            continue
        if e.kind == "stored":
            parent = e.parent
            if parent is not None and (*scope, parent) not in stored:
                if (*scope, parent) in before_clear:
                    found(
                        "after_clear",
                        e,
                        f"BlockStored names parent {_show(parent)}, stored "
                        f"before AllBlocksCleared (event {before_clear[(*scope, parent)]})",
                    )
                else:
                    found(
                        "unknown_parent",
                        e,
                        f"BlockStored of {_show(e.hashes[0]) if e.hashes else '(none)'} "
                        f"names parent {_show(parent)}, which is not stored",
                    )
            for h in e.hashes:
                stored[(*scope, h)] = e.position
                before_clear.pop((*scope, h), None)
            continue
        for h in e.hashes:
            if (*scope, h) in stored:
                del stored[(*scope, h)]
            elif (*scope, h) in before_clear:
                found(
                    "after_clear",
                    e,
                    f"BlockRemoved of {_show(h)}, which AllBlocksCleared "
                    f"(event {before_clear[(*scope, h)]}) already dropped",
                )
            else:
                found("unknown_removal", e, f"BlockRemoved of {_show(h)}, which is not stored")
    return KVReport(len(events), counts["stored"], counts["removed"], counts["cleared"], findings)
