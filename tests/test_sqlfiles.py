from __future__ import annotations

import dataclasses

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


@pytest.mark.parametrize("file", sorted(p.name for p in sqlfiles.sql_dir().glob("*.sql")))
def test_no_statement_doc_carries_its_plan(file: str) -> None:
    # the loader keeps the doc and the Plan: note apart, in every SQL file: `check` never
    # shows users "Plan: one anti-join of the tokens ..." as a check's description
    statements = sqlfiles.parse((sqlfiles.sql_dir() / file).read_text(encoding="utf-8"), file)
    assert statements
    for stmt in statements:
        assert "Plan:" not in stmt.doc, f"{file}:{stmt.line} {stmt.name}"
        assert not stmt.plan or stmt.plan.startswith("Plan:"), stmt.name
    planned = [s for s in statements if s.plan]
    assert planned or "Plan:" not in (sqlfiles.sql_dir() / file).read_text(encoding="utf-8")


def test_a_statement_plan_follows_its_doc() -> None:
    (stmt,) = sqlfiles.parse(
        "-- name: a\n-- What it finds.\n-- Plan: one scan;\n-- then a sort.\nSELECT 1;", "x.sql"
    )
    assert (stmt.doc, stmt.plan) == ("What it finds.", "Plan: one scan; then a sort.")


def test_unknown_statement() -> None:
    with pytest.raises(sqlfiles.SQLFileError, match="unknown SQL statement 'nope'"):
        sqlfiles.statement("nope")


def test_a_statement_doc_is_its_comment_lines_without_the_dashes() -> None:
    text = "-- name: a\n-- One line,\n--and the next.\n--\nSELECT 1;\n-- not doc\n"
    (statement,) = sqlfiles.parse(text, "x.sql")
    assert statement.doc == "One line, and the next."
    assert statement.sql == "SELECT 1;\n-- not doc"
    assert (statement.name, statement.file, statement.line) == ("a", "x.sql", 1)


# run alone and first for a mutant of check.py, load.py or sqlfiles.py at import
# (tools/mutate.toml [import_tests]): a frozen=True dropped from their values fails here
def test_the_packaged_statements_are_immutable_values() -> None:
    """One cached dict of them serves the whole process."""
    stats = sqlfiles.load_all()["stats"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.sql = "SELECT 1"  # type: ignore[misc]
