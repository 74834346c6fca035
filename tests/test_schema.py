"""sql/schema.sql: what the schema's tables take and refuse."""

from __future__ import annotations

import duckdb
import pytest

import pagedkv_sql

from .conftest import _insert


@pytest.mark.parametrize(
    "relation, row",
    [
        ("block_table_entry", (1, 0, 384, 1)),
        ("block_table_entry", (1, 0, 256, -1)),
        ("virtual_token", (1, 0, 0, -1)),
        ("virtual_token", (1, 256, 1, 256)),
    ],
)
def test_the_schema_refuses_what_the_spec_forbids_from_the_shell(
    db: pagedkv_sql.Database, relation: str, row: tuple[int, ...]
) -> None:
    with pytest.raises(duckdb.ConstraintException):
        _insert(db, relation, [row])


def test_the_schema_takes_refcount_zero_and_offsets_zero_and_255(db: pagedkv_sql.Database) -> None:
    _insert(db, "block_table_entry", [(1, 0, 256, 0)])
    _insert(db, "virtual_token", [(1, 0, 0, 0), (1, 255, 0, 255)])
