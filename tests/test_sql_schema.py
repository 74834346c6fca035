"""sql/schema.sql: what the schema's tables take and refuse."""

from __future__ import annotations

import duckdb
import pytest

import pagedkv_sql
from pagedkv_sql.relations import INPUT_RELATIONS

from .helpers import insert


def test_schema_refuses_a_base_aligned_to_128_but_not_256(db: pagedkv_sql.Database) -> None:
    """The CHECK clause holds in the DuckDB shell too, where no load validates first."""
    db.con.execute("INSERT INTO block_table_entry VALUES (1, 0, 512, 1)")
    with pytest.raises(duckdb.ConstraintException):
        db.con.execute("INSERT INTO block_table_entry VALUES (1, 1, 384, 1)")
    assert db.con.execute("SELECT physical_block_base FROM block_table_entry").fetchall() == [
        (512,)
    ]


def test_schema_names_match_the_spec(db: pagedkv_sql.Database) -> None:
    for relation, columns in INPUT_RELATIONS.items():
        described = db.sql(f"DESCRIBE {relation}").to_arrow_table().to_pylist()
        assert [(c["column_name"], c["column_type"], c["null"]) for c in described] == [
            (c, "BIGINT", "NO") for c in columns
        ]
    out = db.sql("DESCRIBE resolved_kv_address").to_arrow_table().to_pylist()
    assert [(c["column_name"], c["column_type"]) for c in out] == [
        ("seq_id", "BIGINT"),
        ("token_pos", "BIGINT"),
        ("physical_address", "BIGINT"),
    ]


@pytest.mark.parametrize(
    ("statement", "constraint"),
    [
        ("INSERT INTO block_table_entry VALUES (1, 0, 257, 1)", "physical_block_base % 256"),
        ("INSERT INTO block_table_entry VALUES (1, 0, 256, -1)", "refcount >= 0"),
        ("INSERT INTO virtual_token VALUES (1, 0, 0, 256)", "offset_in_block < 256"),
        ("INSERT INTO virtual_token VALUES (1, 0, 0, -1)", "offset_in_block >= 0"),
    ],
)
def test_check_clauses_refuse_bad_rows_from_plain_sql(
    db: pagedkv_sql.Database, statement: str, constraint: str
) -> None:
    with pytest.raises(duckdb.ConstraintException, match="CHECK constraint failed"):
        db.con.execute(statement)


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
        insert(db, relation, [row])


def test_the_schema_takes_refcount_zero_and_offsets_zero_and_255(db: pagedkv_sql.Database) -> None:
    insert(db, "block_table_entry", [(1, 0, 256, 0)])
    insert(db, "virtual_token", [(1, 0, 0, 0), (1, 255, 0, 255)])
