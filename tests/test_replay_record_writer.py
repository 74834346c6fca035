"""A recorder's step-log file (pagedkv_sql/replay/record_writer.py), on real files, FIFOs
and devices: never replaced, never through a link, never a wait for the engine; a slow or
absent reader costs dropped lines marked as a gap, a full file system a stop mark after the
last complete line, a deleted log a word and a stop; each said once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql.replay import read_log, record_writer
from pagedkv_sql.replay.marks import mark_of
from pagedkv_sql.replay.record_writer import LogRefused, LogWriter, line

HEADER = line({"pagedkv_step_log": 1, "engine": "test", "block_size": 4, "num_gpu_blocks": 64})


def step(n: int, pad: int = 0) -> bytes:
    ops = [{"op": "allocate", "req": f"r{n}", "blocks": [n % 60 + 1]}]
    ops.append({"op": "free", "req": f"r{n}"})
    return line({"step": n, "ops": ops, "note": "x" * pad})


def finishes(fn: Callable[[], Any], within: float = 60) -> Any:
    """``fn()`` run in a thread: its result, or a failure if it is still waiting (a hang)."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(within)
    assert not t.is_alive(), "it blocked"
    return out[0] if out else None


def reader(fifo: Path, got: bytearray, delay: float = 0.0) -> threading.Thread:
    """A thread that opens ``fifo`` after ``delay`` seconds and reads it to its end."""

    def read() -> None:
        threading.Event().wait(delay)
        with open(fifo, "rb") as f:
            while chunk := f.read(4096):
                got.extend(chunk)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


def test_an_existing_log_is_kept_and_the_next_free_name_written(tmp_path: Path) -> None:
    (tmp_path / "vllm-7.jsonl").write_text("PRECIOUS previous run\n")
    (tmp_path / "vllm-7.1.jsonl").write_text("and the one before\n")
    w = LogWriter(tmp_path / "vllm-7.jsonl", block=True)
    w.put(HEADER)
    w.close()
    assert w.path == tmp_path / "vllm-7.2.jsonl"
    assert (tmp_path / "vllm-7.jsonl").read_text() == "PRECIOUS previous run\n"
    assert (tmp_path / "vllm-7.1.jsonl").read_text() == "and the one before\n"
    assert (tmp_path / "vllm-7.2.jsonl").read_bytes() == HEADER
    assert [p.name for p in record_writer.names(Path("log"))][:3] == ["log", "log.1", "log.2"]


@pytest.mark.parametrize("target", ["victim", "missing"])
def test_a_symbolic_link_at_the_path_is_refused_and_its_target_untouched(
    tmp_path: Path, target: str
) -> None:
    (tmp_path / "victim").write_text("victim\n")
    (tmp_path / "log.jsonl").symlink_to(tmp_path / target)
    with pytest.raises(LogRefused, match=r"log\.jsonl is a symbolic link; a recorder never") as e:
        LogWriter(tmp_path / "log.jsonl", block=False)
    assert "remove the link" in e.value.hint
    assert (tmp_path / "victim").read_text() == "victim\n"
    assert not (tmp_path / "missing").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl", "victim"]


def test_a_directory_or_a_missing_one_is_refused_saying_so(tmp_path: Path) -> None:
    with pytest.raises(LogRefused, match=r"is a directory") as e:
        LogWriter(tmp_path, block=False)
    assert "vllm-{pid}.jsonl" in e.value.hint
    with pytest.raises(LogRefused, match=r"cannot create .*nowhere/x.jsonl: No such file"):
        LogWriter(tmp_path / "nowhere" / "x.jsonl", block=False)


def test_a_fifo_without_a_reader_never_blocks_and_is_written_when_one_comes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fifo = tmp_path / "steps.fifo"
    os.mkfifo(fifo)
    with caplog.at_level("WARNING", logger="pagedkv_sql.record"):
        w = finishes(lambda: LogWriter(fifo, block=False), within=10)
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"pagedkv-sql: the step log {fifo} is a FIFO nobody reads yet")
    for data in (HEADER, step(0), step(1)):
        assert w.put(data, None)
    got = bytearray()
    t = reader(fifo, got)
    w.close()
    t.join(10)
    assert bytes(got) == HEADER + step(0) + step(1)


def test_lines_a_stalled_reader_cannot_take_are_dropped_said_once_and_marked_as_a_gap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fifo = tmp_path / "steps.fifo"
    os.mkfifo(fifo)
    w = LogWriter(fifo, block=False, buffer_bytes=1000)
    with caplog.at_level("WARNING", logger="pagedkv_sql.record"):
        queued = finishes(lambda: [w.put(step(n), n) for n in range(200)], within=30)
    assert queued[0] and not all(queued)  # the first ones queued, the rest dropped
    kept = queued.index(False)
    assert w.dropped == 200 - kept
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "is a FIFO nobody reads yet" in said[0], said
    assert f"dropped from step {kept} on" in said[1]
    got = bytearray()
    t = reader(fifo, got)
    assert w.flush(10)
    assert w.put(step(300), 300)  # room again: the gap is marked before it
    w.close()
    t.join(10)
    lines = [json.loads(x) for x in bytes(got).splitlines()]
    assert [x["step"] for x in lines[:kept]] == list(range(kept))
    assert lines[kept] == {"gap": 200 - kept, "after_step": kept - 1}
    assert lines[kept + 1]["step"] == 300 and w.gaps == 1
    table = read_log([HEADER.decode(), *bytes(got).decode().splitlines(keepends=True)])
    mark = mark_of(table.schema.metadata, "t")
    assert mark is not None and (mark.kind, mark.after_step, mark.lines_after) == (
        "gap",
        kept - 1,
        1,
    )


@pytest.mark.parametrize("end", ["close", "stop"])
def test_a_recording_that_ends_while_lines_are_dropped_ends_with_their_gap_mark(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, end: str
) -> None:
    """No line fits after the first few, and the recording ends there: the gap mark (with
    the count dropped) is still written after the last line (before a stop's mark), replay
    says where checking ended, and closing says how many lines were lost in all."""
    fifo = tmp_path / "steps.fifo"
    os.mkfifo(fifo)
    w = LogWriter(fifo, block=False, buffer_bytes=1000)
    with caplog.at_level("WARNING", logger="pagedkv_sql.record"):
        queued = finishes(lambda: [w.put(step(n), n) for n in range(200)], within=30)
        kept = queued.index(False)
        got = bytearray()
        t = reader(fifo, got)
        if end == "close":
            w.close()
        else:
            w.stop("the engine stopped")
            assert w.flush(10)
        t.join(10)
    lines = [json.loads(x) for x in bytes(got).splitlines()]
    assert [x["step"] for x in lines[:kept]] == list(range(kept))
    marks = [{"gap": 200 - kept, "after_step": kept - 1}]
    if end == "stop":
        marks.append({"stopped": "the engine stopped", "after_step": kept - 1})
    assert lines[kept:] == marks and w.gaps == 1
    table = read_log([HEADER.decode(), *bytes(got).decode().splitlines(keepends=True)])
    mark = mark_of(table.schema.metadata, "t")
    assert mark is not None and (mark.kind, mark.after_step) == ("gap", kept - 1)
    said = [r.getMessage() for r in caplog.records]
    assert f"lost {200 - kept} line(s) in all: {200 - kept} step line(s) dropped" in said[-1]


def test_a_reader_that_never_reads_costs_the_engine_no_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipe fills (64 KiB) and the writer thread waits in write(); 20,000 lines handed
    over meanwhile return at once; closing waits its bound and says what was not written."""
    monkeypatch.setattr(record_writer, "CLOSE_TIMEOUT_S", 0.2)
    fifo = tmp_path / "steps.fifo"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader that reads nothing
    try:
        w = LogWriter(fifo, block=False, buffer_bytes=256 << 10)
        with caplog.at_level("WARNING", logger="pagedkv_sql.record"):
            finishes(lambda: [w.put(step(n, pad=100), n) for n in range(20_000)], within=60)
            assert w.dropped > 0
            finishes(w.close, within=30)
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 3, said  # the reader opened it: no FIFO word
        assert "not taken as fast as the engine writes it" in said[0]
        assert "line(s) of the step log" in said[1] and "were not written" in said[1]
        left = int(said[1].split()[1])
        assert f"lost {w.dropped + left} line(s) in all: {w.dropped} step line(s)" in said[2]
    finally:
        os.close(held)  # the writer thread, still in write(), gets EPIPE and ends
        with caplog.at_level("CRITICAL", logger="pagedkv_sql.record"):
            w._thread.join(timeout=30)  # within the test: its last word is captured


def test_a_blocking_writer_waits_for_room_and_drops_nothing(tmp_path: Path) -> None:
    fifo = tmp_path / "steps.fifo"
    os.mkfifo(fifo)
    got = bytearray()
    t = reader(fifo, got, delay=0.5)
    w = LogWriter(fifo, block=True, buffer_bytes=500)
    sent = [step(n) for n in range(300)]
    assert all(w.put(data, n) for n, data in enumerate(sent))
    w.close()
    t.join(10)
    assert bytes(got) == b"".join(sent) and w.dropped == 0


FULL = """
import logging, os, resource, signal, sys
from pathlib import Path
logging.basicConfig()  # a host that configured logging
from pagedkv_sql.replay.record_writer import LogWriter, line
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))
w = LogWriter(Path(sys.argv[1]), block=False)
for n in range(40):
    w.put(line({"step": n, "ops": [{"op": "observe", "ref_cnt": {}}], "note": "x" * 120}), n)
w.flush(10)
print(type(w.error).__name__, w.error.errno)
"""


def test_a_file_that_cannot_grow_ends_with_its_last_complete_line_and_a_stop_mark(
    tmp_path: Path,
) -> None:
    """The file size limit (RLIMIT_FSIZE) makes writes fail as a full disk does, mid-line;
    the mark is longer than the room the cut line leaves: the last line makes room."""
    log = tmp_path / "full.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", FULL, str(log)], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split() == ["OSError", "27"], done.stdout + done.stderr
    assert done.stderr.count("pagedkv-sql: the step recorder stopped after step") == 1
    data = log.read_bytes()
    assert data.endswith(b"\n") and len(data) <= 2000
    lines = [json.loads(x) for x in data.splitlines()]  # every line whole
    *steps, last = lines
    assert last["stopped"].endswith("full.jsonl: File too large")
    assert last["after_step"] == steps[-1]["step"] == len(steps) - 1
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(log)
    assert report.ok and report.mark is not None and report.mark.kind == "stopped"


def test_a_log_deleted_while_written_is_said_once_and_the_writer_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(record_writer, "DELETED_CHECK_S", 0.0)
    log = tmp_path / "gone.jsonl"
    w = LogWriter(log, block=False)
    w.put(HEADER)
    w.flush(10)
    log.unlink()
    with caplog.at_level("WARNING", logger="pagedkv_sql.record"):
        for n in range(5):
            w.put(step(n), n)
            w.flush(10)
        w.close()
    assert isinstance(w.error, FileNotFoundError) and not w.alive
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "gone.jsonl was deleted while the engine ran" in said[0], said
    assert not log.exists()  # nothing recreated
