"""dbutil.py: the stored settings of a database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

import pagedkv_sql

from .helpers import DATA, Cli, loaded


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


def test_the_block_size_may_be_one_to_the_largest_offset_plus_one() -> None:
    from pagedkv_sql.dbutil import MAX_BLOCK_SIZE

    with pagedkv_sql.connect(":memory:") as db:
        db.load(DATA)
        for size in (1, MAX_BLOCK_SIZE):
            db.check(block_size=size)
            db.stats(block_size=size)
        for size in (0, MAX_BLOCK_SIZE + 1):
            with pytest.raises(pagedkv_sql.UsageError, match="--block-size must be"):
                db.check(block_size=size)


def test_io_failures_are_told_apart_from_refused_data() -> None:
    from pagedkv_sql.dbutil import is_io_error as _is_io

    assert _is_io(duckdb.IOException("could not write"))
    assert _is_io(duckdb.OutOfMemoryException("out of memory"))
    assert _is_io(duckdb.TransactionException("Failed to commit: could not write the WAL"))
    assert _is_io(duckdb.Error("write failed: No space left on device"))
    assert not _is_io(duckdb.ConstraintException("CHECK constraint failed"))
    assert not _is_io(duckdb.ConversionException("Could not convert string 'x' to INT64"))


def test_a_bad_block_size_from_the_shell_is_refused_or_explained(cli: Cli) -> None:
    path = loaded(cli)
    con = duckdb.connect(str(path))
    with pytest.raises(duckdb.ConstraintException):
        con.execute("UPDATE pagedkv_settings SET value = 0 WHERE name = 'block_size'")
    # an older file without the CHECK clause: the setting is explained, not a crash
    con.execute("DELETE FROM pagedkv_settings WHERE name = 'block_size'")
    con.close()
    for command in ("stats", "check"):
        result: Any = cli(command)
        assert result.exit_code == 1
        assert result.stderr.startswith(
            "Error: the stored block_size is missing, not a number of tokens in [1, 256]\n"
            "Fix: store one with `pagedkv-sql load SOURCE --block-size N`"
        )
