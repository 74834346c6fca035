"""A watch's step logs are read apart from their checks (live/steplogs.py): a writer into a
real FIFO read by `watch -` is never held while a check runs; past the bound on lines held,
the reader waits for the checks (memory is bounded)."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pagedkv_sql.live import steplog, steplogs
from pagedkv_sql.live.watch import Watch, WatchOptions

GUARD_S = 120  # a hang guard, never a figure a test checks


def _lines(n: int) -> list[bytes]:
    out = [json.dumps({"pagedkv_step_log": 1, "block_size": 16}).encode()]
    for s in range(n):
        ops: list[dict[str, Any]] = [{"op": "allocate", "req": f"r{s}", "blocks": [1 + s % 50]}]
        if s:
            ops.insert(0, {"op": "free", "req": f"r{s - 1}"})
        out.append(json.dumps({"step": s, "ops": ops, "note": "x" * 100}).encode())
    return out


def _slow_checks(monkeypatch: pytest.MonkeyPatch, seconds: float) -> list[float]:
    done: list[float] = []  # when each check ended
    check = steplog.StepLog.check

    def slow(self: steplog.StepLog, scratch: Any) -> Any:
        time.sleep(seconds)  # a long check (a big state, a loaded machine)
        found = check(self, scratch)
        done.append(time.monotonic())
        return found

    monkeypatch.setattr(steplog.StepLog, "check", slow)
    return done


def test_a_fifo_writer_is_never_held_while_a_check_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(steplog, "WINDOW_LINES", 500)
    done = _slow_checks(monkeypatch, 2.0)
    fifo = tmp_path / "steps"
    os.mkfifo(fifo)
    lines = _lines(3000)  # 3,000 lines, ~400 KB: six times a pipe's buffer, six checks
    written: list[float] = []

    def write() -> None:
        fd = os.open(fifo, os.O_WRONLY)
        for line in lines:
            os.write(fd, line + b"\n")
        written.append(time.monotonic())
        os.close(fd)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    with open(fifo, "rb") as stdin:
        watch = Watch(WatchOptions(["-"], duration=GUARD_S), io.StringIO(), print, stdin=stdin)
        summary = watch.run()
    writer.join(GUARD_S)
    assert summary.step_lines == 3001 and summary.total == 0
    # every line was written before the second check ended: none waited for the checks
    assert len(done) == 7 and written[0] < done[1]


def test_past_the_bound_the_reader_waits_for_the_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(steplog, "WINDOW_LINES", 100)
    monkeypatch.setattr(steplogs, "MAX_HELD_BYTES", 20_000)
    _slow_checks(monkeypatch, 0.05)
    held: list[int] = []
    hand = steplogs.StepLogs.hand

    def watched(self: steplogs.StepLogs, line: bytes) -> None:
        hand(self, line)
        held.append(self.held_bytes)

    monkeypatch.setattr(steplogs.StepLogs, "hand", watched)
    data = b"\n".join(_lines(1000)) + b"\n"
    watch = Watch(WatchOptions(["-"], duration=GUARD_S), io.StringIO(), print,
                  stdin=io.BytesIO(data))  # fmt: skip
    summary = watch.run()
    assert summary.step_lines == 1001
    assert max(held) <= 20_000 + max(len(x) for x in _lines(1000))  # never much past it
