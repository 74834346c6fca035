"""`pagedkv-sql watch`: follow running engines and name a broken invariant as it happens.

Sources (threads, `live.sources`) put batches and step-log lines on one queue; this loop
checks each as it comes (`live.checker` for KV events, `live.steplog` for step logs), writes
each finding at once (flushed: within the 100 ms of its batch that the issue asks), records
what it watched into the Database it is given (`--db`: `engine_kv_event`, and the step log
as `replay` stores it), and ends on SIGINT/SIGTERM, `--exit-on-finding`, or when every
source ended, with a summary and a committed database.
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

from ..errors import UsageError
from ..formats import printable
from .checker import CHECKS, Checker, KVFinding
from .decode import Engine
from .sources import FollowSource, Item, Source, StreamSource, ZmqSource
from .steplog import StepFinding, StepLog

if TYPE_CHECKING:
    from ..database import Database

FLUSH_S = 0.5  # database appends at most this often (and at the end)


@dataclass
class WatchOptions:
    sources: list[str]
    replay_endpoints: list[str] = field(default_factory=list)
    topic: str = ""
    bind: bool = False
    follow: bool = False
    fmt: str = "text"
    exit_on_finding: bool = False
    metrics_port: int | None = None
    engine: Engine = "auto"
    duration: float | None = None  # stop after this many seconds (tests, benchmarks)
    max_findings_shown: int | None = None


@dataclass
class WatchSummary:
    sources: list[str]
    events: int
    batches: int
    gaps: int
    findings: dict[str, int]
    problems: int
    unverifiable: int
    step_lines: int
    seconds: float
    stopped_by: str
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.findings.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "summary",
            "sources": self.sources,
            "events": self.events,
            "batches": self.batches,
            "gaps": self.gaps,
            "findings": self.findings,
            "total_findings": self.total,
            "problems": self.problems,
            "unverifiable": self.unverifiable,
            "step_lines": self.step_lines,
            "seconds": round(self.seconds, 3),
            "stopped_by": self.stopped_by,
        }


class Watch:
    """A watch of the sources ``opts`` names: findings and summary lines written to ``out``,
    notes to ``err``; with ``db``, what was watched is appended to it (``run`` holds one
    write cursor of it from start to end)."""

    def __init__(
        self,
        opts: WatchOptions,
        out: IO[str],
        err: Callable[[str], None],
        db: Database | None = None,
        stdin: IO[bytes] | None = None,
    ) -> None:
        self.opts = opts
        self.out = out
        self.err = err
        self.db = db
        self.con: Any = None  # the write cursor of ``db`` while ``run`` runs
        self.stdin = stdin
        self.queue: queue.Queue[Item] = queue.Queue()  # sources' ends and errors
        self.lock = threading.Lock()  # one source's item, or the main loop's work, at a time
        self.sink = _Direct(self)
        self.stop = threading.Event()
        self.checker = Checker()
        self.steplogs: dict[str, StepLog] = {}
        self.problems = 0
        self.stopped_by = "end of input"
        self.metrics: Any = None
        self.recorder: Any = None
        self._first_finding = False
        self._shown = 0
        self.sources: list[Source] = []
        self.notes: list[str] = []
        self.closed = False  # the loop has ended: sources' late items are dropped

    # -- sources --------------------------------------------------------------------------
    def _make_sources(self) -> None:
        replays = list(self.opts.replay_endpoints)
        zmqs = [s for s in self.opts.sources if s.startswith(("zmq://", "tcp://"))]
        if len(replays) > len(zmqs):
            raise UsageError(
                f"{len(replays)} --replay-endpoint(s) for {len(zmqs)} zmq:// source(s)",
                hint="give one --replay-endpoint per zmq:// source, in the same order",
            )
        names = set()
        for s in self.opts.sources:
            if s in names:
                raise UsageError(f"{s} is given twice")
            names.add(s)
            if s.startswith(("zmq://", "tcp://")):
                try:
                    import zmq  # noqa: F401
                except ImportError:
                    raise UsageError(
                        "watching a zmq:// source needs pyzmq",
                        hint="pip install 'pagedkv-sql[live]'",
                    ) from None
                replay = replays.pop(0) if replays else None
                self.sources.append(
                    ZmqSource(
                        s,
                        self.sink,
                        self.stop,
                        replay=replay,
                        topic=self.opts.topic,
                        engine=self.opts.engine,
                        bind=self.opts.bind,
                    )
                )
            elif s == "-":
                stream = self.stdin if self.stdin is not None else sys.stdin.buffer
                self.sources.append(
                    StreamSource("<stdin>", self.sink, self.stop, stream, self.opts.engine)
                )
            elif self.opts.follow:
                self.sources.append(FollowSource(s, self.sink, self.stop, s))
            else:
                from .recorded import check_events

                check_events(s)
                self.sources.append(StreamSource(s, self.sink, self.stop, s, self.opts.engine))

    # -- output ---------------------------------------------------------------------------
    def _write(self, obj: dict[str, Any], text: str) -> None:
        if self.opts.fmt == "jsonl":
            self.out.write(json.dumps(obj, default=str) + "\n")
        else:
            self.out.write(printable(text) + "\n")
        self.out.flush()

    def _kv_finding(self, f: KVFinding, item: Item) -> None:
        if self.metrics is not None:
            self.metrics.findings.labels(f.source, f.check).inc()
        self._shown += 1
        limit = self.opts.max_findings_shown
        if limit is None or self._shown <= limit:
            obj = {"type": "finding", **f.to_dict()}
            if item.batch is not None:
                obj["ts"] = item.batch.ts
                obj["received"] = item.received
            obj["reported"] = time.time()
            where = f.where if f.where.startswith(f.source) else f"{f.source} {f.where}"
            self._write(obj, f"{where}: {f.check}: {f.message}")
        self._first_finding = True

    def _step_finding(self, f: StepFinding) -> None:
        if self.metrics is not None:
            self.metrics.findings.labels(f.source, f.invariant).inc()
        self._shown += 1
        limit = self.opts.max_findings_shown
        if limit is None or self._shown <= limit:
            obj = {"type": "finding", **f.to_dict(), "reported": time.time()}
            self._write(obj, f"{f.source} step {f.step}: {f.invariant}: {f.message}")
        self._first_finding = True

    def _note(self, source: str, message: str, kind: str = "note") -> None:
        self.notes.append(f"{source}: {message}")
        if self.opts.fmt == "jsonl":
            self._write({"type": kind, "source": source, "message": message}, "")
        else:
            self.err(printable(f"{source}: {message}"))

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> WatchSummary:
        """Watch until a stop (a signal, --duration, --exit-on-finding, the end of every
        source); the summary."""
        if self.db is None:
            return self._run()
        with self.db.cursor("watch", write=True) as cur:
            self.con = cur
            try:
                return self._run()
            finally:
                self.con = None

    def _run(self) -> WatchSummary:
        started = time.monotonic()
        self._make_sources()
        if self.opts.metrics_port is not None:
            try:
                from .metrics import Metrics
            except ImportError:
                raise UsageError(
                    "--metrics-port needs prometheus-client", hint="pip install 'pagedkv-sql[live]'"
                ) from None
            try:
                self.metrics = Metrics(self.opts.metrics_port)
            except OSError as e:
                raise UsageError(
                    f"--metrics-port {self.opts.metrics_port}: {e.strerror}",
                    hint="choose a free port",
                ) from None
        if self.con is not None:
            from .store import Recorder

            self.con.execute("BEGIN")
            self.recorder = Recorder(self.con)
        old = self._signals()
        try:
            for s in self.sources:
                s.start()
            self._loop(started)
        finally:
            self.stop.set()
            for s in self.sources:
                s.join(timeout=2.0)
            self.closed = True
            self._restore(old)
            try:
                self._finish_db()
            finally:
                if self.metrics is not None:
                    self.metrics.close()
        c = self.checker
        findings = {k: v for k, v in c.findings.items() if v}
        for log in self.steplogs.values():
            for k, v in log.counts.items():
                findings[k] = findings.get(k, 0) + v
        return WatchSummary(
            [s.source for s in self.sources],
            c.events,
            c.batches,
            c.gaps,
            findings,
            self.problems,
            c.unverifiable,
            sum(len(x.lines) for x in self.steplogs.values()),
            time.monotonic() - started,
            self.stopped_by,
            self.notes,
        )

    def _signals(self) -> dict[int, Any]:
        old: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return old

        def stop(signum: int, frame: FrameType | None) -> None:
            self.stopped_by = signal.Signals(signum).name
            self.stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, stop)
        return old

    @staticmethod
    def _restore(old: dict[int, Any]) -> None:
        for sig, handler in old.items():
            signal.signal(sig, handler)

    def _loop(self, started: float) -> None:
        live = len(self.sources)
        last_flush = time.monotonic()
        deadline = None if self.opts.duration is None else started + self.opts.duration
        while live and not self.stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                self.stopped_by = "duration"
                break
            with contextlib.suppress(queue.Empty):
                live -= self._handle(self.queue.get(timeout=0.05))
            with self.lock:
                self._check_steplogs(time.monotonic())
                if self.recorder is not None and time.monotonic() - last_flush >= FLUSH_S:
                    self._flush_db()
                    last_flush = time.monotonic()
        if self._stop_now():
            self.stopped_by = "finding"
        elif self.stop.is_set() and self.stopped_by == "end of input":
            self.stopped_by = "stopped"
        self.stop.set()
        for src in self.sources:
            src.join(timeout=2.0)
        with self.lock:
            self.closed = True
            while True:  # a source's error after its last batch
                try:
                    self._handle(self.queue.get_nowait())
                except queue.Empty:
                    break
            # the end of input: the step logs in full
            for log in self.steplogs.values():
                if not self._stop_now() and len(log.lines) > log.checked_lines and not log.broken:
                    for f in log.check():
                        self._step_finding(f)
                        if self._stop_now():
                            break
                self._said_mark(log)
                if log.broken:
                    why = f"not checked past a malformed line: {log.broken}"
                    self._note(log.source, why, "problem")
        if self._stop_now():
            self.stopped_by = "finding"

    def _stop_now(self) -> bool:
        return self.opts.exit_on_finding and self._first_finding

    def _handle(self, item: Item) -> int:
        """Handle one item; 1 when it is a source's end."""
        m = self.metrics
        if item.kind == "batch":
            assert item.batch is not None
            b = item.batch
            if self.recorder is not None:
                self.recorder.add(item.source, b, self.checker.events)
            gaps = self.checker.gaps
            for f in self.checker.feed(item.source, b):
                self._kv_finding(f, item)
            if m is not None:
                m.events.labels(item.source).inc(len(b.events))
                m.batches.labels(item.source).inc()
                if self.checker.gaps != gaps:
                    m.gaps.labels(item.source).inc()
                if b.ts is not None:
                    m.lag.labels(item.source).set(max(0.0, time.time() - b.ts))
        elif item.kind == "line":
            assert item.line is not None
            log = self.steplogs.get(item.source)
            if log is None:
                log = self.steplogs[item.source] = StepLog(item.source)
            log.add(item.line)
            if m is not None:
                m.batches.labels(item.source).inc()
        elif item.kind == "problem":
            self.problems += 1
            self._note(item.source, item.message, "problem")
        elif item.kind == "partial":
            self.checker.joined_late(item.source)
            self._note(
                item.source,
                f"{item.message}: removals and parents of blocks stored before it are not "
                "checked until its next AllBlocksCleared",
            )
        elif item.kind == "restart":
            self.checker.restart(item.source)
            self._note(item.source, f"the publisher started again ({item.message})")
        elif item.kind == "note":
            self._note(item.source, item.message)
        elif item.kind == "error":
            assert item.error is not None
            raise item.error
        elif item.kind == "end":
            return 1
        return 0

    def _check_steplogs(self, now: float) -> None:
        for log in self.steplogs.values():
            if log.due(now):
                for f in log.check():
                    self._step_finding(f)
                self._said_mark(log)

    def _said_mark(self, log: StepLog) -> None:
        """A recorder's mark in a step log, said once."""
        if log.mark is not None and not log.mark_said:
            log.mark_said = True
            self._note(log.source, log.mark)

    # -- the database ---------------------------------------------------------------------
    def _flush_db(self) -> None:
        assert self.recorder is not None
        self.recorder.flush()
        self.con.execute("COMMIT")
        self.con.execute("BEGIN")

    def _finish_db(self) -> None:
        if self.con is None or self.recorder is None:
            return
        self.recorder.flush()
        self.con.execute("COMMIT")
        for log in self.steplogs.values():
            if log.lines and log.broken is None:
                import io

                from ..replay.engine import store

                store(self.con, io.BytesIO(log.data()))


class _Direct:
    """Where sources put their items: handled at once in the source's own thread, under the
    watch's lock (no hand-over to the main loop, so a finding is written as soon as its
    batch is decoded); a source's end and errors go to the main loop's queue."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch

    def put(self, item: Item) -> None:
        w = self.watch
        if item.kind in ("end", "error"):
            w.queue.put(item)
            return
        with w.lock:
            if w.closed or w._stop_now():
                return
            w._handle(item)
            if w._stop_now():
                w.stop.set()


def summary_text(s: WatchSummary) -> str:
    found = ", ".join(f"{k} {v}" for k, v in sorted(s.findings.items())) or "none"
    lines = [
        f"watched {len(s.sources)} source(s) ({s.stopped_by}): "
        f"{s.events} event(s) in {s.batches} batch(es), {s.step_lines} step-log line(s), "
        f"{s.gaps} sequence gap(s)",
        f"{s.total} finding(s): {found}",
    ]
    if s.problems:
        lines.append(f"{s.problems} unreadable message(s) or line(s)")
    if s.unverifiable:
        lines.append(
            f"{s.unverifiable} removal(s)/parent(s) not checkable (before the watch joined)"
        )
    return "\n".join(lines)


__all__ = ["CHECKS", "Watch", "WatchOptions", "WatchSummary", "summary_text"]
