from __future__ import annotations

import pytest

from pagedkv_sql import sqlfiles
from pagedkv_sql.check import all_checks


def test_every_file_parses_and_every_check_is_documented() -> None:
    statements = sqlfiles.load_all()
    assert "resolved_kv_address" in statements
    for check in all_checks():
        assert check.description, check.name
    assert {c.relation for c in all_checks() if c.severity == "error"} == {
        "block_table_entry",
        "virtual_token",
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-- name: a\n\n-- name: b\nSELECT 1;", "x.sql:1: statement 'a' is empty"),
        ("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;", "x.sql:3: duplicate statement name 'a'"),
        ("-- name: Bad-Name\nSELECT 1;", "x.sql:1: invalid statement name 'Bad-Name'"),
        ("SELECT 1;", "x.sql:1: SQL before the first '-- name:' header"),
    ],
)
def test_loader_refuses_malformed_files(text: str, message: str) -> None:
    with pytest.raises(sqlfiles.SQLFileError, match="^" + message.replace("(", r"\(")):
        sqlfiles.parse(text, "x.sql")


def test_unknown_statement() -> None:
    with pytest.raises(sqlfiles.SQLFileError, match="unknown SQL statement 'nope'"):
        sqlfiles.statement("nope")
