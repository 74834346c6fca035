"""cli/sql.py: `sql` (DuckDB's whole message, SQL from stdin, every error opening the
database one line); `example` is in test_example.py."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql.errors import QueryError

from .helpers import DATA, Cli, snapshot


@pytest.fixture
def seeded(cli: Cli) -> Cli:
    assert cli("load", str(DATA), "-q").exit_code == 0  # type: ignore[attr-defined]
    return cli


def test_a_refused_query_keeps_duckdbs_whole_message(seeded: Cli) -> None:
    """The candidates, 'Did you mean' and the LINE with its caret: what DuckDB says after
    its first line is what tells the user how to fix the query."""
    column: Any = seeded("sql", "select sq_id from root_table")
    assert column.exit_code == 1
    assert column.stderr == (
        'Error: sql: Binder Error: Referenced column "sq_id" not found in FROM clause!\n'
        '  Candidate bindings: "seq_id"\n'
    )
    table: Any = seeded("sql", "select * from root_tabel")
    assert table.stderr.splitlines()[1] == '  Did you mean "root_table"?'
    caret: Any = seeded("sql", "select 'a'::int")
    line, under = caret.stderr.splitlines()[1:]
    if line == "  LINE 1: SELECT CAST('a' AS INTEGER)":  # older DuckDB echoes its own SQL
        assert under.strip().startswith("^")
        return
    assert line == "  LINE 1: select 'a'::int"
    assert under.index("^") == line.index("::int") and under.strip() == "^^^^^"
    # a tab is one column to DuckDB's caret: shown as one space, the caret keeps its place
    tabbed: Any = seeded("sql", "select\t'a'::int")
    assert tabbed.stderr.splitlines()[1:] == [line, under[1:]]


def test_duckdbs_lines_are_shown_escaped(seeded: Cli) -> None:
    """The query is echoed in DuckDB's LINE: its escape sequences are shown, never obeyed."""
    result: Any = seeded("sql", "select '\x1b]0;pwned\x07'::int")
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr
    echoed = [x for x in result.stderr.splitlines() if x.startswith("  LINE 1: ")]
    assert len(echoed) == 1 and "'\\x1b]0;pwned\\x07'" in echoed[0], result.stderr


def test_database_sql_gives_duckdbs_lines_as_details(db: pagedkv_sql.Database) -> None:
    with pytest.raises(QueryError) as e:
        db.sql("select sq_id from root_table")
    assert e.value.message.startswith("SQL error: Binder Error: Referenced column")
    assert e.value.details == ['Candidate bindings: "seq_id"']
    assert str(e.value) == (
        'SQL error: Binder Error: Referenced column "sq_id" not found in FROM clause!\n'
        'Candidate bindings: "seq_id"'
    )
    with pytest.raises(QueryError) as table:
        db.sql("select * from root_tabel")
    assert str(table.value).splitlines()[1:2] == ['Did you mean "root_table"?']
    assert type(e.value.__cause__).__name__ == "BinderException"


def test_sql_reads_the_query_from_stdin_with_a_dash(seeded: Cli) -> None:
    script = "CREATE TEMP TABLE t AS SELECT 41 AS x;\nSELECT x + 1 AS y FROM t;\n"
    result: Any = seeded("sql", "-", "-f", "csv", input=script)
    assert (result.exit_code, result.stdout) == (0, "y\n42\n")
    empty: Any = seeded("sql", "-", input="  \n")
    assert (empty.exit_code, empty.stderr.splitlines()[0]) == (2, "Error: no SQL on stdin")
    binary: Any = seeded("sql", "-", input=b"\xffselect 1")
    assert binary.exit_code == 1
    assert binary.stderr.startswith("Error: <stdin>: the SQL is not UTF-8 text")


@pytest.mark.parametrize(
    ("db", "code", "message"),
    [
        ("missing.duckdb", 1, "Error: no database at missing.duckdb"),
        ("", 2, "Error: --db is empty (an unset variable?)"),
        ("notes.txt", 1, "Error: cannot open notes.txt: it is not a DuckDB database"),
        ("folder", 1, "Error: cannot open folder: it is a directory, not a database file"),
    ],
)
@pytest.mark.parametrize("write", [False, True])
def test_every_error_opening_the_database_is_one_line(
    cli: Cli, db: str, code: int, message: str, write: bool
) -> None:
    (cli.cwd / "notes.txt").write_text("not a database\n")
    (cli.cwd / "folder").mkdir()
    result: Any = cli("sql", "select 1", "--db", db, *(["--write"] if write else []))
    assert result.exit_code == code
    assert result.stderr.splitlines()[0] == message
    assert "Traceback" not in result.stderr
    if db == "folder":
        assert "Fix: give --db (or $PAGEDKV_DB) a file, e.g. folder/kv.duckdb" in result.stderr
    # --write never creates a database (as `repair`): a typo is no new, empty file
    assert sorted(p.name for p in cli.cwd.iterdir()) == ["folder", "notes.txt"]


def test_a_locked_database_is_one_line_too(seeded: Cli) -> None:
    path = seeded.cwd / "pagedkv.duckdb"
    before = snapshot(path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('ready', flush=True);"
            " time.sleep(30)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        for write in ([], ["--write"]):
            result: Any = seeded("sql", "select 1", *write)
            assert result.exit_code == 1
            assert result.stderr.startswith("Error: database pagedkv.duckdb is locked by ")
            assert "Traceback" not in result.stderr
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    assert snapshot(path) == before


def test_without_write_no_file_but_the_database_is_touched(seeded: Cli) -> None:
    """COPY TO (over another database, or outside the directory), EXPORT, ATTACH, INSTALL
    and read_csv are refused with a Fix; DuckDB's access cannot be turned on again; the
    database's tables and views read as before, and SET of a plain option still works."""
    work = seeded.cwd
    (work / "victim.duckdb").write_bytes((work / "pagedkv.duckdb").read_bytes())
    before = (work / "victim.duckdb").read_bytes()
    for query in (
        "copy (select 1 as x) to 'victim.duckdb' (format csv)",
        "copy block_table_entry to '../escape.csv'",
        "export database 'exported'",
        "attach 'other.duckdb'",
        "install httpfs",
        "select * from read_csv('victim.duckdb')",
    ):
        result: Any = seeded("sql", query)
        assert result.exit_code == 1, (query, result.output)
        assert "file system operations are disabled" in result.stderr, result.stderr
        assert "Fix: without --write `sql` reads the database and no other file" in (
            result.stderr
        )
    again: Any = seeded("sql", "set enable_external_access = true")
    assert again.exit_code == 1 and "Cannot enable external access" in again.stderr
    assert (work / "victim.duckdb").read_bytes() == before
    assert not (work.parent / "escape.csv").exists() and not (work / "other.duckdb").exists()
    assert not (work / "exported").exists()
    read: Any = seeded("sql", "set threads = 1; select count(*) AS n from block_table_entry")
    assert read.exit_code == 0 and read.stdout.split()[:2] == ["n", "4"], read.output
    view: Any = seeded("sql", "select count(*) from diag_conflicting_root", "-f", "csv")
    assert view.exit_code == 0, view.output


def test_with_write_copy_writes_as_duckdb_does(seeded: Cli) -> None:
    result: Any = seeded("sql", "copy (select 1 as x) to 'w.csv'", "--write")
    assert result.exit_code == 0, result.output
    assert (seeded.cwd / "w.csv").read_text().split() == ["x", "1"]
