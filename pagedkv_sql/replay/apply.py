"""Operations as transactions: apply one step of a step log to the spec's tables.

Only the keys the step touches are read: the requests it names, and the holders of the
blocks it hands out, releases or evicts. From them a small log is built (their current
state as the events that made it, then the step's own events) and checked with the same
invariant queries as ``replay``, in a scratch in-memory database; a finding refuses the
step. Otherwise the touched block-table entries, roots and tokens are rewritten in one
transaction, and the change to ``resolved_kv_address`` (rows added, rows removed) is
computed from the affected tokens before and after. Reading the touched keys' state is
replay/apply_state.py's.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from .. import findings as findings_mod
from ..dbutil import run, scalar
from ..errors import PagedKVError, UsageError
from ..relations import OUTPUT_SCHEMA
from .apply_state import State, named_requests, stored_header, touched_blocks
from .engine import Finding, check, load_events, sql, transaction
from .log import Header, LogLineError, parse_line

LAST_STEP = "apply_last_step"


class StepRefused(PagedKVError):
    """A step that breaks an invariant: nothing was written."""

    def __init__(self, step: int, findings: list[Finding]) -> None:
        self.findings = findings
        super().__init__(
            f"step {step} refused: it breaks {len(findings)} invariant(s); nothing was written",
            [findings_mod.line(f) for f in findings],
        )


@dataclass(frozen=True)
class ResolvedChange:
    """The change one step made to ``resolved_kv_address``."""

    step: int
    added: pa.Table
    removed: pa.Table


def apply(con: duckdb.DuckDBPyConnection, step_obj: Mapping[str, Any] | str) -> ResolvedChange:
    """Apply one step (a dict or one JSON line of a step log) in one transaction."""
    if not isinstance(step_obj, dict | str):
        raise UsageError("a step is an object with an integer 'step'")
    try:
        obj = parse_line(step_obj) if isinstance(step_obj, str) else step_obj
    except LogLineError as e:
        raise PagedKVError(f"the step cannot be read: {e}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("step"), int):
        raise PagedKVError("a step is an object with an integer 'step'")
    step = int(obj["step"])
    run(con, sql("apply_live_request"))
    last = scalar(con, sql("apply_last_step"), [LAST_STEP])
    if last is not None and step <= last:
        raise PagedKVError(f"step {step} is out of order: step {last} was applied last")
    header = stored_header(con)
    state = State(con, header)
    state.requests(named_requests(obj))
    try:
        # a first pass finds the blocks the step touches; their holders join the state (and
        # the step is read again) only when some were not loaded already
        builder = state.builder(step)
        mark = builder.next_event
        builder.step(obj)
        events = builder.table()
        if state.holders(touched_blocks(events.slice(mark))):
            builder = state.builder(step)
            mark = builder.next_event
            builder.step(obj)
            events = builder.table()
    except LogLineError as e:
        raise PagedKVError(f"step {step} cannot be read: {e}") from None
    with _scratch() as scratch:
        load_events(scratch, events, validate=False)
        found = [f for f in check(scratch, keep_going=True).findings if f.event >= mark]
        if found:
            raise StepRefused(step, found)
        after = _after(scratch, step, state)
        new = events.slice(mark)
        return _write(
            con,
            scratch,
            step,
            state,
            after,
            header,
            touched_blocks(new),
            _touched_keys(new, state, header),
        )


_SCRATCH: list[duckdb.DuckDBPyConnection] = []
_SCRATCH_LOCK = threading.Lock()


@contextmanager
def _scratch() -> Iterator[duckdb.DuckDBPyConnection]:
    """The process's scratch database for checking steps: in memory, opened once and reused
    (each step replaces its log), one step at a time. Opening it and creating the replay
    macros was most of a small step's cost."""
    with _SCRATCH_LOCK:
        if not _SCRATCH:
            _SCRATCH.append(duckdb.connect(":memory:"))
        yield _SCRATCH[0]


@dataclass
class _After:
    entries: list[tuple[str, int, str, int | None, int | None, int]]  # + refcount
    tokens: dict[str, int]
    alive: set[str]
    arrived: dict[str, int]  # new request -> its rank in the scratch log


def _after(scratch: duckdb.DuckDBPyConnection, step: int, state: State) -> _After:
    rows = run(scratch, sql("apply_entries_at"), [step])
    holders = Counter(r[3] for r in rows if r[2] == "gpu")  # refcount = holders
    entries = [(*r, holders[r[3]] if r[2] == "gpu" else 0) for r in rows]
    counted = run(scratch, sql("apply_tokens_at"), [step])
    tokens = {r: int(n) for r, n in counted}
    alive = {r for _, r in run(scratch, sql("apply_requests_at"), [step])}
    arrived = {  # new requests, in order of their first event (as replay numbers them)
        r: int(s) for r, s in run(scratch, sql("apply_scratch_requests")) if r not in state.seq
    }
    return _After(entries, tokens, alive, arrived)


def _write(
    con: duckdb.DuckDBPyConnection,
    scratch: duckdb.DuckDBPyConnection,
    step: int,
    state: State,
    after: _After,
    header: Header,
    touched: set[int],
    keys: set[tuple[str, int]],
) -> ResolvedChange:
    with transaction(con, f"step {step} cannot be written"):
        next_seq = int(scalar(con, sql("apply_last_request_seq")) or 0)
        next_seq = max(next_seq, int(scalar(con, sql("apply_last_root_seq"))))
        for rid in sorted(after.arrived, key=lambda r: (after.arrived[r], r)):
            next_seq += 1
            state.seq[rid] = next_seq
            run(con, sql("apply_new_request"), [next_seq, rid, step])
        seqs = sorted(set(state.seq.values()))
        con.register("_apply_seqs", pa.table({"seq_id": pa.array(seqs, pa.int64())}))
        touched_keys = sorted((state.seq[r], i) for r, i in keys if r in state.seq)
        con.register(
            "_apply_keys",
            pa.table(
                {
                    "seq_id": pa.array([k[0] for k in touched_keys], pa.int64()),
                    "block_index": pa.array([k[1] for k in touched_keys], pa.int64()),
                }
            ),
        )
        # the touched tokens' resolution before
        _touched_tokens(con)
        before = _resolve_tokens(con)
        gone = [state.seq[r] for r in state.seq if r not in after.alive and r not in state.freed]
        for rid in state.seq:
            if rid not in after.alive and rid not in state.freed and not rid.startswith("seq:"):
                run(con, sql("apply_free_request"), [step, rid])
        run(con, sql("apply_delete_entries"))
        run(con, sql("apply_delete_swapped"))
        # refcount = holders: recounted for the blocks the step touched (all their holders
        # were loaded), kept for the others (no holder of theirs changed)
        gpu = [
            (state.seq[r], i, header.base(b), n if b in touched else state.refcount.get(b, n))
            for r, i, tier, b, _, n in after.entries
            if tier == "gpu" and b is not None
        ]
        cpu = [(state.seq[r], i, c) for r, i, tier, _, c, _ in after.entries if tier == "cpu"]
        _insert(
            con,
            "block_table_entry",
            ["block_table_id", "block_index", "physical_block_base", "refcount"],
            gpu,
        )
        _insert(con, "swapped_block", ["block_table_id", "block_index", "cpu_base_address"], cpu)
        # roots: every alive request has one; gone ones lose it
        new_roots = [(state.seq[r], state.seq[r]) for r in after.arrived if r in after.alive]
        _insert(con, "root_table", ["seq_id", "block_table_ptr"], new_roots)
        if gone:
            run(con, f"DELETE FROM root_table WHERE seq_id IN ({', '.join(map(str, gone))})")
        # tokens: append the new ones, drop those of freed or preempted requests
        grow: list[tuple[int, int, int]] = []
        shrink: list[tuple[int, int]] = []
        for rid, seq in state.seq.items():
            if rid.startswith("seq:"):
                continue
            now = after.tokens.get(rid, 0) if rid in after.alive else 0
            was = state.tokens.get(rid, 0)
            if now < was:
                shrink.append((seq, now))
            elif now > was:
                grow.append((seq, was, now))
        if shrink:
            con.register("_apply_shrink", _int_table(["seq_id", "keep"], shrink))
            run(con, sql("apply_shrink_tokens"))
            run(con, sql("apply_shrink_touched"))
            con.unregister("_apply_shrink")
        if grow:
            bs = header.block_size
            con.register("_apply_grow", _int_table(["seq_id", "was", "now"], grow))
            run(
                con,
                "CREATE OR REPLACE TEMP TABLE _apply_grown AS "
                f"SELECT seq_id, p AS token_pos, p // {bs} AS block_index, p % {bs} AS "
                "offset_in_block FROM (SELECT seq_id, unnest(range(was, now)) AS p "
                "FROM _apply_grow)",
            )
            con.unregister("_apply_grow")
            run(con, sql("apply_insert_grown"))
            run(con, sql("apply_touch_grown"))  # every grown token is in a touched key
        # the touched tokens after: those before, less the dropped, plus the grown (no
        # second pass over virtual_token)
        after_rows = _resolve_tokens(con)
        con.unregister("_apply_seqs")
        con.unregister("_apply_keys")
        run(con, sql("apply_set_last_step"), [LAST_STEP, step])
        run(con, sql("replay_request_label"))
        added = _minus(scratch, after_rows, before)
        removed = _minus(scratch, before, after_rows)
    return ResolvedChange(step, added, removed)


def _insert(
    con: duckdb.DuckDBPyConnection, table: str, columns: list[str], rows: list[tuple[Any, ...]]
) -> None:
    if not rows:
        return
    data = pa.table({c: pa.array([r[i] for r in rows], pa.int64()) for i, c in enumerate(columns)})
    con.register("_apply_rows", data)
    try:
        run(con, f"INSERT INTO {table} SELECT {', '.join(columns)} FROM _apply_rows")
    finally:
        con.unregister("_apply_rows")


def _int_table(columns: list[str], rows: list[tuple[Any, ...]]) -> pa.Table:
    return pa.table({c: pa.array([r[i] for r in rows], pa.int64()) for i, c in enumerate(columns)})


def _touched_keys(events: pa.Table, state: State, header: Header) -> set[tuple[str, int]]:
    """The (request, block index) keys whose tokens may resolve differently after the step:
    entries that changed, blocks of appended tokens, every block of a request whose tokens
    were dropped (free, preempt)."""
    keys: set[tuple[str, int]] = set()
    bs = header.block_size
    for r in events.to_pylist():
        req, idx = r["request"], r["block_index"]
        if req is None:
            continue
        if idx is not None:
            keys.add((req, idx))
        elif r["op"] == "append" and r["token_to"] is not None and r["token_to"] > r["token_from"]:
            for i in range(r["token_from"] // bs, (r["token_to"] - 1) // bs + 1):
                keys.add((req, i))
        elif r["op"] in ("free", "preempt") and r["block_id"] is None:
            tokens = state.tokens.get(req, 0)
            keys.update((req, i) for i in range(-(-tokens // bs)))
    return keys


def _touched_tokens(con: duckdb.DuckDBPyConnection) -> None:
    """The tokens of the touched (sequence, block index) keys, into _apply_tokens."""
    run(con, sql("apply_touched_tokens"))


def _resolve_tokens(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """resolved_kv_address of the tokens in _apply_tokens, as a sorted set."""
    table = con.sql(sql("apply_resolve_touched")).to_arrow_table()
    return pa.Table.from_arrays(table.columns, schema=OUTPUT_SCHEMA)


def _minus(scratch: duckdb.DuckDBPyConnection, a: pa.Table, b: pa.Table) -> pa.Table:
    scratch.register("_apply_a", a)
    scratch.register("_apply_b", b)
    try:
        out = scratch.sql(sql("apply_minus")).to_arrow_table()
    finally:
        scratch.unregister("_apply_a")
        scratch.unregister("_apply_b")
    return pa.Table.from_arrays(out.columns, schema=OUTPUT_SCHEMA)


__all__ = ["ResolvedChange", "StepRefused", "apply", "sql"]
