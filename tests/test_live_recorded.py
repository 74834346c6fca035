"""Prefix-cache events: vLLM's msgpack EventBatch in both layouts, ZMQ frames, Dynamo JSON
Lines; each check found at its event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pagedkv_sql.errors import InputError
from pagedkv_sql.live import recorded as kvevents
from pagedkv_sql.live.recorded import check_kv_events, read_kv_events

from .steplogs import stream


@pytest.mark.parametrize("array_like", [True, False])
def test_msgpack_batches_both_layouts(tmp_path: Path, array_like: bool) -> None:
    path = tmp_path / "events.msgpack"
    path.write_bytes(b"".join(msgspec.msgpack.encode(b) for b in stream(array_like)))
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
    batches = [msgspec.msgpack.encode(b) for b in stream(True)[:2]]
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
    assert e.value.details[0] == (
        f"{bad}:1: Object missing required field `blocks` - at `$.data.stored`"
    )
    assert e.value.details[1].startswith(f"{bad}:2: Invalid value 'Nope'")
    junk = tmp_path / "junk.msgpack"
    junk.write_bytes(msgspec.msgpack.encode([1.0, [["Teleported", [1]]]]))
    with pytest.raises(InputError, match="not a stream of KV event batches"):
        read_kv_events(junk)
    cut = tmp_path / "cut.msgpack"
    cut.write_bytes(msgspec.msgpack.encode(stream(True)[0])[:-3])
    with pytest.raises(InputError, match=r"not a stream of KV event batches \(byte 0\)"):
        read_kv_events(cut)


# -- kv events: the msgpack framing of every type byte -------------------------------------
# msgpack.Unpacker frames the stream; every type must still be read past exactly


_MSGPACK = [
    b"\x00",  # positive fixint, both ends
    b"\x7f",
    b"\xe0",  # negative fixint, both ends
    b"\xff",
    b"\xc0",  # nil, false, true
    b"\xc2",
    b"\xc3",
    b"\x80",  # fixmap, empty and with one pair
    b"\x81\x01\xa1x",
    b"\x8f" + b"".join(bytes([k, 0]) for k in range(15)),
    b"\x90",  # fixarray
    b"\x92\x01\xc0",
    b"\x9f" + b"\x00" * 15,
    b"\xa0",  # fixstr
    b"\xa3abc",
    b"\xbf" + b"x" * 31,
    b"\xcc\xff",  # uint 8, 16, 32, 64
    b"\xcd\x01\x00",
    b"\xce\x00\x01\x00\x00",
    b"\xcf" + b"\x00\x00\x00\x01\x00\x00\x00\x00",
    b"\xd0\x80",  # int 8, 16, 32, 64
    b"\xd1\x80\x00",
    b"\xd2\x80\x00\x00\x00",
    b"\xd3\x80" + b"\x00" * 7,
    b"\xca\x3f\x80\x00\x00",  # float 32, 64
    b"\xcb\x3f\xf0" + b"\x00" * 6,
    b"\xd4\x05\x01",  # fixext 1, 2, 4, 8, 16 (a type byte, then the data)
    b"\xd5\x05" + b"\x01" * 2,
    b"\xd6\x05" + b"\x01" * 4,
    b"\xd7\x05" + b"\x01" * 8,
    b"\xd8\x05" + b"\x01" * 16,
    b"\xc4\x03abc",  # bin 8, 16, 32
    b"\xc5\x00\x03abc",
    b"\xc6\x00\x00\x00\x03abc",
    b"\xd9\x03abc",  # str 8, 16, 32
    b"\xda\x00\x03abc",
    b"\xdb\x00\x00\x00\x03abc",
    b"\xc7\x03\x05abc",  # ext 8, 16, 32 (length, type byte, data)
    b"\xc8\x00\x03\x05abc",
    b"\xc9\x00\x00\x00\x03\x05abc",
    b"\xdc\x00\x02\x01\x02",  # array 16, 32
    b"\xdd\x00\x00\x00\x02\x01\x02",
    b"\xde\x00\x01\xa1k\x01",  # map 16, 32
    b"\xdf\x00\x00\x00\x01\xa1k\x01",
]


@pytest.mark.parametrize("obj", _MSGPACK, ids=lambda b: f"0x{b[0]:02x}-{len(b)}")
def test_the_msgpack_framing_reads_past_exactly_one_object_of_every_type(
    tmp_path: Path, obj: bytes
) -> None:
    msgspec.msgpack.decode(obj)  # a valid msgpack object, as msgspec reads it
    # a batch whose one event carries obj in a field the checks do not read, twice over
    event = b"\x83\xa4type\xabBlockStored\xacblock_hashes\x91\x01\xa1x" + obj
    batch = b"\x93\xcb" + b"\x00" * 8 + b"\x91" + event + b"\x00"
    path = tmp_path / "events.msgpack"
    path.write_bytes(batch + batch)
    events = read_kv_events(path)
    assert [(e.kind, e.where) for e in events] == [
        ("stored", f"{path}@0"),
        ("stored", f"{path}@{len(batch)}"),
    ]


def test_the_msgpack_framing_refuses_a_byte_that_starts_no_object(tmp_path: Path) -> None:
    for data, message in [(b"\xc1", "byte 0xc1 starts no msgpack object"),
                          (b"\x92\x01", "truncated")]:  # fmt: skip
        path = tmp_path / "bad.msgpack"
        path.write_bytes(data)
        with pytest.raises(InputError) as e:
            read_kv_events(path)
        assert message in e.value.details[0]


def test_a_blank_line_in_a_json_lines_kv_event_stream_is_skipped_not_the_end(tmp_path: Any) -> None:
    def ev(n: int, data: Any) -> str:
        return json.dumps({"event": {"worker_id": 1, "event": {"event_id": n, "data": data}}})

    stored = {"stored": {"parent_hash": None, "blocks": [{"block_hash": 1, "tokens_hash": 5}]}}
    path = tmp_path / "events.jsonl"
    path.write_text(ev(0, stored) + "\n\n   \n" + ev(1, {"removed": {"block_hashes": [1]}}) + "\n")
    events = kvevents.read_kv_events(path)
    assert [(e.position, e.kind, e.seq, e.where.rsplit(":", 1)[1]) for e in events] == [
        (0, "stored", 0, "1"),
        (1, "removed", 1, "4"),
    ]


def test_a_kv_event_map_without_a_type_is_not_an_event(tmp_path: Any) -> None:
    path = tmp_path / "events.jsonl"
    for event in ({"block_hashes": [1]}, 7):
        path.write_text(json.dumps({"ts": 1, "events": [event]}) + "\n")
        with pytest.raises(InputError) as e:
            kvevents.read_kv_events(path)
        (detail,) = e.value.details
        assert detail.startswith(f"{path}:1: ") and detail.endswith("at `$.events[0]`")


def test_a_msgpack_file_holding_one_array_of_batches_gives_every_batch(tmp_path: Any) -> None:
    import msgspec

    stored = {
        "type": "BlockStored",
        "block_hashes": [1],
        "parent_block_hash": None,
        "token_ids": [0] * 16,
        "block_size": 16,
    }
    batches = [
        {"ts": 1.0, "events": [stored]},
        {"ts": 2.0, "events": [{"type": "BlockRemoved", "block_hashes": [1]}]},
    ]
    path = tmp_path / "events.msgpack"
    path.write_bytes(msgspec.msgpack.encode(batches))
    events = kvevents.read_kv_events(path)
    assert [(e.kind, e.hashes) for e in events] == [("stored", (1,)), ("removed", (1,))]
    assert kvevents.check_kv_events(events).findings == []


def test_msgpack_batches_of_two_fields_zmq_frames_of_two_and_their_ranks(tmp_path: Any) -> None:
    import msgspec

    stored = ["BlockStored", [1], None, [0] * 16, 16, None, "GPU"]
    removed = ["BlockRemoved", [1], "GPU"]
    frames = [
        [1.0, [stored]],  # the older tagged-array batch without its dp rank: [ts, events]
        [7, msgspec.msgpack.encode([2.0, [removed], 1])],  # a ZMQ frame [seq, payload], rank 1
        [b"kv", (8).to_bytes(8, "big"), msgspec.msgpack.encode([3.0, [stored], 1])],
    ]
    path = tmp_path / "events.msgpack"
    path.write_bytes(b"".join(msgspec.msgpack.encode(f) for f in frames))
    events = kvevents.read_kv_events(path)
    assert [(e.position, e.kind, e.stream, e.seq) for e in events] == [
        (0, "stored", "dp 0", None),
        (1, "removed", "dp 1", 7),
        (2, "stored", "dp 1", 8),
    ]


def test_a_repeated_kv_event_sequence_number_steps_back(tmp_path: Any) -> None:
    def ev(n: int) -> str:
        data = {"removed": {"block_hashes": [9]}}
        return json.dumps({"event": {"worker_id": 1, "event": {"event_id": n, "data": data}}})

    path = tmp_path / "events.jsonl"
    path.write_text("\n".join([ev(4), ev(4), ev(7)]) + "\n")
    report = kvevents.check_kv_events(kvevents.read_kv_events(path))
    gaps = [f.message for f in report.findings if f.check == "sequence_gap"]
    assert [m.split("(")[1].split(":")[0] for m in gaps] == ["steps back", "skips"]


def test_every_malformed_line_of_a_json_lines_kv_event_stream_is_named(tmp_path: Any) -> None:
    good = json.dumps({"event": {"worker_id": 1, "event": {"event_id": 0, "data": "cleared"}}})
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join([good, "{bad", "{worse", good]) + "\n")
    with pytest.raises(InputError) as e:
        kvevents.read_kv_events(path)
    assert [d.split(": ")[0] for d in e.value.details] == [f"{path}:2:2", f"{path}:3:2"]


def test_an_unknown_parent_is_named_with_the_stored_hash(tmp_path: Any) -> None:
    data = {"stored": {"parent_hash": 77, "blocks": [{"block_hash": 3, "tokens_hash": 5}]}}
    path = tmp_path / "events.jsonl"
    path.write_text(
        json.dumps({"event": {"worker_id": 1, "event": {"event_id": 0, "data": data}}}) + "\n"
    )
    (finding,) = kvevents.check_kv_events(kvevents.read_kv_events(path)).findings
    assert finding.check == "unknown_parent"
    assert finding.message.startswith("BlockStored of 3 names parent 77")


def _many(path: Path, batches: int) -> Path:
    enc = msgspec.msgpack.Encoder()
    with path.open("wb") as f:
        for s in range(batches):
            stored = {"type": "BlockStored", "block_hashes": list(range(20 * s, 20 * s + 20))}
            f.write(enc.encode([1.0 + s, [stored], 0]))
    return path


def test_a_signal_during_the_commit_comes_after_it_and_the_commit_is_heard(
    tmp_path: Path,
) -> None:
    import os
    import signal

    import pagedkv_sql
    from pagedkv_sql.live import check_stream

    heard: list[int] = []

    def commit_then_ctrl_c(report: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C at the worst moment: held till after
        heard.append(report.rows)

    path = _many(tmp_path / "e.msgpack", 100)
    with pagedkv_sql.connect(str(tmp_path / "k.duckdb")) as db:
        with path.open("rb") as f, pytest.raises(KeyboardInterrupt):
            check_stream(f, "e.msgpack", db=db, on_commit=commit_then_ctrl_c)
        assert heard == [2000]
        assert db.sql("SELECT count(*) FROM engine_kv_event").fetchall() == [(2000,)]
        with path.open("rb") as f:  # the rerun a user makes stores nothing twice
            again = check_stream(f, "again", db=db)
        assert again.stored_before == ("e.msgpack", 2000) and again.rows == 0
        assert db.sql("SELECT count(*) FROM engine_kv_event").fetchall() == [(2000,)]


def test_kv_events_interrupted_says_what_it_stored(tmp_path: Path) -> None:
    import signal
    import time

    import duckdb

    from .faults import cli

    path = _many(tmp_path / "e.msgpack", 20_000)
    proc = cli(["kv-events", str(path), "--db", "t.duckdb"], tmp_path, tmp_path)
    begun = time.monotonic()
    proc.communicate(timeout=300)
    assert proc.returncode == 0
    whole = time.monotonic() - begun
    said = set()
    for i in range(8):  # Ctrl-C from early to the very end of a run
        db = tmp_path / f"k{i}.duckdb"
        proc = cli(["kv-events", str(path), "--db", str(db)], tmp_path, tmp_path)
        time.sleep(whole * (0.3 + 0.1 * i))
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
        assert "Traceback" not in err and "transaction is aborted" not in err, err
        if not db.exists():
            said.add("nothing")
            assert proc.returncode == 130 and err == "Error: interrupted; nothing was changed\n"
            continue
        con = duckdb.connect(str(db), read_only=True)
        assert con.execute("SELECT count(*) FROM engine_kv_event").fetchall() == [(400_000,)]
        con.close()
        stored = f"stored 400000 row(s) in {db} (engine_kv_event)\n"
        if proc.returncode == 130:  # after the COMMIT: said so
            said.add("stored")
            interrupted = f"Error: interrupted; 400000 row(s) were stored in {db} before it\n"
            # a Ctrl-C after the summary line but before the exit is said after it
            assert err in (interrupted, stored + interrupted), err
        else:
            said.add("done")
            # done; a signal at the interpreter's exit may still end it (-2): all was said
            assert proc.returncode in (0, -signal.SIGINT) and err.endswith(stored)
    assert said  # each run said what it did: nothing, or all (never a part)
