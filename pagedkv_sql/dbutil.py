"""Small helpers around a DuckDB connection.

DuckDB 2.x keeps a result of ``execute()`` open until it is fetched, and an open result
blocks the next ``sql()`` on that connection; these helpers always fetch.
"""

from __future__ import annotations

from typing import Any

import duckdb


def run(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> list[Any]:
    return con.execute(sql, params).fetchall()


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> Any:
    rows = run(con, sql, params)
    return rows[0][0] if rows else None


def setting(con: duckdb.DuckDBPyConnection, name: str) -> int | None:
    """A value of the pagedkv_settings table, or None when it is missing."""
    value = scalar(con, "SELECT value FROM pagedkv_settings WHERE name = ?", [name])
    return None if value is None else int(value)
