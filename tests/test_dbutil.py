"""dbutil.py: the stored settings of a database."""

from __future__ import annotations

from pathlib import Path

import pytest

import pagedkv_sql

from .conftest import DATA


def test_a_stored_block_size_is_read_within_one_to_256(tmp_path: Path) -> None:
    """A file whose settings table lost its CHECK (an older file, the DuckDB shell): the
    bounds are those of the spec's offsets, both ends included."""
    import duckdb

    from pagedkv_sql.errors import DatabaseError

    path = tmp_path / "b.duckdb"
    with pagedkv_sql.connect(path) as database:
        database.load(DATA)
    con = duckdb.connect(str(path))
    con.execute("CREATE OR REPLACE TABLE pagedkv_settings AS SELECT * FROM pagedkv_settings")
    con.close()
    for value, ok in ((0, False), (1, True), (256, True), (257, False)):
        con = duckdb.connect(str(path))
        con.execute("UPDATE pagedkv_settings SET value = ? WHERE name = 'block_size'", [value])
        con.close()
        with pagedkv_sql.connect(path, read_only=True) as database:
            if ok:
                assert database.stats().counts["tokens"] == 8, value
            else:
                with pytest.raises(DatabaseError, match=f"block_size is {value}, not a number"):
                    database.stats()
