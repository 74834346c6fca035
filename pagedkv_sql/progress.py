"""Plain progress for a terminal: one labelled line a stage of a long command, redrawn in
place, never going backwards; a finished stage's line stays, at 100%, with its time.

A reader that works in Python for long (a step log's lines) keeps a `Meter` while it runs
(`metering`, `counted`): what it has read so far, which the command's progress line shows
(`running`), from the thread that draws it. Standard library only."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

WIDTH = 30
LABEL = 32  # stage labels are padded to this width, so the bars line up


class Bar:
    """``with Bar("loading", sys.stderr) as bar: bar.update(percent)``; a percentage
    below the one shown (a new statement started) leaves the bar where it is. A bar that
    is not ``measured`` shows the time only."""

    def __init__(
        self,
        label: str,
        stream: TextIO,
        *,
        start: float | None = None,
        measured: bool = True,
    ) -> None:
        self.label = label
        self.stream = stream
        self.done = 0.0
        self.start = time.monotonic() if start is None else start
        self.measured = measured
        self.drawn = False

    def __enter__(self) -> Bar:
        self.draw()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()

    def update(self, percent: float) -> None:
        """Show ``percent`` if it is further than what is shown (negative: unknown)."""
        self.done = min(max(self.done, percent), 100.0)
        self.draw()

    def finish(self) -> None:
        """Draw the bar complete and end its line (only if it was drawn at all)."""
        if self.drawn:
            self.done = 100.0
            self.draw()
            self.stream.write("\n")
            self.stream.flush()

    def draw(self) -> None:
        elapsed = time.monotonic() - self.start
        if self.measured:
            filled = int(WIDTH * self.done / 100)
            shown = f"[{'#' * filled}{'.' * (WIDTH - filled)}] {self.done:3.0f}%"
        else:
            shown = f"[{('#' if self.done >= 100 else '.') * WIDTH}]     "
        self.stream.write(f"\r{self.label:<{LABEL}} {shown} {elapsed:.1f}s")
        self.stream.flush()
        self.drawn = True


class Stages:
    """One bar a stage: ``update((label, started, measured), percent)`` from a poller.
    A new label finishes the bar before it (if it was ever drawn: a stage over before a
    poll saw it leaves no line); leaving the ``with`` finishes the last one."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.bar: Bar | None = None
        self.key: tuple[str, float, bool] | None = None

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.finish()

    def update(self, stage: tuple[str, float, bool] | None, percent: float) -> None:
        if stage is None:
            return
        if stage != self.key:
            if self.bar is not None:
                self.bar.finish()
            label, started, measured = stage
            self.bar = Bar(label, self.stream, start=started, measured=measured)
            self.key = stage
        assert self.bar is not None
        if self.bar.measured:
            self.bar.update(percent)
        else:
            self.bar.draw()  # its time only


class Ticker:
    """For a command whose work is not one measured stage: its label, its time so far and,
    while DuckDB runs a statement, that statement's percent (``tick(percent)``; negative:
    none running). A line on stderr, redrawn in place and cleared at the end, where the
    result starts."""

    def __init__(self, label: str, stream: TextIO) -> None:
        self.label = label
        self.stream = stream
        self.start = time.monotonic()
        self.drawn = False

    def __enter__(self) -> Ticker:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()

    def tick(self, percent: float, note: str = "") -> None:
        """Redraw: the time, then ``note`` (what a reader has read: `Meter.text`) or the
        running statement's ``percent``."""
        elapsed = time.monotonic() - self.start
        shown = f" {note}" if note else f" (query {percent:3.0f}%)" if percent >= 0 else ""
        self.stream.write(f"\r\x1b[2K{self.label:<{LABEL}} {elapsed:.1f}s{shown}")
        self.stream.flush()
        self.drawn = True


class Meter:
    """How far a reader is: ``count`` items (``unit``: steps, lines) and ``done`` bytes
    of ``total`` (None: a stream of unknown size, a compressed file). Updated by the
    reader's thread, read by the progress line's."""

    def __init__(self, unit: str, total: int | None) -> None:
        self.unit = unit
        self.total = total if total else None
        self.count = 0
        self.done = 0

    def text(self) -> str:
        """``read 12,345 lines (41%)``; the percent only when the size is known."""
        shown = f"read {self.count:,} {self.unit}"
        if self.total is not None:
            shown += f" ({min(100 * self.done / self.total, 100):.0f}%)"
        return shown


_METERS: list[Meter] = []
_METERS_LOCK = threading.Lock()


@contextlib.contextmanager
def metering(unit: str, total: int | None) -> Iterator[Meter]:
    """A Meter that `running` shows for as long as the block runs."""
    meter = Meter(unit, total)
    with _METERS_LOCK:
        _METERS.append(meter)
    try:
        yield meter
    finally:
        with _METERS_LOCK:
            _METERS.remove(meter)


def running() -> str:
    """What the newest running Meter says, or "" when none runs."""
    with _METERS_LOCK:
        return _METERS[-1].text() if _METERS else ""


def counted(lines: Iterable[bytes], meter: Meter) -> Iterator[bytes]:
    """``lines`` as they come, each counted on ``meter`` with its bytes."""
    for line in lines:
        meter.done += len(line)
        yield line
        meter.count += 1


def file_size(stream: Any) -> int | None:
    """The size of the regular file under ``stream``; None for anything else (a pipe, a
    decompressing reader: its plain size is not known beforehand)."""
    try:
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None
