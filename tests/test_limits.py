"""pagedkv_sql/limits.py: the bounds every reader shares, and its strict JSON (issue 28).

Round three's helper "rel" found `replay /dev/zero` growing to 23 GB (a step-log line was
read whole, however long) and JSON kv-event lines taking the last of two equal keys."""

from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path

import pytest

import pagedkv_sql
from pagedkv_sql import limits
from pagedkv_sql.errors import InputError
from pagedkv_sql.live.decode import batches


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


def _endless(path: Path, head: bytes, stop: threading.Event) -> threading.Thread:
    """A FIFO whose writer sends ``head`` then blanks, never a newline, until the reader
    goes away: what `replay /dev/zero` or `(echo {; cat /dev/zero) | kv-events -` is."""

    def write() -> None:
        try:
            with path.open("wb") as f:
                f.write(head)
                while not stop.is_set():
                    f.write(b" " * 65536)
        except (BrokenPipeError, OSError):
            pass

    os.mkfifo(path)
    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def test_replay_of_an_endless_line_stops_at_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "MAX_LINE_BYTES", 1 << 20)
    stop = threading.Event()
    writer = _endless(tmp_path / "log", b'{"step": 0, "note": "', stop)
    with (
        pagedkv_sql.connect(":memory:") as db,
        pytest.raises(InputError, match=r"log:1: a line longer than 1,048,576 bytes"),
    ):
        db.replay(tmp_path / "log")
    stop.set()
    writer.join(10)


@pytest.mark.parametrize(("head", "message"), [(b"{", "a line longer"), (b"[", "array")])
def test_kv_events_of_an_endless_line_or_document_stop_at_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, head: bytes, message: str
) -> None:
    import pagedkv_sql.live.decode as decode

    monkeypatch.setattr(limits, "MAX_LINE_BYTES", 1 << 20)
    monkeypatch.setattr(decode, "MAX_DOCUMENT", 1 << 21)
    stop = threading.Event()
    writer = _endless(tmp_path / "events", head, stop)
    with (tmp_path / "events").open("rb") as f, pytest.raises(InputError, match=message):
        list(batches(f, "events"))
    stop.set()
    writer.join(10)


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
