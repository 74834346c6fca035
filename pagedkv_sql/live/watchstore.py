"""What `watch --db` keeps: the KV events watched, appended to `engine_kv_event` and
committed as they come (at most every `FLUSH_S`), and one step log, stored at the end as
`replay` stores a log.

The database holds one step log (`replay_event`), so a watch stores at most one and never
replaces one: a second step-log file, or a file step log while the database holds one
already, is refused before anything is read; a step log found later (stdin, a followed file,
a log that starts again after a rotation) is checked, not stored, and said. A step log's
lines are copied as they are checked into a file beside the database (`spool`), never held
in memory, and stored from it at the end: the lines read, up to a line that could not be
read.

At the end the events are committed first, then the step log is stored in one transaction
of its own: a second SIGINT/SIGTERM then stops that store (rolled back) and nothing
committed is lost; `Stored` says exactly what was stored and what was not.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import PagedKVError, UsageError
from ..paths import database_io_error

if TYPE_CHECKING:
    from .decode import Batch
    from .steplog import Segment, StepLog

FLUSH_S = 0.5  # database appends at most this often (and at the end)


@dataclass
class Stored:
    """What a watch stored, and what it did not (each said as a line)."""

    events: int = 0  # rows of engine_kv_event committed
    log: str | None = None  # the step log stored, described
    not_stored: list[str] = field(default_factory=list)
    interrupted: str | None = None  # the signal that stopped the step log's store


class WatchStore:
    """The write cursor ``con`` of ``path`` from the watch's start to its end."""

    def __init__(self, con: Any, path: str, on_commit: Callable[[str], None] | None) -> None:
        import duckdb

        from ..replay.engine import has_log
        from .store import Recorder

        self.con = con
        self.path = path
        self.on_commit = on_commit
        self.errors: tuple[type[Exception], ...] = (duckdb.Error,)
        self.had_log = has_log(con)
        self.stored = Stored()
        self.failed: PagedKVError | None = None
        self.spool_dir: str | None = None
        self.first_log: StepLog | None = None  # the log a step log may be stored from
        con.execute("BEGIN")
        self.recorder = Recorder(con)

    # -- refusals before the watch starts -------------------------------------------------
    def refuse_step_logs(self, logs: list[str]) -> None:
        """The file sources that are step logs: more than one, or one while the database
        holds a step log, is refused (nothing read, nothing written)."""
        if len(logs) > 1:
            raise UsageError(
                f"--db stores one step log, and {len(logs)} sources are step logs "
                f"({', '.join(logs)})",
                hint="watch each with a --db of its own (or without --db); "
                "`pagedkv-sql replay LOG --db DB` stores one",
            )
        if logs and self.had_log:
            raise UsageError(
                f"{self.path} holds a step log already; watch --db never replaces one "
                f"({logs[0]} is a step log)",
                hint="give another --db, or replace the stored log on purpose: "
                f"`pagedkv-sql replay {logs[0]} --db {self.path}`",
            )

    # -- as it goes -----------------------------------------------------------------------
    def spool_for(self, log: StepLog) -> None:
        """Copy ``log``'s first log into a spool, if it is the first step log met and the
        database holds none: the one that may be stored."""
        if self.first_log is not None or self.had_log:
            return
        if self.spool_dir is None:
            here = Path(self.path).parent if self.path != ":memory:" else None
            self.spool_dir = tempfile.mkdtemp(
                prefix=".pagedkv-watch-", dir=str(here) if here is not None else None
            )
        self.first_log = log
        log.spool_to(self.spool_dir)

    def add(self, source: str, batch: Batch, first_event: int) -> None:
        if self.failed is None:
            self._guarded(lambda: self.recorder.add(source, batch, first_event))

    def flush(self) -> None:
        """Append and commit what was gathered (the next transaction begins at once)."""
        if self.failed is None:
            self._guarded(self._commit)

    def _commit(self) -> None:
        self.recorder.flush()
        self.con.execute("COMMIT")
        self.stored.events = self.recorder.rows
        if self.on_commit is not None and self.recorder.rows:
            self.on_commit(f"{self.recorder.rows} event row(s) were stored in {self.path}")
        self.con.execute("BEGIN")

    def _guarded(self, work: Callable[[], None]) -> None:
        try:
            work()
        except self.errors as e:
            from ..dbutil import rollback

            rollback(self.con)
            self.failed = database_io_error(self.path, e, "store what was watched in")
            kept = self.stored.events
            self.failed.message += (
                f" ({kept} event row(s) committed before it are kept)" if kept else ""
            )

    # -- the end ----------------------------------------------------------------------------
    def finish_events(self) -> None:
        """The last events, committed."""
        if self.failed is None:
            self._guarded(self._last_commit)

    def _last_commit(self) -> None:
        self.recorder.flush()
        self.con.execute("COMMIT")
        self.stored.events = self.recorder.rows
        if self.on_commit is not None and self.recorder.rows:
            self.on_commit(f"{self.recorder.rows} event row(s) were stored in {self.path}")

    def store_log(self, logs: list[StepLog], interruptible: Any) -> None:
        """Store the first step log met (from its spool) in one transaction; say each log
        not stored. ``interruptible``: a context in which a signal stops the store."""
        for log in logs:
            for seg in log.segments:
                if log is self.first_log and seg is log.segments[0]:
                    continue
                if seg.lines:
                    self._not_stored(log.source, seg, "the database holds one step log")
        first = self.first_log
        if first is None or not first.segments[0].lines or self.failed is not None:
            return
        log = first
        for each in logs:
            each.close()
        seg = log.segments[0]
        if self.stored.interrupted is not None:
            self._not_stored(log.source, seg, f"stopped by a second {self.stored.interrupted}")
            return
        from ..replay.engine import store

        assert seg.spool is not None
        try:
            with interruptible():
                store(self.con, seg.spool)
        except PagedKVError as e:
            self._not_stored(log.source, seg, e.message)
            return
        except BaseException as e:
            if not self._interrupt(e):
                if not isinstance(e, self.errors):
                    raise
                self._not_stored(log.source, seg, str(database_io_error(self.path, e, "store in")))
                return
            if not self._stored_after_all():  # the signal may have come after the COMMIT
                self._not_stored(log.source, seg, "interrupted while it was stored")
                return
        cut = f" (up to {seg.broken.split(': ')[0]}, which cannot be read)" if seg.broken else ""
        self.stored.log = f"the step log of {_log_name(log.source, seg)} ({seg.lines} line(s)){cut}"
        if self.on_commit is not None:
            self.on_commit(f"{self.stored.log} was stored in {self.path}")

    def _interrupt(self, e: BaseException) -> bool:
        """A signal: between statements a KeyboardInterrupt; inside one DuckDB's
        InterruptException, or a RuntimeError "Query interrupted" from a result fetched."""
        return isinstance(e, KeyboardInterrupt) or (
            isinstance(e, (RuntimeError, *self.errors)) and "interrupt" in str(e).lower()
        )

    def _stored_after_all(self) -> bool:
        """After an interrupt of the step log's store: whether its COMMIT came first (the
        transaction, if still open, is rolled back; a database that cannot say, not stored)."""
        from ..dbutil import rollback
        from ..replay.engine import has_log

        rollback(self.con)
        try:
            return has_log(self.con)
        except self.errors:
            return False

    def _not_stored(self, source: str, seg: Segment, why: str) -> None:
        self.stored.not_stored.append(
            f"the step log of {_log_name(source, seg)} ({seg.lines} line(s)) was checked, "
            f"not stored: {why}"
        )

    def close(self) -> None:
        """Remove the spools (their lines are stored, or said not stored)."""
        if self.spool_dir is not None:
            shutil.rmtree(self.spool_dir, ignore_errors=True)
            self.spool_dir = None
        with contextlib.suppress(*self.errors):
            if self.failed is not None:
                self.con.execute("ROLLBACK")


class Signals:
    """SIGINT and SIGTERM while a watch runs (main thread only): the first stops it
    (``first``); any after it, even one before the watch saw the first, is recorded
    (``late``: what is left of the end is not done), and one while the step log is stored
    (inside ``storing``) also stops that store (a KeyboardInterrupt, which rolls it back)."""

    def __init__(self, first: Callable[[str], None], late: Callable[[str], None]) -> None:
        self.first = first
        self.late = late
        self.phase = "watch"  # watch, then finish, then store (for the time of the store)
        self.stopping = False  # the first signal came (the watch may not have seen it yet)
        self.old: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.old[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self.old.items():
            signal.signal(sig, handler)
        self.old = {}

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.phase == "watch" and not self.stopping:
            self.stopping = True
            self.first(name)
            return
        self.late(name)
        if self.phase == "store":
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def storing(self) -> Iterator[None]:
        self.phase = "store"
        try:
            yield
        finally:
            self.phase = "finish"


def _log_name(source: str, seg: Segment) -> str:
    if seg.number == 1:
        return source
    return f"{source} (its log {seg.number}, from line {seg.first_line})"


__all__ = ["FLUSH_S", "Signals", "Stored", "WatchStore"]
