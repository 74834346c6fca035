"""Small helpers around a DuckDB connection.

DuckDB 2.x keeps a result of ``execute()`` open until it is fetched, and an open result
blocks the next ``sql()`` on that connection; these helpers always fetch.
"""

from __future__ import annotations

import contextlib
from typing import Any

import duckdb

from .errors import DatabaseError, UsageError
from .limits import MAX_BLOCK_SIZE


def run(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> list[Any]:
    return con.execute(sql, params).fetchall()


def rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Undo the open transaction, never hiding the error that led here. DuckDB may have
    ended the transaction itself (a failed COMMIT on a full disk, an interrupt, a fatal
    error); its "cannot rollback - no transaction is active" then would replace the real
    cause, so a failing ROLLBACK is ignored: the transaction is gone either way."""
    with contextlib.suppress(duckdb.Error):
        con.execute("ROLLBACK").fetchall()


def is_io_error(error: duckdb.Error) -> bool:
    """A full disk, exhausted memory, a file that cannot be written: DuckDB says so as an
    IO or out-of-memory error, or as a commit that failed to write its log."""
    if isinstance(error, duckdb.IOException | duckdb.OutOfMemoryException):
        return True
    text = str(error)
    return "Failed to commit" in text or "No space left on device" in text


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> Any:
    rows = run(con, sql, params)
    return rows[0][0] if rows else None


def setting(con: duckdb.DuckDBPyConnection, name: str) -> int | None:
    """A value of the pagedkv_settings table, or None when it is missing."""
    value = scalar(con, "SELECT value FROM pagedkv_settings WHERE name = ?", [name])
    return None if value is None else int(value)


def block_size(con: duckdb.DuckDBPyConnection) -> int:
    """The stored block size, refused (with the repair) when the shell set a bad one."""
    value = setting(con, "block_size")
    if value is None or not 1 <= value <= MAX_BLOCK_SIZE:
        shown = "missing" if value is None else f"{value}"
        raise DatabaseError(
            f"the stored block_size is {shown}, not a number of tokens in [1, {MAX_BLOCK_SIZE}]",
            hint="store one with `pagedkv-sql load SOURCE --block-size N`, or in the DuckDB "
            "shell: INSERT OR REPLACE INTO pagedkv_settings VALUES ('block_size', 16)",
        )
    return value


def check_block_size(block_size: int | None) -> None:
    """Refuse a block size given by a caller outside [1, MAX_BLOCK_SIZE]."""
    if block_size is not None and not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise UsageError(
            f"--block-size must be a number of tokens in [1, {MAX_BLOCK_SIZE}] "
            f"(the spec's offsets are below {MAX_BLOCK_SIZE}), not {block_size}"
        )
