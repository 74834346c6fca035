"""`watch`'s file sources on real files (live/sources.py, live/endpoints.py): a followed
file truncated, rewritten at once by a longer write, or replaced starts a new log read from
its first line; a file that never exists is said, then a problem; a directory is refused
with a Fix; a stream's last line without a newline is marked."""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pagedkv_sql.errors import UsageError
from pagedkv_sql.live import sources
from pagedkv_sql.live.endpoints import open_sources
from pagedkv_sql.live.sources import FollowSource, Item, StreamSource

GUARD_S = 60  # a hang guard, never a figure a test checks


class Collect:
    def __init__(self) -> None:
        self.items: list[Item] = []
        self.lock = threading.Lock()

    def put(self, item: Item) -> None:
        with self.lock:
            self.items.append(item)

    def kinds(self) -> list[tuple[str, int, bytes | str]]:
        with self.lock:
            return [
                (i.kind, i.number, i.line if i.kind == "line" else i.message)  # type: ignore[misc]
                for i in self.items
                if i.kind not in ("end",)
            ]

    def wait(self, pred: Callable[[], bool]) -> None:
        deadline = time.monotonic() + GUARD_S
        while not pred():
            assert time.monotonic() < deadline, self.kinds()
            time.sleep(0.01)


def _follow(path: Path) -> tuple[FollowSource, Collect, threading.Event]:
    sink, stop = Collect(), threading.Event()
    source = FollowSource(str(path), sink, stop, str(path))
    source.start()
    return source, sink, stop


def _lines(sink: Collect) -> list[tuple[int, bytes]]:
    return [(n, x) for k, n, x in sink.kinds() if k == "line"]  # type: ignore[misc]


def test_a_truncation_and_a_longer_write_at_once_start_the_log_from_its_first_line(
    tmp_path: Path,
) -> None:
    log = tmp_path / "steps.jsonl"
    log.write_bytes(b'{"step": 0}\n{"step": 1}\n')
    source, sink, stop = _follow(log)
    sink.wait(lambda: len(_lines(sink)) == 2)
    # `cat new > log`: truncated and written, longer, between two looks of the source
    fd = os.open(log, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, b'{"pagedkv_step_log": 1}\n{"step": 0, "ops": []}\n{"step": 1, "ops": []}\n')
    os.close(fd)
    sink.wait(lambda: len(_lines(sink)) == 5)
    stop.set()
    source.join(GUARD_S)
    kinds = sink.kinds()
    resets = [x for k, _, x in kinds if k == "reset"]
    assert len(resets) == 1 and resets[0] in (
        f"{log} was rewritten; reading it from the start",
        f"{log} was truncated; reading it from the start",
    )
    assert _lines(sink)[2:] == [
        (1, b'{"pagedkv_step_log": 1}'),
        (2, b'{"step": 0, "ops": []}'),
        (3, b'{"step": 1, "ops": []}'),
    ]


def test_a_rotation_reads_the_new_file_as_a_new_log(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    log.write_bytes(b'{"step": 0}\n{"step": 1}\n{"step": 2, "ops": [')  # unfinished last line
    source, sink, stop = _follow(log)
    sink.wait(lambda: len(_lines(sink)) == 2)
    log.rename(tmp_path / "steps.jsonl.1")
    log.write_bytes(b'{"step": 0}\n')
    sink.wait(lambda: len(_lines(sink)) == 3)
    stop.set()
    source.join(GUARD_S)
    assert [(k, x) for k, _, x in sink.kinds() if k in ("reset", "note")] == [
        ("note", f"the last line of the replaced {log} was unfinished (20 bytes): not read"),
        ("reset", f"{log} was replaced; reading the new file"),
    ]
    assert _lines(sink)[-1] == (1, b'{"step": 0}')


def test_a_file_that_never_exists_is_said_then_a_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sources, "QUIET_NOTE_S", 0.2)
    typo = tmp_path / "typo.jsonl"
    source, sink, stop = _follow(typo)
    sink.wait(lambda: any(k == "note" for k, _, _ in sink.kinds()))
    stop.set()
    source.join(GUARD_S)
    assert [(k, x) for k, _, x in sink.kinds()] == [
        ("note", f"{typo} does not exist after 0 s; waiting for it"),
        ("problem", f"{typo} never existed while watched: nothing was read"),
    ]


def test_following_a_directory_is_refused_with_a_fix(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is a directory, not a file to follow") as e:
        open_sources([str(tmp_path)], Collect(), threading.Event(), replays=[], follow=True)
    assert e.value.hint.startswith("give the log file itself")


def test_a_stream_s_last_line_without_a_newline_is_marked(tmp_path: Path) -> None:
    for data, last in ((b'{"step": 0}\n{"step": 1', True), (b'{"step": 0}\n{"step": 1}\n', False)):
        sink = Collect()
        StreamSource("s", sink, threading.Event(), io.BytesIO(data)).run()
        lines = [i for i in sink.items if i.kind == "line"]
        assert [(i.number, i.last) for i in lines] == [(1, False), (2, last)]
