"""Recorded KV-cache event streams: a file, a FIFO or stdin, checked whole.

`check_stream` checks a stream as it is read (memory bounded by the cache the events
describe, not by the stream's length) and, given a Database, stores its events in
`engine_kv_event`, all or nothing, once (`pagedkv-sql kv-events`: a stream whose bytes were
stored already is checked and not stored again, live/store.py). `read_kv_events` lists the
events of a file and `check_kv_events` checks such a list. Each check gives a `KVReport`.
Every layout (vLLM and SGLang msgpack, TensorRT-LLM JSON, Dynamo JSON Lines) is decoded by
`live.decode`, and checked by `live.checker`, as `watch` checks a live stream.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..errors import InputError, UsageError
from .checker import CHECKS, MAX_HASHES, Checker, KVFinding
from .decode import ENGINES, Batch, Engine, batches

if TYPE_CHECKING:
    import duckdb

    from ..database import Database

__all__ = [
    "CHECKS",
    "KVEvent",
    "KVFinding",
    "KVReport",
    "check_events",
    "check_kv_events",
    "check_stream",
    "open_events",
    "read_kv_events",
]


@dataclass(frozen=True)
class KVEvent:
    position: int  # 0-based, in the order read
    where: str  # file:line (JSON) or file@byte offset (msgpack)
    stream: str  # worker / data-parallel rank the sequence numbers belong to
    seq: int | None
    kind: str  # stored, removed, cleared, updated, created
    hashes: tuple[Any, ...]
    parent: Any
    medium: str | None
    group: int | None
    batch: Batch


@dataclass
class KVReport:
    """What a check of KV-cache events found: the events and batches read, the events of
    each kind (`counts`: stored, removed, cleared, updated, created), the findings of each
    check (all of them counted), the findings kept, and the rows stored in
    `engine_kv_event`."""

    events: int
    batches: int
    counts: dict[str, int]
    findings_by_check: dict[str, int]
    findings: list[KVFinding] = field(default_factory=list)  # the first `keep` of them
    rows: int = 0  # rows written to engine_kv_event
    notes: list[str] = field(default_factory=list)  # what the checker said (a cap reached)
    stored_before: tuple[str, int] | None = None  # with a db: the same bytes' earlier load

    @property
    def total(self) -> int:
        return sum(self.findings_by_check.values())

    @property
    def ok(self) -> bool:
        return self.total == 0

    @property
    def stored(self) -> int:
        return self.counts["stored"]

    @property
    def removed(self) -> int:
        return self.counts["removed"]

    @property
    def cleared(self) -> int:
        return self.counts["cleared"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "batches": self.batches,
            **self.counts,
            "findings_by_check": self.findings_by_check,
            "total_findings": self.total,
            "findings": [f.to_dict() for f in self.findings],
        }


def _report(checker: Checker, kept: list[KVFinding], rows: int = 0) -> KVReport:
    return KVReport(
        checker.events,
        checker.batches,
        dict(checker.counts),
        dict(checker.findings),
        kept,
        rows,
        checker.take_notes(),
    )


def check_stream(
    stream: IO[bytes],
    source: str,
    *,
    engine: Engine = "auto",
    db: Database | None = None,
    keep: int | None = 1000,
    on_commit: Callable[[KVReport], None] | None = None,
    max_hashes: int = MAX_HASHES,
) -> KVReport:
    """Check a recorded stream (JSON or msgpack, told by content), keeping its first
    ``keep`` findings (None: all). With ``db``, its events are also appended to
    `engine_kv_event` in one transaction: a stream refused stores nothing, and a stream
    whose bytes were stored before is not stored again (``stored_before`` says by which
    load). ``on_commit`` hears the report right after the COMMIT (before a Ctrl-C that came
    during it); ``max_hashes``: the checker's bound."""
    if db is None:
        return _check(stream, source, engine, None, keep, max_hashes)
    import duckdb

    from ..dbutil import rollback
    from ..paths import database_io_error
    from .store import Digest, earlier_load, record_load, signals_held

    digest = Digest(stream)
    committed = False
    with db.cursor("kv-events", write=True) as cur:
        try:
            cur.execute("BEGIN")
            report = _check(digest, source, engine, cur, keep, max_hashes)
            sha256 = digest.hexdigest()
            report.stored_before = earlier_load(cur, sha256)
            if report.stored_before is not None:
                rollback(cur)  # the same bytes: their rows are there already
                report.rows = 0
                return report
            record_load(cur, sha256, source, report.rows, report.events)
            with signals_held():
                cur.execute("COMMIT")
                committed = True
                if on_commit is not None:
                    on_commit(report)
        except duckdb.Error as e:
            if not committed:
                rollback(cur)
            if isinstance(e, duckdb.InterruptException):
                raise KeyboardInterrupt from None  # a Ctrl-C inside a statement
            raise database_io_error(db.path, e, "store the events in") from None
        except BaseException:
            if not committed:
                rollback(cur)
            raise
    return report


def _check(
    stream: IO[bytes] | Any,
    source: str,
    engine: Engine,
    con: duckdb.DuckDBPyConnection | None,
    keep: int | None,
    max_hashes: int = MAX_HASHES,
) -> KVReport:
    checker = Checker(max_hashes)
    kept: list[KVFinding] = []
    recorder = None
    if con is not None:
        from .store import Recorder

        recorder = Recorder(con)
    for b in batches(stream, source, engine):
        if recorder is not None:
            recorder.add(source, b, checker.events)
        for f in checker.feed(source, b):
            if keep is None or len(kept) < keep:
                kept.append(f)
    if recorder is not None:
        recorder.flush()
    return _report(checker, kept, recorder.rows if recorder is not None else 0)


def open_events(path: str | os.PathLike[str]) -> IO[bytes]:
    """A recorded stream opened for reading: a file, a FIFO, or `-` for stdin; its plain
    bytes when it is gzip or zstd (told by content, whatever its name)."""
    import sys

    from .. import compression

    if str(path) == "-":  # gzip or zstd told by their first bytes, as every reader does
        return compression.reader(sys.stdin.buffer, "<stdin>")
    p = check_events(path)
    try:
        return compression.open_input(p, str(p))
    except OSError as e:
        raise InputError(f"cannot read {p}: {e.strerror}") from None


def check_events(path: str | os.PathLike[str]) -> Path:
    """The path of a recorded stream, refused now if it is missing or a directory."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except OSError:
        raise InputError(f"no KV event file at {p}") from None
    if stat.S_ISDIR(mode):
        raise InputError(f"{p} is a directory, not a KV event file")
    return p


def _iter_batches(path: str | os.PathLike[str], engine: Engine = "auto") -> Iterator[Batch]:
    source = "<stdin>" if str(path) == "-" else str(path)
    stream = open_events(path)
    try:
        yield from batches(stream, source, engine)
    finally:
        if str(path) != "-":
            stream.close()


def read_kv_events(path: str | os.PathLike[str], engine: Engine = "auto") -> list[KVEvent]:
    """Every event of a recorded stream, in order; an unreadable stream is refused whole."""
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r} ({', '.join(ENGINES)})")
    out: list[KVEvent] = []
    for b in _iter_batches(path, engine):
        for e in b.events:
            out.append(
                KVEvent(
                    len(out),
                    b.where,
                    b.stream,
                    b.seq,
                    e.kind,
                    tuple(e.hashes),
                    e.parent,
                    e.medium,
                    e.group,
                    b,
                )
            )
    return out


def check_kv_events(events: list[KVEvent], source: str = "") -> KVReport:
    """Check listed events (batch by batch, as they were read); every finding is kept."""
    checker = Checker()
    findings: list[KVFinding] = []
    last: Batch | None = None
    for e in events:
        if e.batch is not last:
            findings += checker.feed(source, e.batch)
            last = e.batch
    return _report(checker, findings)
