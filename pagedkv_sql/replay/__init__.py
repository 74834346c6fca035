"""Replay: an engine's step log, checked relationally over the whole log at once
(docs/replay.md). Uses the core; the core imports it only inside ``Database``'s one-line
delegations (``Database.replay`` calls ``run``...). Its entry points take a ``Database``
(``run``, ``at``, ``diff``, ``apply_step``, ``stored_events``) and reach DuckDB through
``Database.cursor()``; the connection-level functions they call stay for the modules
beside them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeAlias

import duckdb
import pyarrow as pa

from ..arguments import argument, is_int
from ..errors import UsageError
from . import engine
from .engine import (
    Finding,
    Invariant,
    Materialized,
    ReplayReport,
    check,
    invariants,
    load_events,
    materialize,
)
from .log import (
    EVENT_SCHEMA,
    Header,
    ParquetEvents,
    file_kind,
    parquet_events,
    read_log,
    write_events,
)

if TYPE_CHECKING:
    from ..database import Database
    from .apply import ResolvedChange

LogSource: TypeAlias = "str | os.PathLike[str] | IO[bytes] | pa.Table"


def read(log: LogSource) -> tuple[pa.Table | ParquetEvents, bool]:
    """The event table of a log, and whether it still needs validating (read from an event
    table rather than made by the JSON Lines reader). A Parquet file (told by its first
    bytes, not its name) is left for DuckDB to scan."""
    if isinstance(log, pa.Table):
        from .log import conform

        return conform(log, "<arrow events>"), True
    kind = file_kind(log) if isinstance(log, str | os.PathLike) and os.fspath(log) != "-" else None
    if kind == "parquet":
        found = parquet_events(Path(log))  # type: ignore[arg-type]
        if found is not None:
            return found, True
    table = read_log(log)
    return table, kind not in ("jsonl", None) or not isinstance(log, str | os.PathLike)


def load(con: duckdb.DuckDBPyConnection, log: LogSource) -> Header:
    """Store a log in the database (replacing the one stored) and build its intervals."""
    table, validate = read(log)
    return load_events(con, table, validate=validate)


def replay(
    con: duckdb.DuckDBPyConnection,
    log: LogSource | None = None,
    *,
    keep_going: bool = False,
    limit: int | None = None,
) -> ReplayReport:
    """Load ``log`` (if given) and check every invariant at every step."""
    if log is not None:
        load(con, log)
    return check(con, keep_going=keep_going, limit=limit)


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
        return replay(cur, log, keep_going=keep_going, limit=limit)


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
        return materialize(cur, step)


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


def stored_events(db: Database | duckdb.DuckDBPyConnection) -> pa.Table:
    """The stored log's event table, with its header in the schema metadata. Takes a
    Database (or, for the modules beside it, a DuckDB connection)."""
    if not isinstance(db, duckdb.DuckDBPyConnection):
        with db.cursor("reading the stored log") as cur:
            return stored_events(cur)
    from .log import HEADER_KEY

    engine.require_log(db)
    table = db.sql(engine.sql("replay_event_table")).to_arrow_table()
    return pa.Table.from_arrays(table.columns, schema=EVENT_SCHEMA).replace_schema_metadata(
        {HEADER_KEY: engine.header(db).to_json()}
    )


__all__ = [
    "EVENT_SCHEMA",
    "Finding",
    "Header",
    "Invariant",
    "Materialized",
    "ReplayReport",
    "apply_step",
    "at",
    "diff",
    "invariants",
    "load",
    "materialize",
    "read",
    "read_log",
    "replay",
    "run",
    "stored_events",
    "write_events",
]
