"""`pagedkv-sql watch`: follow running engines and name a broken invariant as it happens.

Sources (threads: live/sources.py, live/subscriber.py) hand over what they read. A batch of
KV events is checked at once in its source's thread, under the watch's lock (`live.checker`:
a finding is written, flushed, within the 100 ms of its batch that the issue asks). A
step-log line is queued for this loop, which checks each step log window by window
(`live.steplog`) without holding the lock: a source reading a FIFO never waits for a check,
only, past `MAX_HELD_BYTES` of lines not yet checked, for the checks to catch up. With a
Database, what was watched is kept by `live.watchstore`. The watch ends on SIGINT/SIGTERM,
`--duration`, `--exit-on-finding`, a reader gone from stdout, or when every source ended and
its lines were checked, with a summary.
"""

from __future__ import annotations

import json
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from .. import findings
from ..errors import UsageError
from ..formats import printable
from .checker import CHECKS, Checker, KVFinding
from .decode import Engine
from .endpoints import open_sources
from .sources import Item, Source
from .steplog import StepFinding, StepLog
from .steplogs import StepLogs
from .watchstore import FLUSH_S, Signals, Stored, WatchStore

if TYPE_CHECKING:
    from ..database import Database

JOIN_S = 2.0  # how long the sources (all at once) get to end after a stop


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
    metrics_host: str = "127.0.0.1"
    engine: Engine = "auto"
    duration: float | None = None  # stop after this many seconds (tests, benchmarks)
    max_findings_shown: int | None = None
    max_hashes: int | None = None  # the checker's cap (None: its default)


@dataclass
class WatchSummary:
    sources: list[str]
    events: int
    batches: int
    gaps: int
    findings: dict[str, int]  # by check
    problems: int
    unverifiable: int
    step_lines: int
    seconds: float
    stopped_by: str
    notes: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)  # sources nothing was read from, why
    stored: Stored | None = None  # with a database: what was stored, what was not
    ideas: dict[str, str] = field(default_factory=dict)  # check: the idea it breaks

    def by_idea(self) -> dict[str, int]:
        """The counts by the idea each check breaks (as `replay`'s summary counts)."""
        out: dict[str, int] = {}
        for check, n in self.findings.items():
            name = self.ideas.get(check, check)
            out[name] = out.get(name, 0) + n
        return dict(sorted(out.items()))

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
            "invariants": self.by_idea(),
            "total_findings": self.total,
            "problems": self.problems,
            "unverifiable": self.unverifiable,
            "step_lines": self.step_lines,
            "seconds": round(self.seconds, 3),
            "stopped_by": self.stopped_by,
        }


class Watch:
    """A watch of the sources ``opts`` names: findings and summary lines written to ``out``,
    notes to ``err``; with ``db``, what was watched is kept in it (``run`` holds one write
    cursor of it from start to end; ``on_commit`` hears each commit)."""

    def __init__(
        self,
        opts: WatchOptions,
        out: IO[str],
        err: Callable[[str], None],
        db: Database | None = None,
        stdin: IO[bytes] | None = None,
        on_commit: Callable[[str], None] | None = None,
    ) -> None:
        self.opts = opts
        self.out = out
        self.err = err
        self.db = db
        self.on_commit = on_commit
        self.store: WatchStore | None = None
        self.stdin = stdin
        self.queue: queue.Queue[Item] = queue.Queue()  # all but batches, in order
        self.lock = threading.RLock()  # a batch's check, the output, the database
        self.sink = _Direct(self)
        self.stop = threading.Event()
        self.checker = Checker() if opts.max_hashes is None else Checker(opts.max_hashes)
        self.logs = StepLogs(self.stop, self._new_log)
        self.steplogs = self.logs.logs  # source -> its step log
        self.problems = 0
        self.stopped_by = "end of input"
        self.metrics: Any = None
        self._first_finding = False
        self._shown = 0
        self.sources: list[Source] = []
        self.notes: list[str] = []
        self.unread: list[str] = []
        self.closed = False  # the loop has ended: sources' late items are dropped
        self.output_error: OSError | None = None  # stdout gone (a reader that left)
        self.signals = Signals(self._first_signal, self._late_signal)
        self.late_signal: str | None = None
        self._unreadable = False  # a step log's line could not be read

    def _new_log(self, log: StepLog) -> None:
        if self.store is not None:
            self.store.spool_for(log)

    # -- output ---------------------------------------------------------------------------
    def _write(self, obj: dict[str, Any], text: str) -> None:
        with self.lock:
            self._write_now(obj, text)

    def _write_now(self, obj: dict[str, Any], text: str) -> None:
        if self.output_error is not None:
            return
        try:
            if self.opts.fmt == "jsonl":
                self.out.write(json.dumps(_finite(obj), default=str) + "\n")
            else:
                self.out.write(printable(text) + "\n")
            self.out.flush()
        except OSError as e:  # the reader left (| head) or stdout is full: stop
            self.output_error = e
            self.stop.set()

    def _kv_finding(self, f: KVFinding, item: Item) -> None:
        if self.metrics is not None:
            self.metrics.findings.labels(f.source, findings.invariant(f)).inc()
        self._shown += 1
        limit = self.opts.max_findings_shown
        if limit is None or self._shown <= limit:
            obj = {"type": "finding", **f.to_dict()}
            if item.batch is not None:
                obj["ts"] = item.batch.ts
                obj["received"] = item.received
            obj["reported"] = time.time()
            text = findings.line(f)
            self._write(obj, text if f.where.startswith(f.source) else f"{f.source} {text}")
        self._first_finding = True

    def _step_finding(self, f: StepFinding) -> None:
        if self.metrics is not None:
            self.metrics.findings.labels(f.source, f.invariant).inc()
        self._shown += 1
        limit = self.opts.max_findings_shown
        if limit is None or self._shown <= limit:
            obj = {"type": "finding", **f.to_dict(), "reported": time.time()}
            self._write(obj, findings.line(f))
        self._first_finding = True

    def _note(self, source: str, message: str, kind: str = "note") -> None:
        with self.lock:
            self._note_now(source, message, kind)

    def _note_now(self, source: str, message: str, kind: str) -> None:
        text = message if message.startswith(source) else f"{source}: {message}"
        self.notes.append(text)
        if kind == "problem":
            self.problems += 1
            self._unreadable = True  # with --exit-on-finding, it stops the watch as a finding
        if self.opts.fmt == "jsonl":
            self._write({"type": kind, "source": source, "message": message}, "")
        else:
            self.err(printable(text))

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> WatchSummary:
        """Watch until a stop (a signal, --duration, --exit-on-finding, the end of every
        source); the summary. A reader gone from ``out`` ends it too: the OSError is raised
        after the end (a BrokenPipeError for a reader that left)."""
        if self.db is None:
            return self._run()
        with self.db.cursor("watch", write=True) as cur:
            self.store = WatchStore(cur, self.db.path, self.on_commit)
            try:
                return self._run()
            finally:
                self.store.close()

    def _run(self) -> WatchSummary:
        started = time.monotonic()
        o = self.opts
        self.sources, step_logs = open_sources(
            o.sources, self.sink, self.stop, replays=o.replay_endpoints, topic=o.topic,
            engine=o.engine, bind=o.bind, follow=o.follow, stdin=self.stdin,
        )  # fmt: skip
        if self.store is not None:
            self.store.refuse_step_logs(step_logs)
        self._serve_metrics()
        self.signals.install()
        try:
            for s in self.sources:
                s.start()
            self._loop(started)
        finally:
            self.signals.phase = "finish"
            self.stop.set()
            self._join()
            self.closed = True
            try:
                self._finish()
            finally:
                self.signals.restore()
                if self.metrics is not None:
                    self.metrics.close()
        if self.store is not None and self.store.failed is not None:
            raise self.store.failed
        if self.output_error is not None:
            raise self.output_error
        return self._summary(started)

    def _serve_metrics(self) -> None:
        if self.opts.metrics_port is None:
            return
        try:
            from .metrics import Metrics
        except ImportError:
            raise UsageError(
                "--metrics-port needs prometheus-client", hint="pip install 'pagedkv-sql[live]'"
            ) from None
        host = self.opts.metrics_host
        try:
            self.metrics = Metrics(self.opts.metrics_port, host)
        except OSError as e:
            raise UsageError(
                f"--metrics-host {host} --metrics-port {self.opts.metrics_port}: {e.strerror or e}",
                hint="choose a free port (0: any) and an address of this host",
            ) from None
        shown = f"[{host}]" if ":" in host else host
        self._note(
            "metrics", f"serving Prometheus metrics on http://{shown}:{self.metrics.port}/metrics"
        )

    def _summary(self, started: float) -> WatchSummary:
        c = self.checker
        counts = {k: v for k, v in c.findings.items() if v}
        ideas = {k: findings.idea(KVFinding.model, k) for k in counts}
        for log in self.steplogs.values():
            for k, v in log.counts.items():
                counts[k] = counts.get(k, 0) + v
                ideas[k] = findings.idea(StepFinding.model, k)
        return WatchSummary(
            [s.source for s in self.sources],
            c.events,
            c.batches,
            c.gaps,
            counts,
            self.problems,
            c.unverifiable,
            sum(x.lines for x in self.steplogs.values()),
            time.monotonic() - started,
            self.stopped_by,
            self.notes,
            self.unread,
            self.store.stored if self.store is not None else None,
            ideas,
        )

    def _first_signal(self, name: str) -> None:
        self.stopped_by = name
        self.stop.set()

    def _late_signal(self, name: str) -> None:
        self.late_signal = name  # what is left of the end is not done
        if self.store is not None:
            self.store.stored.interrupted = name

    def _loop(self, started: float) -> None:
        live = len(self.sources)
        last_flush = time.monotonic()
        deadline = None if self.opts.duration is None else started + self.opts.duration
        while (live or self.logs.unchecked()) and not self.stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                self.stopped_by = "duration"
                break
            live -= self._drain(timeout=0.05)
            self._check_steplogs(time.monotonic(), due_only=bool(live))
            if self.store is not None and time.monotonic() - last_flush >= FLUSH_S:
                with self.lock:
                    self.store.flush()
                if self.store.failed is not None:
                    self.stop.set()
                last_flush = time.monotonic()
        if self._stop_now():
            self.stopped_by = "finding" if self._first_finding else "unreadable input"
        elif self.output_error is not None:
            self.stopped_by = "output closed"
        elif self.stop.is_set() and self.stopped_by == "end of input":
            self.stopped_by = "stopped"

    def _drain(self, timeout: float) -> int:
        """Handle the queued items (waiting up to ``timeout`` for the first); how many
        sources ended."""
        ended = 0
        try:
            item = self.queue.get(timeout=timeout)
        except queue.Empty:
            return 0
        while True:
            ended += self._handle(item)
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return ended

    def _join(self) -> None:
        """The sources, all stopped at once, get JOIN_S in all to end."""
        deadline = time.monotonic() + JOIN_S
        for s in self.sources:
            s.join(timeout=max(0.0, deadline - time.monotonic()))

    def _finish(self) -> None:
        self._drain(timeout=0)  # what the sources said last (a source never opened...)
        for log in self.steplogs.values():
            left = sum(1 for p in log.pending if p[0] == "line")
            if left and self.output_error is None:  # a reader that left wants no more
                why = "the watch stopped first" if self.late_signal is None else "stopped"
                self._note(log.source, f"{left} line(s) read were not checked ({why})")
        self.logs.close()
        if self.store is not None:
            self.store.finish_events()
            self.store.store_log(list(self.steplogs.values()), self.signals.storing)
            for line in self.store.stored.not_stored:
                self._note("--db", line, "problem")

    def _stop_now(self) -> bool:
        return self.opts.exit_on_finding and (self._first_finding or self._unreadable)

    def _handle(self, item: Item) -> int:
        """Handle one item; 1 when it is a source's end."""
        m = self.metrics
        if item.kind == "batch":
            assert item.batch is not None
            b = item.batch
            if self.store is not None:
                self.store.add(item.source, b, self.checker.events)
                if self.store.failed is not None:
                    self.stop.set()
            gaps = self.checker.gaps
            for f in self.checker.feed(item.source, b):
                self._kv_finding(f, item)
            for note in self.checker.take_notes():
                self._note(item.source, note)
            if m is not None:
                m.events.labels(item.source).inc(len(b.events))
                m.batches.labels(item.source).inc()
                if self.checker.gaps != gaps:
                    m.gaps.labels(item.source).inc()
                if b.ts is not None and math.isfinite(b.ts):
                    m.lag.labels(item.source).set(max(0.0, time.time() - b.ts))
        elif item.kind == "line":
            self.logs.add(item.source, item.number, item.line or b"", item.last)
            if m is not None:
                m.batches.labels(item.source).inc()
        elif item.kind == "reset":  # a followed step log was truncated, rewritten, replaced
            self.logs.log(item.source).restart(item.message)  # said in the log's order
        elif item.kind == "reset-events":  # a followed file of events, likewise
            self.checker.restart(item.source)
            self._note(item.source, item.message)
        elif item.kind == "problem":
            if "nothing was read" in item.message:
                m_ = item.message
                self.unread.append(m_ if m_.startswith(item.source) else f"{item.source}: {m_}")
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

    def _check_steplogs(self, now: float, due_only: bool) -> None:
        for log, found in self.logs.check(now, due_only):
            for note in log.notes:
                self._note(log.source, note)
            log.notes.clear()
            for f in found:
                self._step_finding(f)
                if self._stop_now():
                    break
            for problem in log.problems:
                self._note(log.source, problem, "problem")
            log.problems.clear()
            if self._stop_now():
                self.stop.set()
                return


_QUEUED = ("line", "reset", "end", "error")  # in the loop's order with the lines; the rest
# (batches and what changes how the next batch is checked) at once, in the batches' order


class _Direct:
    """Where sources put their items: a batch is handled at once in the source's own thread,
    under the watch's lock (no hand-over, so a finding is written as soon as its batch is
    decoded); everything else goes to the loop's queue, step-log lines only while few enough
    wait to be checked (`StepLogs.hand`)."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch

    def put(self, item: Item) -> None:
        w = self.watch
        if item.kind not in _QUEUED:
            with w.lock:
                if w.closed or w._stop_now():
                    return
                w._handle(item)
                if w._stop_now():
                    w.stop.set()
            return
        if item.kind == "line" and item.line:
            w.logs.hand(item.line)
        w.queue.put(item)


def summary_text(s: WatchSummary) -> str:
    found = ", ".join(f"{k} {v}" for k, v in s.by_idea().items()) or "none"
    lines = [
        f"watched {len(s.sources)} source(s) ({s.stopped_by}): "
        f"{s.events} event(s) in {s.batches} batch(es), {s.step_lines} step-log line(s), "
        f"{s.gaps} sequence gap(s)",
        f"{s.total} finding(s): {found}",
    ]
    if s.problems:
        lines.append(f"{s.problems} problem(s): input that could not be read or kept (above)")
    lines += s.unread
    if s.unverifiable:
        lines.append(
            f"{s.unverifiable} removal(s)/parent(s) not checkable (before the watch joined)"
        )
    return "\n".join(lines)


def _finite(obj: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN or Infinity: a float that is not finite (a publisher's timestamp)
    is written null."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in obj.items()}


__all__ = ["CHECKS", "Watch", "WatchOptions", "WatchSummary", "summary_text"]
