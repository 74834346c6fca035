"""A recorder's step-log file (docs/engines.md, "What the recorder never does to the
engine"): opened without blocking, without replacing a file and without following a link,
and written by a thread of its own, so that the engine only hands each line over.

``open_log(path)`` creates ``path`` (``O_CREAT|O_EXCL|O_NOFOLLOW``). A regular file already
there (a restarted server's log; containers repeat pids) is kept, and the first free name of
``NAME.1.jsonl``, ``NAME.2.jsonl``... is written instead. A symbolic link is refused. A FIFO
or a character device (``/dev/null``) is written as it is; a FIFO nobody reads yet is opened
by the writer thread when a reader comes, while the lines wait in the buffer.

``LogWriter`` hands lines to its thread through a buffer bounded in bytes. With
``block=False`` (a recorder inside a serving engine) a line that does not fit is dropped and
counted, the first drop is logged once, and before the next line that fits the log gets a
gap mark, ``{"gap": N, "after_step": S}``: N step lines dropped after step S. With
``block=True`` (a script, a test harness) the hand-over waits for room instead. A recording
that ends while lines are being dropped (``close``, ``stop``) still queues that gap mark, so
a log never ends silently short, and closing says in the process's log how many lines were
lost in all. A write that
fails (a full disk, a reader gone) stops the writer: a regular file is cut back to its last
complete line and ends with a stop mark, ``{"stopped": "why", "after_step": S}`` (the last
lines make room for it where it does not fit); the error is logged once. A log deleted
while it is written is noticed (at most a second after a write), said once, and the writer
stops: writing on would fill the disk with a file nobody can open. Replay reads a mark as
where checking ends (docs/replay.md, "Recorder marks").
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import logging
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUFFER_BYTES = 16 << 20  # lines waiting for the writer thread, at most (the process's)
CLOSE_TIMEOUT_S = 2.0  # what closing a non-blocking writer waits for its thread
DELETED_CHECK_S = 1.0  # how often a regular log is checked for having been deleted
MAX_RENAMES = 1000
MARK_ROOM_LINES = 16  # lines a stop mark may take the place of, at most
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_EXISTING = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC

log = logging.getLogger("pagedkv_sql.record")


class LogRefused(Exception):
    """The step log cannot be opened: ``str()`` says what and where, ``hint`` how to fix."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


def line(obj: dict[str, Any]) -> bytes:
    """One JSON line of a step log, as every recorder writes it."""
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def names(path: Path) -> Iterator[Path]:
    """``path``, then ``NAME.1.SUFFIX``, ``NAME.2.SUFFIX``... (the suffix kept last, so
    that ``*.jsonl`` still finds them)."""
    yield path
    stem, suffix = (path.stem, path.suffix) if path.suffix else (path.name, "")
    for i in range(1, MAX_RENAMES + 1):
        yield path.with_name(f"{stem}.{i}{suffix}")


@dataclass(frozen=True)
class Opened:
    fd: int | None  # None: a FIFO with no reader yet (the writer thread opens it)
    path: Path
    regular: bool


def open_log(path: Path) -> Opened:
    """Open ``path`` to write a new step log, never blocking, never replacing a file and
    never following a symbolic link (LogRefused says why not)."""
    for candidate in names(path):
        try:
            return Opened(os.open(candidate, _NEW, 0o666), candidate, True)
        except FileExistsError:
            pass
        except OSError as e:
            raise LogRefused(
                f"cannot create {candidate}: {e.strerror or e}",
                "name a file in a directory that exists and that the server may write",
            ) from None
        try:
            mode = os.lstat(candidate).st_mode
        except FileNotFoundError:  # removed in between: the next name
            continue
        if stat.S_ISLNK(mode):
            raise LogRefused(
                f"{candidate} is a symbolic link; a recorder never follows one (a link planted "
                "there would make the server overwrite the file it points to)",
                "name the log's real path, or remove the link",
            )
        if stat.S_ISDIR(mode):
            raise LogRefused(
                f"{candidate} is a directory", f"name a file in it: {candidate}/vllm-{{pid}}.jsonl"
            )
        if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
            return _open_stream(candidate)
        # a regular file (a previous run's log) or another kind: kept, the next name tried
    raise LogRefused(
        f"{path} and the {MAX_RENAMES} numbered names after it exist",
        "remove old logs, or put {pid} or a date in the name",
    )


def _open_stream(path: Path) -> Opened:
    """A FIFO or a character device, opened without waiting for a reader."""
    try:
        fd = os.open(path, _EXISTING | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ENXIO:  # a FIFO with no reader yet
            return Opened(None, path, False)
        raise LogRefused(
            f"cannot open {path}: {e.strerror or e}", "check its permissions"
        ) from None
    _blocking(fd)
    return Opened(fd, path, False)


def _blocking(fd: int) -> None:
    """Writes wait for the reader again (only the writer thread writes)."""
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
        os.close(fd)
        raise LogRefused("the log's path changed kind while it was opened", "try again")
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)


class LogWriter:
    """Lines handed to a thread that writes them to ``open_log(path)``'s file, in order."""

    def __init__(self, path: Path, *, block: bool, buffer_bytes: int | None = None) -> None:
        opened = open_log(path)
        self.requested, self.path, self.regular = path, opened.path, opened.regular
        self.fd = opened.fd
        self.block = block
        self.buffer_bytes = BUFFER_BYTES if buffer_bytes is None else buffer_bytes
        if self.fd is None:
            log.warning(
                "pagedkv-sql: the step log %s is a FIFO nobody reads yet: its lines wait (up "
                "to %d bytes) for a reader to open it, then are dropped and counted",
                self.path,
                self.buffer_bytes,
            )
        self.error: BaseException | None = None  # what stopped the writer
        self.dropped = self.gaps = 0  # step lines dropped, gaps marked
        self._queue: deque[tuple[int | None, bytes] | Job] = deque()
        self._queued = 0  # bytes handed over and not yet written (or jobs' data, not run)
        self._busy = False
        self._closing = False
        self._cond = threading.Condition()
        self._last_queued: int | None = None  # the last step handed over
        self._gap_lines = 0  # step lines dropped since the last one handed over
        self._gap_after: int | None = None
        self._written: int | None = None  # the last step written whole
        self._offset = 0  # bytes of whole lines written
        # (end offset, last step) of the last lines written whole: room for a stop mark
        self._ends: deque[tuple[int, int | None]] = deque(maxlen=MARK_ROOM_LINES)
        self._checked = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, name=f"pagedkv-sql {self.path.name}", daemon=True
        )
        self._thread.start()
        atexit.register(self.close)

    @property
    def alive(self) -> bool:
        """Whether the writer thread still runs (it ends at close, or when it stopped)."""
        return self._thread.is_alive()

    # -- the engine's side -----------------------------------------------------------------
    def put(self, data: bytes, step: int | None = None) -> bool:
        """Hand one line over (``step``: the step it holds); False when it was dropped (the
        buffer is full and ``block`` is off) or the writer has stopped."""
        with self._cond:
            if self._closing or self.error is not None:
                return False
            gap = b""
            if self._gap_lines:
                gap = line({"gap": self._gap_lines, "after_step": self._gap_after})
            need = len(gap) + len(data)
            while self.block and self._queued and self._queued + need > self.buffer_bytes:
                self._cond.wait(0.5)
                if self.error is not None:
                    return False
            if self._queued and self._queued + need > self.buffer_bytes:
                if not self._gap_lines:
                    self._gap_after = self._last_queued
                self._gap_lines += 1
                self.dropped += 1
                first = self.dropped == 1
            else:
                if gap:
                    self._queue.append((None, gap))
                    self.gaps += 1
                    self._gap_lines = 0
                self._queue.append((step, data))
                self._queued += need
                if step is not None:
                    self._last_queued = step
                self._cond.notify_all()
                return True
        if first:
            log.warning(
                "pagedkv-sql: the step log %s is not taken as fast as the engine writes it "
                "(a slow or absent reader, or a slow file system): step lines are dropped from "
                "step %s on and the engine never waits; each gap is marked in the log, and "
                "replay checks it up to its first gap",
                self.path,
                "?" if step is None else step,
            )
        return False

    def put_job(self, job: Callable[[], None], size: int) -> bool:
        """Run ``job()`` in the writer thread after the lines handed over before it, its
        data (``size`` bytes) counted in the buffer; False (not run) when it does not fit
        or once the writer has stopped."""
        with self._cond:
            if self._closing or self.error is not None:
                return False
            if self._queued and self._queued + size > self.buffer_bytes:
                return False
            self._queue.append(Job(job, size))
            self._queued += size
            self._cond.notify_all()
            return True

    def stop(self, why: str) -> None:
        """End the log with a stop mark after the lines handed over (and the gap mark of
        the lines dropped last, if any), then close; never waits."""
        with self._cond:
            if not self._closing and self.error is None:
                self._mark_gap()
                mark = {"stopped": why, "after_step": self._last_queued}
                self._queue.append((None, line(mark)))
        self.close(0.0)

    def _mark_gap(self) -> None:
        """Queue the gap mark of the step lines dropped since the last one handed over,
        whatever room is left (the log ends with it: never silently short). Called with
        the lock held."""
        if self._gap_lines:
            gap = line({"gap": self._gap_lines, "after_step": self._gap_after})
            self._queue.append((None, gap))
            self._queued += len(gap)
            self.gaps += 1
            self._gap_lines = 0
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every line handed over is written (or the writer stopped)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (self._queue or self._busy) and self.error is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(0.5 if left is None else min(left, 0.5))
        return True

    def close(self, timeout: float | None = CLOSE_TIMEOUT_S) -> None:
        """Write what is handed over and close the file, waiting ``timeout`` seconds at most
        (None: as long as it takes); what is left then is said once and not written."""
        with self._cond:
            first = not self._closing
            if first and self.error is None:
                self._mark_gap()  # drops until the end: the log ends with their gap mark
            self._closing = True
            self._cond.notify_all()
        if first:
            atexit.unregister(self.close)
        if threading.current_thread() is self._thread:
            return
        if timeout != 0.0:
            self._thread.join(timeout if not self.block else None)
        left = 0
        if first and timeout != 0.0 and self._thread.is_alive():
            with self._cond:
                left = sum(1 for item in self._queue if not isinstance(item, Job))
            log.warning(
                "pagedkv-sql: %d line(s) of the step log %s were not written: its reader did "
                "not take them within %.0f s of the engine's end",
                left,
                self.path,
                timeout or 0,
            )
        if first and (self.dropped or left):
            log.warning(
                "pagedkv-sql: the step log %s lost %d line(s) in all: %d step line(s) dropped "
                "(marked in %d gap mark(s); replay checks up to the first) and %d not written "
                "at the end",
                self.path,
                self.dropped + left,
                self.dropped,
                self.gaps,
                left,
            )

    # -- the writer thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self.fd is None:
                fd = os.open(self.path, _EXISTING)  # waits for a reader of the FIFO
                _blocking(fd)
                self.fd = fd
            while True:
                with self._cond:
                    while not self._queue and not self._closing:
                        self._cond.wait()
                    if not self._queue:
                        return
                    items = list(self._queue)
                    self._queue.clear()
                    self._busy = True
                try:
                    self._write_items(items)
                finally:
                    with self._cond:
                        self._busy = False
                        self._queued -= sum(_size(i) for i in items)
                        self._cond.notify_all()
        except _Stopped:
            pass
        except BaseException as e:  # opening the FIFO, or anything unforeseen
            self._stopped(e, f"cannot write {self.path}: {_why(e)}")
        finally:
            if self.fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self.fd)

    def _write_items(self, items: list[Any]) -> None:
        batch: list[tuple[int | None, bytes]] = []
        for item in items:
            if not isinstance(item, Job):
                batch.append(item)
                continue
            self._write(batch)
            batch = []
            try:
                item.run()
            except Exception as e:  # a job reports its own errors; this is a bug of one
                log.error("pagedkv-sql: a recorder job failed: %r", e)
        self._write(batch)

    def _write(self, batch: list[tuple[int | None, bytes]]) -> None:
        if not batch:
            return
        data = b"".join(b for _, b in batch)
        done = 0
        try:
            while done < len(data):
                done += os.write(self.fd, data[done:])  # type: ignore[arg-type]
        except OSError as e:
            self._whole(batch, done)
            self._truncate()  # a regular file ends at its last complete line
            raise self._stopped(e, f"cannot write {self.path}: {_why(e)}") from None
        self._whole(batch, done)
        if self.regular and time.monotonic() - self._checked >= DELETED_CHECK_S:
            self._checked = time.monotonic()
            if os.fstat(self.fd).st_nlink == 0:  # type: ignore[arg-type]
                raise self._stopped(
                    FileNotFoundError(errno.ENOENT, "deleted", str(self.path)),
                    f"the step log {self.path} was deleted while the engine ran; the recorder "
                    "stops (writing on would fill the disk with a file nobody can open)",
                    deleted=True,
                )

    def _whole(self, batch: list[tuple[int | None, bytes]], done: int) -> None:
        """Count the lines of ``batch`` whose bytes (of the first ``done``) are written."""
        for step, b in batch:
            if len(b) > done:
                break
            done -= len(b)
            self._offset += len(b)
            if step is not None:
                self._written = step
            self._ends.append((self._offset, self._written))

    def _truncate(self) -> bool:
        """A regular file cut at ``_offset``; False where it cannot be cut."""
        if not self.regular:
            return False
        try:
            os.ftruncate(self.fd, self._offset)  # type: ignore[arg-type]
            os.lseek(self.fd, self._offset, os.SEEK_SET)  # type: ignore[arg-type]
        except OSError:
            return False
        return True

    def _stopped(self, error: BaseException, why: str, deleted: bool = False) -> _Stopped:
        """The writer stops: the error said once, and a regular file ends with a stop mark,
        whole, after its last complete line (the last lines given up for it when it does
        not fit otherwise)."""
        while self.regular and not deleted and self.fd is not None:
            mark = line({"stopped": why, "after_step": self._written})
            with contextlib.suppress(OSError):
                if os.write(self.fd, mark) == len(mark):
                    break
            if not self._truncate() or len(self._ends) < 2:  # no partial mark left
                break
            self._ends.pop()  # room for the mark: the last line goes
            self._offset, self._written = self._ends[-1]
            if not self._truncate():
                break
        after = "before its first step" if self._written is None else f"after step {self._written}"
        log.error("pagedkv-sql: the step recorder stopped %s (the engine goes on): %s", after, why)
        with self._cond:  # said before anyone sees it stopped
            self.error = error
            self._queue.clear()
            self._cond.notify_all()
        return _Stopped()


@dataclass(frozen=True)
class Job:
    """Work for the writer thread, in line with the lines (a snapshot to save)."""

    run: Callable[[], None]
    size: int  # the bytes of data it holds, counted in the buffer


def _size(item: tuple[int | None, bytes] | Job) -> int:
    return item.size if isinstance(item, Job) else len(item[1])


class _Stopped(Exception):
    """Ends the writer thread after ``_stopped`` said why."""


def _why(e: BaseException) -> str:
    return (e.strerror or str(e)) if isinstance(e, OSError) else repr(e)
