"""pagedkv_sql/limits.py: the bounds every reader shares, and its strict JSON.

Unbounded, `replay /dev/zero` grows to 23 GB (a step-log line read whole, however long);
not strict, a JSON kv-event line takes the last of two equal keys."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, cast

import pytest

import pagedkv_sql
from pagedkv_sql import limits
from pagedkv_sql.errors import InputError, PagedKVError
from pagedkv_sql.live.decode import batches
from pagedkv_sql.replay.header import LogLineError


@pytest.mark.parametrize("size", [1, 7, 8, 9, 64])
def test_split_lines_gives_every_line_whatever_the_chunks(size: int) -> None:
    data = b"a\nbb\n\nccc dddd\neeeee"
    chunks = [data[i : i + size] for i in range(0, len(data), size)]
    assert list(limits.split_lines(chunks, limit=10)) == data.split(b"\n")
    assert list(limits.bounded_lines(io.BytesIO(data), limit=10)) == [
        line + b"\n" for line in data.split(b"\n")[:-1]
    ] + [b"eeeee"]


@pytest.mark.parametrize("size", [1, 3, 100])
def test_a_line_past_the_limit_is_refused_naming_it(size: int) -> None:
    data = b"ok\n" + b"x" * 11 + b"\nok\n"
    chunks = [data[i : i + size] for i in range(0, len(data), size)]
    with pytest.raises(limits.LineTooLong, match="line 2 is longer than 10 bytes"):
        list(limits.split_lines(chunks, limit=10))
    with pytest.raises(limits.LineTooLong, match="line 2 is longer than 10 bytes"):
        list(limits.bounded_lines(io.BytesIO(data), limit=10))
    # exactly the limit, with or without its newline, is a line
    assert list(limits.split_lines([b"x" * 10 + b"\n" + b"y" * 10], limit=10)) == [
        b"x" * 10,
        b"y" * 10,
    ]
    assert list(limits.bounded_lines(io.BytesIO(b"x" * 10 + b"\n"), limit=10)) == [
        b"x" * 10 + b"\n"
    ]


def test_replay_of_a_line_past_the_limit_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what `replay /dev/zero` met (an endless line), with the limit made small; a FIFO
    # writer thread was tried here and could hang the suite under xdist
    monkeypatch.setattr(limits, "MAX_LINE_BYTES", 1 << 20)
    log = tmp_path / "log"
    log.write_bytes(b'{"step": 0, "ops": []}\n{"step": 1, "note": "' + b" " * (3 << 20))
    with (
        pagedkv_sql.connect(":memory:") as db,
        pytest.raises(InputError, match=r"log:2: a line longer than 1,048,576 bytes"),
    ):
        db.replay(log)
    with (  # a stream (stdin, a pipe) the same
        log.open("rb") as f,
        pagedkv_sql.connect(":memory:") as db,
        pytest.raises(InputError, match=r"<stream>:2: a line longer than"),
    ):
        db.replay(f)


@pytest.mark.parametrize(("head", "message"), [(b"{", ":1: a line longer"), (b"[", "array")])
def test_kv_events_of_a_line_or_document_past_the_limit_are_refused(
    monkeypatch: pytest.MonkeyPatch, head: bytes, message: str
) -> None:
    import pagedkv_sql.live.decode_json as decode

    monkeypatch.setattr(limits, "MAX_LINE_BYTES", 1 << 20)
    monkeypatch.setattr(decode, "MAX_DOCUMENT", 1 << 21)
    with pytest.raises(InputError, match=message):
        list(batches(io.BytesIO(head + b" " * (5 << 20)), "events"))


def test_kv_events_of_nothing_but_blank_bytes_past_the_limit_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `yes '' | pagedkv-sql kv-events -` reads ahead for the first event within the bound;
    # a pipe's short reads count by their bytes
    monkeypatch.setattr(limits, "MAX_LINE_BYTES", 1 << 20)

    class Pipe(io.RawIOBase):
        def readinto(self, b: Any) -> int:
            n = min(len(b), 4096)  # a pipe gives at most what it holds
            b[:n] = b"\n" * n
            return n

    with pytest.raises(InputError, match="blank bytes and no event"):
        list(batches(Pipe(), "<stdin>"))
    events = b"\n" * 1000 + b'{"event_id": 0, "data": {"type": "created"}}\n'
    assert len(list(batches(io.BytesIO(events), "events"))) == 1  # blank lines before: fine


def _compact(text: str) -> bytes:
    """What a faster reader's value re-encodes to (the last of two equal keys kept)."""
    return json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False).encode()


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1, "a": 2}',
        '[{"b": {"c": 1, "c": 1}}]',
        '{"x": [{"k": 1}, {"k": 2, "k": 3}]}',
        '{"a":1,"\\u0061":2}',  # the same key, spelt with an escape
        '{"a" :1,"a":2}',  # white space before a colon
    ],
)
def test_loads_strict_refuses_a_key_named_twice(text: str) -> None:
    with pytest.raises(limits.DuplicateKey):
        limits.loads_strict(text)
    with pytest.raises(limits.DuplicateKey):
        limits.refuse_duplicate_keys(text.encode(), _compact(text))


@pytest.mark.parametrize(
    "text",
    [
        '{"a": "\\":", "b": 1}',
        '[{"k": 1}, {"k": 2}]',
        '{"a": {"a": {"a": 1}}}',
        '{"\\u0061":1,"b":"\\u0022:"}',
        '{"a" :1}',
    ],
)
def test_equal_keys_in_different_objects_are_no_duplicates(text: str) -> None:
    assert limits.loads_strict(text) == json.loads(text)
    limits.refuse_duplicate_keys(text.encode(), _compact(text))


def _snapshot_block_size(size: int) -> None:
    from pagedkv_sql.engines import Snapshot

    assert Snapshot("vllm", meta={"block_size": size}).block_size == size


def _page_size_option(size: int) -> None:
    from pagedkv_sql.engines.meta import complete

    complete("<snapshot>", {}, block_size=size)


def _step_log_header(size: int) -> None:
    from pagedkv_sql.replay.header import header_from

    header_from({"pagedkv_step_log": 2, "block_size": size})


def _synth_log(size: int) -> None:
    from pagedkv_sql.replay.synth import StepSynthConfig

    StepSynthConfig(block_size=size)


def _synth(size: int) -> None:
    from pagedkv_sql.synth import SynthConfig, synthesize

    synthesize(SynthConfig(sequences=1, mean_length=1, block_size=size))


def _fuzz(size: int) -> None:
    from pagedkv_sql.fuzz.core import check_knobs

    check_knobs(16, size)


def _spark(size: int) -> None:
    from pagedkv_sql.spark.kv import SparkKV

    try:
        SparkKV(cast(Any, None), {}, block_size=size)
    except PagedKVError as e:
        if "--block-size" in str(e):
            raise
        # past the block size: the spark extra is missing here
    except AttributeError:
        pass  # past the block size: no SparkSession was given


def _check(size: int) -> None:
    with pagedkv_sql.connect(":memory:") as db:
        db.check(block_size=size)


READERS = [_snapshot_block_size, _page_size_option, _step_log_header, _synth_log, _synth,
           _fuzz, _spark, _check]  # fmt: skip


@pytest.mark.parametrize("reader", READERS, ids=lambda f: f.__name__.strip("_"))
def test_every_reader_of_a_block_size_keeps_the_one_bound(reader: Any) -> None:
    reader(limits.MAX_BLOCK_SIZE)
    for size in (0, limits.MAX_BLOCK_SIZE + 1):
        with pytest.raises((PagedKVError, LogLineError)) as e:
            reader(size)
        assert str(limits.MAX_BLOCK_SIZE) in str(e.value) or "outside" in str(e.value)


def test_the_step_log_schema_bounds_the_block_size_as_the_reader_does() -> None:
    schema = json.loads(
        (Path(limits.__file__).parent / "replay" / "step-log.schema.json").read_text()
    )
    header = next(d for d in schema["$defs"].values() if "block_size" in d.get("properties", {}))
    assert header["properties"]["block_size"]["maximum"] == limits.MAX_BLOCK_SIZE
