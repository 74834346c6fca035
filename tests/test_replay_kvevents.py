"""Prefix-cache events: vLLM's msgpack EventBatch in both layouts, ZMQ frames, Dynamo JSON
Lines; each check found at its event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pagedkv_sql.errors import InputError
from pagedkv_sql.replay.kvevents import check_kv_events, read_kv_events

from .conftest import Cli


def _structs(array_like: bool) -> Any:
    """Structs with vLLM's field order: array_like=True is the older, tagged-array layout."""

    class EventBatch(msgspec.Struct, array_like=array_like, omit_defaults=True):
        ts: float
        events: list[Any]
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, array_like=array_like, omit_defaults=True, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[int | bytes]
        parent_block_hash: int | bytes | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[int | bytes]
        medium: str | None

    class AllBlocksCleared(KVCacheEvent):
        pass

    return EventBatch, BlockStored, BlockRemoved, AllBlocksCleared


def _stream(array_like: bool) -> list[Any]:
    Batch, Stored, Removed, Cleared = _structs(array_like)
    return [
        Batch(1.0, [Stored([11, 12], None, list(range(32)), 16, None, "GPU")]),
        Batch(2.0, [Stored([13], 12, list(range(16)), 16, None, "GPU"), Removed([13], "GPU")]),
        Batch(3.0, [Removed([99], "GPU"), Stored([21], 77, [0] * 16, 16, None, "GPU")]),
        Batch(4.0, [Cleared(), Removed([11], "GPU")]),
    ]


@pytest.mark.parametrize("array_like", [True, False])
def test_msgpack_batches_both_layouts(tmp_path: Path, array_like: bool) -> None:
    path = tmp_path / "events.msgpack"
    path.write_bytes(b"".join(msgspec.msgpack.encode(b) for b in _stream(array_like)))
    events = read_kv_events(path)
    assert [e.kind for e in events] == [
        "stored",
        "stored",
        "removed",
        "removed",
        "stored",
        "cleared",
        "removed",
    ]
    report = check_kv_events(events)
    assert [(f.check, f.position) for f in report.findings] == [
        ("unknown_removal", 3),
        ("unknown_parent", 4),
        ("after_clear", 6),
    ]
    assert report.findings[0].message == "BlockRemoved of 99, which is not stored"


def test_zmq_frames_with_sequence_numbers(tmp_path: Path) -> None:
    batches = [msgspec.msgpack.encode(b) for b in _stream(True)[:2]]
    frames = [
        [b"", (0).to_bytes(8, "big"), batches[0]],
        [b"", (2).to_bytes(8, "big"), batches[1]],  # seq 1 lost
    ]
    path = tmp_path / "zmq.msgpack"
    path.write_bytes(b"".join(msgspec.msgpack.encode(f) for f in frames))
    report = check_kv_events(read_kv_events(path))
    assert [(f.check, f.seq) for f in report.findings] == [("sequence_gap", 2)]
    assert "skips" in report.findings[0].message


def test_dynamo_json_lines(tmp_path: Path) -> None:
    def ev(n: int, data: Any) -> str:
        return json.dumps(
            {
                "timestamp": n,
                "event": {"worker_id": 7, "event": {"event_id": n, "data": data, "dp_rank": 0}},
            }
        )

    lines = [
        ev(
            0,
            {
                "stored": {
                    "parent_hash": None,
                    "blocks": [
                        {"block_hash": 1, "tokens_hash": 5},
                        {"block_hash": 2, "tokens_hash": 6},
                    ],
                }
            },
        ),
        ev(1, {"removed": {"block_hashes": [2]}}),
        ev(3, {"removed": {"block_hashes": [2]}}),
        ev(4, "cleared"),
        ev(5, {"stored": {"parent_hash": 1, "blocks": [{"block_hash": 3, "tokens_hash": 7}]}}),
    ]
    path = tmp_path / "dynamo.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = check_kv_events(read_kv_events(path))
    assert [(f.check, f.where.rsplit(":", 1)[1]) for f in report.findings] == [
        ("sequence_gap", "3"),
        ("unknown_removal", "3"),
        ("after_clear", "5"),
    ]
    assert report.findings[0].stream == "worker 7 dp 0"


def test_bad_streams_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"event": {"event_id": 1, "data": {"stored": {}}}}\n{"type": "Nope"}\n')
    with pytest.raises(InputError) as e:
        read_kv_events(bad)
    assert e.value.details[0].startswith(f"{bad}:1: stored.blocks must be a list")
    assert "unknown event type 'Nope'" in e.value.details[1]
    junk = tmp_path / "junk.msgpack"
    junk.write_bytes(msgspec.msgpack.encode([1.0, [["Teleported", [1]]]]))
    with pytest.raises(InputError, match="not a stream of KV event batches"):
        read_kv_events(junk)
    cut = tmp_path / "cut.msgpack"
    cut.write_bytes(msgspec.msgpack.encode(_stream(True)[0])[:-3])
    with pytest.raises(InputError, match="not a msgpack stream"):
        read_kv_events(cut)


def test_cli_kv_events(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "events.msgpack"
    path.write_bytes(b"".join(msgspec.msgpack.encode(b) for b in _stream(False)))
    result: Any = cli("kv-events", str(path))
    assert result.exit_code == 1
    assert result.stdout.splitlines()[0] == "7 event(s): 3 stored, 3 removed, 1 cleared"
    assert result.stdout.splitlines()[-1] == "3 finding(s)"
    clean = tmp_path / "clean.msgpack"
    clean.write_bytes(b"".join(msgspec.msgpack.encode(b) for b in _stream(False)[:2]))
    assert cli("kv-events", str(clean)).exit_code == 0
