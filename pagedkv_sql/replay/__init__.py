"""Replay: an engine's step log, checked relationally over the whole log at once
(docs/replay.md).

The doors take a ``Database`` and reach DuckDB through ``Database.cursor()``: ``run``
(store a log, check every invariant at every step), ``at`` (the state at a step into the
spec's tables), ``diff`` (what changed between two steps), ``apply_step`` (one step applied
live), ``stored_events`` (the stored log's event table). ``read_log`` and ``write_events``
read and write step logs without a database. ``pagedkv-sql replay`` and ``diff`` call these
functions, and ``Database.replay``, ``replay_at``, ``diff`` and ``apply`` delegate to them.
The connection-level steps are the API of the modules beside this one (``engine.store``,
``engine.check``...), for the capabilities that hold a cursor already (``watch``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..arguments import argument, is_int
from ..errors import UsageError
from ..invariants import Check
from . import engine
from .engine import (
    Finding,
    Invariant,
    Materialized,
    ReplayReport,
    check,
    invariants,
    replay_checks,
    store,
)
from .log import EVENT_SCHEMA, HEADER_KEY, Header, LogSource, read_log, write_events
from .marks import Mark, with_mark

if TYPE_CHECKING:
    from ..database import Database
    from .apply import ResolvedChange


def run(
    db: Database,
    log: LogSource | None = None,
    *,
    keep_going: bool = False,
    limit: int | None = None,
) -> ReplayReport:
    """Store a step log (a path, a stream or an event table; None: the one stored) and
    check every invariant at every step: a ReplayReport with the first finding, or all of
    them with ``keep_going``."""
    argument(keep_going, "keep_going", bool, "True or False")
    if limit is not None:
        if not is_int(limit):
            argument(limit, "limit", int, "None or a count (an integer)")
        if limit < 0:
            raise UsageError(f"limit must be None or a count >= 0, not {limit}")
    with db.cursor("replay", write=log is not None) as cur:
        if log is not None:
            store(cur, log)
        return check(cur, keep_going=keep_going, limit=limit)


def _step(value: Any, name: str) -> int:
    """A step number given to the library: an integer (not a bool, a float or a string,
    which compared as steps gave a TypeError or 'after the last step'), in int64."""
    if not is_int(value):
        argument(value, name, int, "a step number (an integer)")
    if not -(2**63) <= int(value) < 2**63:
        raise UsageError(f"{name} {value} is out of the signed 64-bit range")
    return int(value)


def at(db: Database, step: int) -> Materialized:
    """Replace the spec's tables with the stored log's state at the end of ``step``."""
    step = _step(step, "step")
    with db.cursor("replay", write=True) as cur:
        return engine.materialize(cur, step)


def diff(db: Database, from_step: int, to_step: int) -> pa.Table:
    """What changed in the stored log's state from one step to another."""
    from_step, to_step = _step(from_step, "from_step"), _step(to_step, "to_step")
    with db.cursor("diff") as cur:
        return engine.diff(cur, from_step, to_step)


def apply_step(db: Database, step: Mapping[str, Any] | str) -> ResolvedChange:
    """Apply one step of a step log (a dict or a JSON line) in one transaction: refcount
    kept equal to the holders, only the touched keys checked, a breaking step refused
    (StepRefused, nothing written). Returns the change to resolved_kv_address
    (``.added``, ``.removed``)."""
    from .apply import apply

    with db.cursor("apply", write=True) as cur:
        return apply(cur, step)


def stored_events(db: Database) -> pa.Table:
    """The stored log's event table, with its header (and a recorder's mark) in the schema
    metadata."""
    with db.cursor("reading the stored log") as cur:
        engine.require_log(cur)
        table = cur.sql(engine.sql("replay_event_table")).to_arrow_table()
        header = engine.header(cur)
        mark = engine.stored_mark(cur)
    table = pa.Table.from_arrays(table.columns, schema=EVENT_SCHEMA)
    return with_mark(table.replace_schema_metadata({HEADER_KEY: header.to_json()}), mark)


__all__ = [
    "EVENT_SCHEMA",
    "Check",
    "Finding",
    "Header",
    "Invariant",
    "LogSource",
    "Mark",
    "Materialized",
    "ReplayReport",
    "apply_step",
    "at",
    "diff",
    "invariants",
    "read_log",
    "replay_checks",
    "run",
    "stored_events",
    "write_events",
]
