"""Replay: an engine's step log, checked relationally over the whole log at once
(docs/replay.md). Uses the core; the core never imports it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, TypeAlias

import duckdb
import pyarrow as pa

from .engine import (
    Finding,
    Invariant,
    Materialized,
    ReplayReport,
    check,
    diff,
    invariants,
    load_events,
    materialize,
)
from .log import EVENT_SCHEMA, Header, ParquetEvents, parquet_events, read_log, write_events

LogSource: TypeAlias = "str | os.PathLike[str] | IO[bytes] | pa.Table"


def read(log: LogSource) -> tuple[pa.Table | ParquetEvents, bool]:
    """The event table of a log, and whether it still needs validating (read from an event
    table rather than made by the JSON Lines reader). A Parquet file is left for DuckDB to
    scan."""
    if isinstance(log, pa.Table):
        from .log import conform

        return conform(log, "<arrow events>"), True
    if isinstance(log, str | os.PathLike) and os.fspath(log).lower().endswith(".parquet"):
        found = parquet_events(Path(log)) if Path(log).is_file() else None
        if found is not None:
            return found, True
    table = read_log(log)
    suffix = "" if not isinstance(log, str | os.PathLike) else os.fspath(log).lower()
    return table, not suffix.endswith((".jsonl", ".json", ".ndjson", ".txt")) and suffix != "-"


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


def stored_events(con: duckdb.DuckDBPyConnection) -> pa.Table:
    """The stored log's event table, with its header in the schema metadata."""
    from .engine import header, require_log
    from .log import HEADER_KEY

    require_log(con)
    from .engine import sql

    table = con.sql(sql("replay_event_table")).to_arrow_table()
    return pa.Table.from_arrays(table.columns, schema=EVENT_SCHEMA).replace_schema_metadata(
        {HEADER_KEY: header(con).to_json()}
    )


__all__ = [
    "EVENT_SCHEMA",
    "Finding",
    "Header",
    "Invariant",
    "Materialized",
    "ReplayReport",
    "diff",
    "invariants",
    "load",
    "materialize",
    "read",
    "read_log",
    "replay",
    "stored_events",
    "write_events",
]
