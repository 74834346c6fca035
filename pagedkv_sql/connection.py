"""Opening the DuckDB connection of a Database: a file with pagedkv's settings, or a
connection given as it is; a lock, an I/O error or a bad config made one of ours."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import duckdb

from . import paths, spill
from .errors import DatabaseError, DatabaseLockedError, QueryError, UsageError

# A file written with this setting also opens in the DuckDB 1.5 shell (duckdb-cli on PyPI).
STORAGE_COMPATIBILITY = "v1.5.0"
_LOCK = re.compile(r"Conflicting lock is held in (.*?)(?: by user \S+)?\.(?: See| However|$)", re.S)


def first_line(e: BaseException) -> str:
    """The first line of an error's message (DuckDB's run on with context), or its type."""
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def message_lines(e: BaseException) -> tuple[str, list[str]]:
    """DuckDB's whole message: its first line, and the lines after it (``Candidate
    bindings``, ``Did you mean``, ``LINE 1:`` and its caret), blank ones left out and a tab
    shown as one space, so that the caret stays under the character it points at."""
    lines = [line.replace("\t", " ") for line in str(e).splitlines() if line.strip()]
    return (lines[0], lines[1:]) if lines else (type(e).__name__, [])


def query_error(what: str, e: BaseException, hint: str = "") -> QueryError:
    """A refused query as a QueryError ``WHAT: first line``, the rest of DuckDB's message
    as its details (the CLI prints them escaped, one a line)."""
    first, rest = message_lines(e)
    return QueryError(f"{what}: {first}", rest, hint=hint)


def open_path(
    path: str, *, read_only: bool, must_exist: bool, config: Mapping[str, Any] | None
) -> tuple[duckdb.DuckDBPyConnection, bool, str | None]:
    """Open a database file (or ``:memory:``): the connection, whether this open made the
    file (a caller whose command then fails may remove it again), and the spill directory
    of this open (spill.py) unless ``config`` names a ``temp_directory``."""
    exists = paths.check_database_path(path)
    created = not exists and path != ":memory:"
    settings = dict(config or {})
    spilled = None
    if "temp_directory" not in settings:
        spilled = settings["temp_directory"] = spill.acquire(path)
    try:
        con = open_file(
            path, read_only=read_only, must_exist=must_exist, config=settings, exists=exists
        )
    except BaseException:
        spill.release(spilled)
        if created:
            paths.remove_new_database(path)
        raise
    return con, created, spilled


def open_file(
    path: str,
    *,
    read_only: bool,
    must_exist: bool,
    config: Mapping[str, Any] | None,
    exists: bool,
) -> duckdb.DuckDBPyConnection:
    memory = path == ":memory:"
    if memory and read_only:
        raise UsageError(
            "an in-memory database cannot be opened read-only",
            hint="open a database file read-only, or ':memory:' without read_only",
        )
    if (must_exist or read_only) and not memory and not exists:
        raise DatabaseError(
            f"no database at {path}",
            hint="create it with `pagedkv-sql load SOURCE`, or pass --db / set PAGEDKV_DB",
        )
    settings = {"storage_compatibility_version": STORAGE_COMPATIBILITY, **(config or {})}
    try:
        return duckdb.connect(path, read_only=read_only, config=settings)
    except duckdb.IOException as e:
        raise open_error(path, e) from e
    except (duckdb.InvalidInputException, duckdb.ParserException) as e:
        raise UsageError(
            f"bad DuckDB config: {first_line(e)}",
            hint="sizes are written like 4GB or 500MB (--memory-limit, PAGEDKV_MEMORY_LIMIT)",
        ) from e
    except duckdb.Error as e:
        raise DatabaseError(
            f"cannot open {path}: {first_line(e)}", hint="is it a DuckDB database file?"
        ) from e


def connection_path(con: duckdb.DuckDBPyConnection) -> str:
    try:
        rows = con.execute(
            "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
        ).fetchall()
    except duckdb.Error as e:
        raise DatabaseError(f"cannot use the connection: {first_line(e)}") from e
    return str(rows[0][0]) if rows and rows[0][0] else ":memory:"


def connection_read_only(con: duckdb.DuckDBPyConnection) -> bool:
    rows = con.execute(
        "SELECT readonly FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchall()
    return bool(rows and rows[0][0])


def open_error(path: str, e: duckdb.Error) -> DatabaseError:
    text = str(e)
    if "conflicting lock" in text.lower():
        match = _LOCK.search(text)
        holder = match.group(1).strip() if match else "another process"
        return DatabaseLockedError(
            f"database {path} is locked by {holder}",
            hint="wait for that process to finish (or close that DuckDB shell) and retry",
        )
    return paths.database_io_error(path, e, "open")
