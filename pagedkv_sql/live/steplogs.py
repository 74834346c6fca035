"""The step logs a `watch` checks (live/steplog.py, one a source): the lines its sources
hand over, held until checked (at most `MAX_HELD_BYTES`: past it a source waits for the
checks, which a reader of a FIFO then feels, never before), and checked in the watch's loop,
one window of a log at a time, in one scratch in-memory database."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from .steplog import StepFinding, StepLog

MAX_HELD_BYTES = 64 << 20  # step-log lines read and not yet checked, at most


class StepLogs:
    def __init__(self, stop: threading.Event, on_new: Callable[[StepLog], None]) -> None:
        self.logs: dict[str, StepLog] = {}
        self.stop = stop
        self.on_new = on_new  # a log seen for the first time
        self.held = threading.Condition()
        self.held_bytes = 0
        self.scratch: Any = None

    def hand(self, line: bytes) -> None:
        """A source hands over a line (its own thread): it waits while too much is held."""
        with self.held:
            while self.held_bytes > MAX_HELD_BYTES and not self.stop.is_set():
                self.held.wait(0.1)
            self.held_bytes += len(line)

    def _released(self, n: int) -> None:
        with self.held:
            self.held_bytes -= n
            self.held.notify_all()

    def log(self, source: str) -> StepLog:
        log = self.logs.get(source)
        if log is None:
            log = self.logs[source] = StepLog(source)
            self.on_new(log)
        return log

    def add(self, source: str, number: int, line: bytes, last: bool) -> None:
        if not self.log(source).add(number, line, last):
            self._released(len(line))  # a blank line: nothing to check

    def unchecked(self) -> bool:
        return any(log.pending for log in self.logs.values())

    def check(self, now: float, due_only: bool) -> Iterator[tuple[StepLog, list[StepFinding]]]:
        """Check each log with lines waiting (``due_only``: those whose time has come):
        each log with the findings of its window (its notes and problems on it)."""
        for log in list(self.logs.values()):
            if self.stop.is_set():
                return
            if not log.pending or (due_only and not log.due(now)):
                continue
            if self.scratch is None:
                import duckdb

                self.scratch = duckdb.connect(":memory:")
            before = log.pending_bytes
            found = log.check(self.scratch)
            self._released(before - log.pending_bytes)
            yield log, found

    def close(self) -> None:
        for log in self.logs.values():
            log.close()
        if self.scratch is not None:
            self.scratch.close()
            self.scratch = None


__all__ = ["MAX_HELD_BYTES", "StepLogs"]
