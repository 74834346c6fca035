"""A growing step log checked as it grows (`watch`), incrementally, window by window.

Lines are taken as they arrive (`add`) and checked in windows of at most `WINDOW_LINES`
(`check`): a Builder that lives as long as the log turns the window's steps into block-level
events, and the replay engine's own invariant queries (sql/replay.sql) run in a scratch
in-memory database over a small log: the state at the end of the last window, written as the
events that make it (each live request's arrival, its block-table entries as shares, one
append of its tokens; each freed request the window names as an arrival and a free at its
free step), then the window's events. The findings are those of the window's events, exactly
what `replay` finds at those steps (tests/test_live_steplog.py holds the two equal for every
planted fault). One detail the state does not carry is remembered beside it: the last change
of each block's holders, which a `ref_cnt_mismatch` message names.

Memory and the cost of a check are bounded by the state (the live requests' blocks, the
freed requests remembered: at most `MAX_FREED`) and the window, never by the log's length.
A header after steps, or a source that was truncated or replaced (`restart`), starts a new
log, checked from its start. A line that cannot be read ends the checking of its log (what
follows would be checked against a state that missed a step): a problem naming FILE:LINE.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Any

import pyarrow as pa

from .. import findings
from ..invariants import REPLAY
from ..replay.builder import Builder, Request
from ..replay.header import EVENT_SCHEMA, HEADER_KEY, Header, LogLineError, header_from
from ..replay.log import parse_line
from ..replay.marks import is_mark, mark_from

MIN_INTERVAL_S = 0.05
WINDOW_LINES = 1000  # lines a check takes at most (its memory and time)
MAX_FREED = 100_000  # freed requests remembered: a later reference to one is named
_DEAD = Request([], 0, False)  # every freed request's state (a freed request never changes)
_LAST_CHANGE = (
    "SELECT h.block_id, arg_max(q.request_id, h.event), arg_max(h.op, h.event) "
    "FROM replay_holder_change h LEFT JOIN replay_request q ON q.rkey = h.rkey "
    "WHERE h.delta <> 0 AND h.event >= ? GROUP BY h.block_id"
)
_LAST_CHANGE_BEFORE = (
    "SELECT max(event) FROM replay_holder_change WHERE delta <> 0 AND block_id = ? AND event < ?"
)
# per block, the last let-go (a request's entry ended, or a block it did not hold given
# back) in a window, with the holders left: a fresh_while_held in a later window names it
# first, as replay does (sql/replay.sql)
_LET_GO = (
    "SELECT h.block_id, arg_max(q.request_id, h.event), arg_max(CASE WHEN e.op = 'release' "
    "AND e.value IS NOT NULL THEN 'window_free' ELSE h.op END, h.event), "
    "arg_max(h.step, h.event), arg_max(h.holders, h.event) "
    "FROM replay_holder_change h JOIN replay_request q ON q.rkey = h.rkey "
    "JOIN replay_event e ON e.event = h.event "
    "WHERE h.event >= ? AND (h.delta = -1 AND h.op <> 'kept' OR h.delta = 0 AND h.op IN "
    "('release', 'free', 'preempt', 'swap_out')) GROUP BY h.block_id"
)
# the checks that name the request whose event last changed the block's holders, and how
NAMED_BY_LAST_CHANGE = {
    "ref_cnt_mismatch": " (last changed by request ",
    "free_list_duplicate": " (last released by request ",
}


@dataclass
class StepFinding:
    """A finding of a step log watched as it grows: replay's check (``findings.Finding``)."""

    source: str
    check: str  # replay's check (sql/replay.sql)
    step: int
    event: int
    request: str | None
    block_id: int | None
    message: str

    model = REPLAY
    cause = None

    @property
    def invariant(self) -> str:
        """The catalogue's name of the idea."""
        return findings.invariant(self)

    @property
    def where(self) -> str:
        return f"{self.source} step {self.step}"

    @property
    def request_ids(self) -> tuple[str, ...]:
        return () if self.request is None else (self.request,)

    @property
    def block_ids(self) -> tuple[int, ...]:
        return () if self.block_id is None else (self.block_id,)

    def extra(self) -> dict[str, Any]:
        return {"source": self.source, "step": self.step, "event": self.event}

    def to_dict(self) -> dict[str, Any]:
        return {
            **findings.as_dict(self),
            "request": self.request,
            "block_id": self.block_id,
        }


@dataclass
class Segment:
    """One log of a source: its lines from a header (or the source's start) to the next
    header, truncation or rotation. With a spool, its lines are copied there as taken (what
    `watch --db` stores at the end)."""

    number: int  # 1, 2, ... in the source
    first_line: int
    lines: int = 0
    steps: int = 0
    broken: str | None = None  # why checking stopped (an unreadable line)
    marked: str | None = None  # a recorder's mark (a gap, a stop): where checking ends
    spool: str | None = None  # the file its lines are copied to
    spool_file: IO[bytes] | None = None


@dataclass
class StepLog:
    """The step log (logs: `segments`) of one source, checked incrementally."""

    source: str
    pending: deque[tuple[str, int, bytes, bool]] = field(default_factory=deque)
    pending_bytes: int = 0
    segments: list[Segment] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    findings: int = 0
    lines: int = 0  # non-blank lines taken, every log of the source
    next_check: float = 0.0
    notes: list[str] = field(default_factory=list)  # for the watch to say, then cleared
    problems: list[str] = field(default_factory=list)  # likewise, each counted
    forgotten: int = 0  # freed requests forgotten (past MAX_FREED)

    def __post_init__(self) -> None:
        self._start(1)

    # -- taking lines ---------------------------------------------------------------------
    def add(self, number: int, line: bytes, last: bool = False) -> bool:
        """A line (without its newline) numbered in its file; ``last``: the source ended
        right after it without a newline (a line cut off while written, if unreadable).
        False for a blank line (nothing to check)."""
        if not line.strip():
            return False
        self.pending.append(("line", number, line, last))
        self.pending_bytes += len(line)
        return True

    def restart(self, why: str) -> None:
        """The source was truncated or replaced: the lines after this are a new log."""
        self.pending.append(("restart", 0, why.encode(), False))

    def due(self, now: float) -> bool:
        return bool(self.pending) and (now >= self.next_check or len(self.pending) > WINDOW_LINES)

    @property
    def broken(self) -> str | None:
        return self.segments[-1].broken

    @property
    def steps(self) -> int:
        return sum(s.steps for s in self.segments)

    # -- one log ----------------------------------------------------------------------------
    def _start(self, first_line: int) -> None:
        self._close_spool()
        self.segments.append(Segment(len(self.segments) + 1, first_line))
        self.header: Header | None = None
        self.builder: Builder | None = None
        self.freed: dict[str, int] = {}  # freed request -> its free step, oldest first
        self.last_change: dict[int, tuple[str | None, str]] = {}  # block -> request, op
        # block -> request, op, step of its last let-go while others still held it
        self.let_go: dict[int, tuple[str, str, int]] = {}
        self.cached: dict[int, int] = {}  # block -> the hash the prefix cache holds it under
        self.events = 0  # events of this log so far (replay's event numbers)

    def spool_to(self, directory: str) -> None:
        """Copy the lines of this source's first log, as they are read, into a new file in
        ``directory`` (what `watch --db` stores at the end)."""
        import tempfile

        seg = self.segments[0]
        if seg.spool is None and len(self.segments) == 1:
            fd, seg.spool = tempfile.mkstemp(prefix="log-", suffix=".jsonl", dir=directory)
            seg.spool_file = os.fdopen(fd, "wb")

    def _close_spool(self) -> None:
        if self.segments and self.segments[-1].spool_file is not None:
            f = self.segments[-1].spool_file
            self.segments[-1].spool_file = None
            f.close()

    def close(self) -> None:
        """Close the spool being written (its lines stay for `watch --db` to store)."""
        self._close_spool()

    # -- checking ---------------------------------------------------------------------------
    def check(self, scratch: Any) -> list[StepFinding]:
        """Check the lines taken since the last check (at most WINDOW_LINES): the findings
        of their steps. ``scratch``: an in-memory DuckDB connection, replaced tables only."""
        started = time.monotonic()
        try:
            return self._check(scratch)
        finally:
            took = time.monotonic() - started
            self.next_check = time.monotonic() + max(MIN_INTERVAL_S, took)

    def _check(self, scratch: Any) -> list[StepFinding]:
        taken = 0
        state: dict[str, list[Any]] = {}
        while self.pending and taken < WINDOW_LINES:
            kind, number, line, last = self.pending[0]
            seg = self.segments[-1]
            new_log = kind == "restart" or (
                self._is_header(line) and (taken or seg.lines or seg.broken)
            )
            if new_log and taken:
                break  # this log's lines are checked first
            self.pending.popleft()
            if kind == "restart":
                self.notes.append(line.decode())
                if seg.lines or seg.broken:
                    self._start(1)
                continue
            self.pending_bytes -= len(line)
            self.lines += 1
            if new_log:
                self.notes.append(
                    f"{self.source}:{number}: a new step log begins (a header line); "
                    "checked from its start"
                )
                self._start(number)
                seg = self.segments[-1]
            if seg.broken is not None or seg.marked is not None:
                continue  # not checked past an unreadable line or a mark: counted, not read
            if not taken:  # the state before the window's first step
                state = self._state()
            if self._take(seg, number, line, last):
                taken += 1
        spool = self.segments[-1].spool_file
        if spool is not None:
            spool.flush()  # what is checked is on disk
        if self.builder is not None and self.builder.columns["event"]:
            return self._window(scratch, state)
        return []

    def _is_header(self, line: bytes) -> bool:
        return HEADER_KEY.encode() in line[:200] and line.lstrip().startswith(b"{")

    def _take(self, seg: Segment, number: int, line: bytes, last: bool) -> bool:
        """Read one line into the builder; False when it is the header or unreadable."""
        where = f"{self.source}:{number}"
        builder = self.builder
        mark = len(builder.columns["event"]) if builder is not None else 0
        try:
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise LogLineError(
                    f"not UTF-8 (byte 0x{line[e.start]:02x} at column {e.start + 1})"
                ) from None
            obj = parse_line(text.removeprefix("\ufeff") if seg.lines == 0 else text)
            if is_mark(obj):  # the recorder says its log stops being checkable here
                seg.marked = mark_from(obj).text()
                self.notes.append(f"{where}: {seg.marked}; the lines after it are not checked")
                self._spool_line(seg, line)
                return False
            if builder is None:
                if isinstance(obj, dict) and HEADER_KEY in obj:
                    self.header = header_from(obj)
                    self.builder = Builder(self.header)
                    self._spool_line(seg, line)
                    return False
                self.header = Header()
                builder = self.builder = Builder(self.header)
            builder.step(obj)
        except LogLineError as e:
            if builder is not None:  # the step's events so far are not the log's
                for column in builder.columns.values():
                    del column[mark:]
            cut = (
                "; the last line has no newline: it was cut off while written (a full disk?)"
                if last
                else ""
            )
            seg.broken = f"{where}: {e}{cut}; the log is not checked past this line"
            self.problems.append(seg.broken)
            return False
        self._spool_line(seg, line)
        seg.steps += 1
        return True

    def _spool_line(self, seg: Segment, line: bytes) -> None:
        seg.lines += 1
        if seg.spool_file is not None:
            seg.spool_file.write(line + b"\n")

    def _window(self, scratch: Any, state: dict[str, list[Any]]) -> list[StepFinding]:
        from ..replay.engine import check, load_events

        builder = self.builder
        assert builder is not None and self.header is not None
        window = builder.table()  # numbered from 0: the window's own events
        builder.columns = {name: [] for name in EVENT_SCHEMA.names}
        builder.next_event = 0
        first = self.events  # replay's number of the window's first event
        self.events += window.num_rows
        named = {r for r in window.column("request").to_pylist() if r is not None}
        named |= {p for p in window.column("parent").to_pylist() if p is not None}
        prefix = self._prefix(named, state)
        mark = prefix.num_rows
        events = (
            pa.concat_tables([prefix, _shifted(window, mark)])
            .combine_chunks()
            .replace_schema_metadata({HEADER_KEY: self.header.to_json()})
        )
        load_events(scratch, events, validate=False)
        report = check(scratch, keep_going=True)
        out: list[StepFinding] = []
        for f in report.findings:
            if f.event < mark:
                continue  # the state's own (found when its steps were checked)
            request, message = f.request, f.message
            if f.check in NAMED_BY_LAST_CHANGE and f.block_id is not None:
                request, message = self._named(scratch, f, mark)
            elif f.check == "fresh_while_held" and not message.startswith("request "):
                message = self._culprit(f) + message
            self.counts[f.check] = self.counts.get(f.check, 0) + 1
            out.append(
                StepFinding(
                    self.source,
                    f.check,
                    f.step,
                    f.event - mark + first,
                    request,
                    f.block_id,
                    message,
                )
            )
        self.findings += len(out)
        self._remember(scratch, window, mark)
        return out

    def _state(self) -> dict[str, list[Any]]:
        """The state as events (columns of EVENT_SCHEMA, numbered from 0): the prefix
        cache's blocks and hashes, then every live request's arrival, its entries (a share a
        GPU block, a fork a swapped one) and one append of its tokens, all at the last step
        read."""
        cols: dict[str, list[Any]] = {name: [] for name in EVENT_SCHEMA.names}
        last = None if self.builder is None else self.builder.last_step
        if last is None:
            return cols
        assert self.builder is not None
        for block, value in self.cached.items():  # the prefix cache's hashes (a share's check)
            _row(cols, last, "cache", None, block_id=block, value=value)
        for rid, r in self.builder.requests.items():
            if not r.alive:
                continue
            for g in self.builder.groups:  # a table per KV-cache group
                _row(cols, last, "arrive", rid, group=g)
                for index, entry in enumerate(r.table(g)):
                    if entry is None:
                        continue
                    tier, where = entry
                    if tier == "gpu":
                        _row(cols, last, "share", rid, block_index=index, block_id=where, group=g)
                    else:
                        _row(cols, last, "fork", rid, block_index=index, cpu_address=where, group=g)
                if r.tokens:
                    _row(cols, last, "append", rid, token_from=0, token_to=r.tokens, group=g)
        return cols

    def _prefix(self, named: set[str], state: dict[str, list[Any]]) -> pa.Table:
        """The state before the window as events: the freed requests the window names (an
        arrival and a free at their free step, oldest first), then the live requests."""
        cols: dict[str, list[Any]] = {name: [] for name in EVENT_SCHEMA.names}
        for rid, step in sorted(
            ((r, self.freed[r]) for r in named if r in self.freed), key=lambda x: x[1]
        ):
            for g in self.builder.groups if self.builder is not None else (0,):
                _row(cols, step, "arrive", rid, group=g)
                _row(cols, step, "free", rid, group=g)
        dead = len(cols["event"])
        for name, values in state.items():
            cols[name] += values
        cols["event"] = list(range(dead + len(state["event"])))
        return pa.table(cols, schema=EVENT_SCHEMA)

    def _named(self, scratch: Any, f: Any, mark: int) -> tuple[str | None, str]:
        """A ref_cnt_mismatch or free_list_duplicate names the request whose event last
        changed the block's holders: when that was before the window, the one remembered
        (the state's shares are no one's change)."""
        from ..dbutil import scalar

        last = scalar(scratch, _LAST_CHANGE_BEFORE, [f.block_id, f.event])
        if last is not None and last >= mark:
            return f.request, f.message
        said = NAMED_BY_LAST_CHANGE[f.check]
        base = f.message.split(said)[0]
        request, op = self.last_change.get(f.block_id, (None, ""))
        if request is None:
            return None, base
        return request, f"{base}{said}{request}'s {op})"

    def _culprit(self, f: Any) -> str:
        """A block handed out fresh while others hold it, let go windows before by a
        request that does not hold it now: that request and op, as replay names them."""
        seen = self.let_go.get(f.block_id)
        if seen is None or seen[0] in f.request_ids[1:]:
            return ""
        request, op, step = seen
        return (
            f"request {request}'s {op} at step {step} let go of block {f.block_id} while "
            "others still held it, then "
        )

    def _remember(self, scratch: Any, window: pa.Table, mark: int) -> None:
        """After a window: the blocks' last holder changes, the requests it freed (their
        free step; past MAX_FREED the oldest are forgotten), freed requests' state shared."""
        from ..dbutil import run

        for block, request, op in run(scratch, _LAST_CHANGE, [mark]):
            # as replay says it (sql/replay.sql): a free's or preemption's kept block
            said = "free or preemption, which kept it back" if op == "kept" else op
            self.last_change[int(block)] = (request, said)
        for block, request, op, step, holders in run(scratch, _LET_GO, [mark]):
            if holders:
                self.let_go[int(block)] = (request, op, int(step))
            else:
                self.let_go.pop(int(block), None)
        assert self.builder is not None
        requests = self.builder.requests
        ops = window.column("op").to_pylist()
        reqs = window.column("request").to_pylist()
        steps = window.column("step").to_pylist()
        blocks = window.column("block_id").to_pylist()
        indices = window.column("block_index").to_pylist()
        values = window.column("value").to_pylist()
        for op, block, value in zip(ops, blocks, values, strict=True):
            if op == "cache":
                self.cached[block] = value
            elif op == "evict":
                self.cached.pop(block, None)
        for op, req, step, block, index in zip(ops, reqs, steps, blocks, indices, strict=True):
            if op == "free" and block is None and index is None and req not in self.freed:
                self.freed[req] = step
                requests[req] = _DEAD
        while len(self.freed) > MAX_FREED:
            oldest = next(iter(self.freed))
            del self.freed[oldest]
            requests.pop(oldest, None)
            if not self.forgotten:
                self.notes.append(
                    f"{self.source}: more than {MAX_FREED:,} requests freed: the oldest are "
                    "forgotten (a later reference to one is read as a new request)"
                )
            self.forgotten += 1


def _row(cols: dict[str, list[Any]], step: int, op: str, req: str | None, **kw: Any) -> None:
    cols["event"].append(len(cols["event"]))
    cols["step"].append(step)
    cols["op"].append(op)
    cols["request"].append(req)
    for name in ("block_index", "block_id", "cpu_address", "token_from", "token_to"):
        cols[name].append(kw.get(name))
    cols["value"].append(kw.get("value"))
    cols["parent"].append(None)
    cols["group_id"].append(kw.get("group", 0))


def _shifted(table: pa.Table, by: int) -> pa.Table:
    import pyarrow.compute as pc

    if by == 0:
        return table
    i = table.schema.get_field_index("event")
    return table.set_column(i, "event", pc.add(table.column("event"), by))
