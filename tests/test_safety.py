"""Nothing lost, nothing silently wrong, no traceback, whatever the command: no
output lands on the database, its WAL or an input; a database path that is a FIFO, an
SQLite file or locked says so; closed and full standard streams; stdin's failures said
with their real cause. Each checks the exact error text or the exact database state (a
failure of one module is tested in that module's file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import pagedkv_sql

from .helpers import DATA, SEED_OUTPUT, Cli, loaded, seed_state, snapshot

BIN = Path(sys.executable).parent / "pagedkv-sql"


def shell(command: str, cwd: Path, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run a command line in a real shell (for <&- >&- 2>&- and /dev/full)."""
    env = {**os.environ, "PATH": f"{BIN.parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PAGEDKV_DB", None)
    return subprocess.run(
        command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=60, **kw
    )


# -- data loss: outputs never land on the database, its WAL or an input -----------------


@pytest.mark.parametrize(
    "fmt, spelling",
    [
        ("tsv", "db.duckdb"),
        ("csv", "./db.duckdb"),
        ("json", "sub/../db.duckdb"),
        ("table", "link"),
        ("arrow", "db.duckdb"),
        ("parquet", "link"),
    ],
)
def test_output_never_overwrites_the_database(cli: Cli, fmt: str, spelling: str) -> None:
    path = loaded(cli, "db.duckdb")
    (cli.cwd / "sub").mkdir(exist_ok=True)
    if not (cli.cwd / "link").exists():
        (cli.cwd / "link").symlink_to(path)
    before = path.read_bytes()
    result: Any = cli("resolve", "--db", "db.duckdb", "-f", fmt, "-o", spelling)
    assert result.exit_code == 2
    assert result.stderr.startswith(
        f"Error: refusing to write {spelling}: it is the database (db.duckdb)\n"
    )
    assert path.read_bytes() == before
    assert cli("resolve", "--db", "db.duckdb").stdout == SEED_OUTPUT


def test_output_never_overwrites_the_wal(cli: Cli) -> None:
    loaded(cli, "db.duckdb")
    result: Any = cli("resolve", "--db", "db.duckdb", "-o", "db.duckdb.wal")
    assert result.exit_code == 2
    assert "it is the database's WAL (db.duckdb.wal)" in result.stderr
    assert not (cli.cwd / "db.duckdb.wal").exists()


# -- the database path ------------------------------------------------------------------


def test_fifo_as_db_does_not_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    run = shell("pagedkv-sql resolve --db fifo", tmp_path)
    assert run.returncode == 1
    assert run.stderr == (
        "Error: cannot open fifo: it is not a regular file (a FIFO, socket or device)\n"
        "Fix: a database is a regular file; give a path that names one or none yet\n"
    )


def test_sqlite_file_as_db_is_refused_before_duckdb_sees_it(tmp_path: Path) -> None:
    import sqlite3

    con = sqlite3.connect(tmp_path / "s.db")
    con.execute("CREATE TABLE t (a)")
    con.commit()
    con.close()
    before = (tmp_path / "s.db").read_bytes()
    for command in ("resolve", f"load {DATA}"):
        run = shell(f"pagedkv-sql {command} --db s.db", tmp_path)
        assert run.returncode == 1
        assert run.stderr.startswith("Error: cannot open s.db: it is a SQLite database\n")
    assert (tmp_path / "s.db").read_bytes() == before
    (tmp_path / "e.db").write_bytes(b"")
    run = shell(f"pagedkv-sql load {DATA} --db e.db", tmp_path)
    assert run.stderr.startswith("Error: cannot open e.db: it is an empty file, not a DuckDB")


def test_locked_writer_is_not_advised_to_open_read_only(tmp_path: Path) -> None:
    db = tmp_path / "l.duckdb"
    with pagedkv_sql.connect(db) as d:
        d.load(DATA)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb,time; c=duckdb.connect({str(db)!r}); "
            "print('held', flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        run = shell(f"pagedkv-sql load {DATA} --db l.duckdb", tmp_path)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert run.returncode == 1
    first = run.stderr.splitlines()[0]
    assert first.startswith("Error: database l.duckdb is locked by ")
    assert first.endswith(f"(PID {holder.pid})")
    assert "read-only" not in run.stderr


# -- standard streams --------------------------------------------------------------------


def test_closed_and_full_standard_streams(tmp_path: Path) -> None:
    shutil_copy = shell(f"pagedkv-sql load {DATA} --db s.duckdb", tmp_path)
    assert shutil_copy.returncode == 0
    before = snapshot(tmp_path / "s.duckdb")
    cases = {
        "pagedkv-sql resolve --db s.duckdb >&-": (
            1,
            "Error: standard output is closed; nothing was written\n"
            "Fix: redirect stdout or pass --output FILE\n",
        ),
        "pagedkv-sql resolve --db s.duckdb > /dev/full": (
            1,
            "Error: cannot write the output: No space left on device\n",
        ),
        "pagedkv-sql resolve --db s.duckdb -f parquet > /dev/full": (
            1,
            "Error: cannot write the output: No space left on device\n",
        ),
        "pagedkv-sql load - -r root_table --db s.duckdb <&-": (
            2,
            "Error: no standard input to read\n",
        ),
        "pagedkv-sql check --db s.duckdb >&-": (
            1,
            "Error: standard output is closed; nothing was written\n"
            "Fix: redirect stdout or pass --output FILE\n",
        ),
        "pagedkv-sql stats --db s.duckdb > /dev/full": (
            1,
            "Error: cannot write the output: No space left on device\n",
        ),
    }
    for command, (code, stderr) in cases.items():
        run = shell(command, tmp_path)
        assert (run.returncode, run.stderr) == (code, stderr), command
        assert "Traceback" not in run.stderr
    # stderr closed or full: the report is lost, the outcome is not (exit 0, loaded)
    for redirect in ("2>&-", "2>/dev/full"):
        run = shell(f"pagedkv-sql load {DATA} --db s2.duckdb {redirect}", tmp_path)
        assert run.returncode == 0, redirect
        assert snapshot(tmp_path / "s2.duckdb") == before
    run = shell(
        "printf '1\\t1.5\\n' | pagedkv-sql load - -r root_table --db s.duckdb 2>&-", tmp_path
    )
    assert run.returncode == 1
    assert snapshot(tmp_path / "s.duckdb") == before


def test_a_closed_stdout_is_never_the_database(tmp_path: Path) -> None:
    """With fd 1 closed, the database file would be opened as fd 1 and output written
    into it; the descriptor is reserved first."""
    run = shell(f"pagedkv-sql load {DATA} --db c.duckdb >&-", tmp_path)
    assert run.returncode == 0
    run = shell("pagedkv-sql resolve --db c.duckdb >&- 2>/dev/null", tmp_path)
    assert run.returncode == 1
    assert shell("pagedkv-sql resolve --db c.duckdb", tmp_path).stdout == SEED_OUTPUT


# -- unclear messages --------------------------------------------------------------------


def test_arrow_stdin_failures_say_the_real_cause(cli: Cli) -> None:
    loaded(cli)
    schema = pa.schema([("seq_id", pa.int64()), ("block_table_ptr", pa.int64())])
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, schema) as w:
        w.write_table(pa.table({"seq_id": [1, 2], "block_table_ptr": [3, 4]}, schema=schema))
    data = sink.getvalue().to_pybytes()
    truncated = data[: len(data) - 20]
    result: Any = cli("load", "-", "-f", "arrows", "-r", "root_table", input=truncated)
    assert result.exit_code == 1
    assert "already been consumed" not in result.stderr
    assert result.stderr.startswith("Error: <stdin>: the stream failed while it was being read: ")
    nulls = pa.table({"seq_id": [1, None], "block_table_ptr": [3, 4]}, schema=schema)
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, schema) as w:
        w.write_table(nulls)
    result = cli(
        "load", "-", "-f", "arrows", "-r", "root_table", input=sink.getvalue().to_pybytes()
    )
    assert result.exit_code == 1
    assert "column seq_id holds a null" in result.stderr
    assert snapshot(cli.cwd / "pagedkv.duckdb") == seed_state()


def test_stdin_spools_are_removed_when_arguments_are_refused(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    monkeypatch.setenv("TMPDIR", str(spool_dir))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    (cli.cwd / "root_table.facts").write_text("1\t2\n")
    result: Any = cli("load", "-", "root_table.facts", "-r", "root_table", input="3\t4\n")
    assert result.exit_code == 1
    assert "two sources for root_table" in result.stderr
    result = cli("load", "-", "-f", "tsv", "-r", "root_table", input="x\ty\n")
    assert result.exit_code == 1
    assert list(spool_dir.iterdir()) == []


STREAM_CASES = {
    "<&-": {"load": 0},
    ">&-": {"resolve": 1, "check": 1, "stats": 1, "explain": 1, "load": 0},
    "2>&-": {"resolve": 0, "check": 0, "stats": 0, "explain": 0, "load": 0},
    ">/dev/full": {"resolve": 1, "check": 1, "stats": 1, "explain": 1, "load": 0},
    "2>/dev/full": {"resolve": 0, "check": 0, "stats": 0, "explain": 0, "load": 0},
}
COMMANDS = {
    "resolve": "resolve",
    "check": "check",
    "stats": "stats",
    "explain": "explain 1 0",
    "load": f"load {DATA}",
}


@pytest.mark.slow
@pytest.mark.parametrize("redirect", list(STREAM_CASES))
def test_every_command_with_each_stream_closed_or_full(tmp_path: Path, redirect: str) -> None:
    """Exit codes: 1 when the command's data could not be written, else what the command
    does anyway (0 here); never a traceback; the database unchanged by the read-only ones."""
    assert shell(f"pagedkv-sql load {DATA} --db s.duckdb", tmp_path).returncode == 0
    before = snapshot(tmp_path / "s.duckdb")
    for name, command in COMMANDS.items():
        run = shell(f"pagedkv-sql {command} --db s.duckdb {redirect}", tmp_path)
        expected = STREAM_CASES[redirect].get(name, 0)
        assert run.returncode == expected, (name, redirect, run.stderr)
        assert "Traceback" not in run.stderr and "Exception ignored" not in run.stderr
        assert snapshot(tmp_path / "s.duckdb") == before


def test_a_failed_first_load_leaves_no_database(cli: Cli) -> None:
    (cli.cwd / "root_table.facts").write_text("1\t1.5\n")
    for args in (["root_table.facts"], ["missing.facts"], ["-", "-r", "root_table"]):
        result: Any = cli("load", *args, "--db", "new.duckdb", input="x\n")
        assert result.exit_code == 1, args
        assert sorted(p.name for p in cli.cwd.iterdir()) == ["root_table.facts"]


# No output of ours is a database: an existing DuckDB file is refused as an output, whatever
# --db says (`synth FILE --steps` has no --db to compare, so `synth pagedkv.duckdb --steps 5`
# would write a step log over the default database, rc 0).
@pytest.mark.parametrize(
    "args",
    [
        ["synth-log", "pagedkv.duckdb", "--steps", "5"],
        ["synth-log", "pagedkv.duckdb.wal", "--steps", "5"],
        ["synth-log", "other.duckdb", "--steps", "5"],
        ["resolve", "-o", "other.duckdb"],
        ["violations", "-o", "other.duckdb"],
        ["sql", "SELECT 1", "-o", "other.duckdb"],
    ],
    ids=["synth-default-db", "synth-wal", "synth-other-db", "resolve", "violations", "sql"],
)
def test_no_output_is_written_over_a_database(cli: Cli, args: list[str]) -> None:
    default = loaded(cli, "pagedkv.duckdb")
    other = loaded(cli, "other.duckdb")
    before = {p: p.read_bytes() for p in (default, other)}
    result: Any = cli(*args)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("Error: refusing to write "), result.stderr
    assert {p: p.read_bytes() for p in (default, other)} == before
    assert not (cli.cwd / "pagedkv.duckdb.wal").exists()


def test_synth_protects_the_database_named_by_the_environment(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a step log may overwrite an older step log, never the database $PAGEDKV_DB names
    (cli.cwd / "old.jsonl").write_text("{}\n")
    assert cli("synth", "old.jsonl", "--steps", "3").exit_code == 0  # type: ignore[attr-defined]
    monkeypatch.setenv("PAGEDKV_DB", "old.jsonl")
    result: Any = cli("synth", "old.jsonl", "--steps", "3")
    assert result.exit_code == 2
    assert "it is the database (old.jsonl)" in result.stderr
