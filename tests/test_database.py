"""database.py: opening a database, its schema, and the Python API's defaults."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql.errors import DatabaseError, UsageError
from pagedkv_sql.relations import INPUT_RELATIONS, arrow_schema

from .helpers import DATA, SEED_OUTPUT, Cli, arrow_table, loaded, seed_state, snapshot, tsv


def test_a_database_opens_writable_unless_asked(tmp_path: Path) -> None:
    from pagedkv_sql.database import Database

    with Database(tmp_path / "w.duckdb") as database:
        assert not database.read_only
        database.load(DATA)
    with Database() as memory:
        assert not memory.read_only
        memory.load(DATA)
        assert memory.resolve().read_all().num_rows == 7


def test_a_read_only_duckdb_connection_makes_a_read_only_database(tmp_path: Path) -> None:
    import duckdb

    from pagedkv_sql.database import Database

    path = tmp_path / "r.duckdb"
    with Database(path) as database:
        database.load(DATA)
    con = duckdb.connect(str(path), read_only=True)
    try:
        database = Database(con)
        assert database.read_only
        with pytest.raises(UsageError, match="is open read-only"):
            database.load(DATA)
        assert database.resolve().read_all().num_rows == 7
    finally:
        con.close()


def test_an_empty_file_is_refused_as_a_database_and_left_empty(tmp_path: Path) -> None:
    empty = tmp_path / "e.db"
    empty.write_bytes(b"")
    with pytest.raises(DatabaseError) as e:
        pagedkv_sql.connect(empty)
    assert "it is an empty file, not a DuckDB database" in str(e.value)
    assert empty.read_bytes() == b""


def test_the_cli_database_is_pagedkv_db_or_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from pagedkv_sql.database import default_path

    monkeypatch.delenv("PAGEDKV_DB", raising=False)
    assert default_path() == "pagedkv.duckdb"
    monkeypatch.setenv("PAGEDKV_DB", "")  # set but empty: as if unset
    assert default_path() == "pagedkv.duckdb"
    monkeypatch.setenv("PAGEDKV_DB", "elsewhere.duckdb")
    assert default_path() == "elsewhere.duckdb"


def test_opening_a_file_creates_it_unless_it_must_exist_or_is_read_only(tmp_path: Path) -> None:
    with pagedkv_sql.connect(tmp_path / "new.duckdb") as db:
        assert db.created
    for options in ({"must_exist": True}, {"read_only": True}):
        missing = tmp_path / "missing.duckdb"
        with pytest.raises(DatabaseError) as e:
            pagedkv_sql.connect(missing, **options)  # type: ignore[arg-type]
        assert str(e.value) == f"no database at {missing}"
        assert not missing.exists()


def test_a_corrupt_database_file_is_named_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.duckdb"
    bad.write_bytes(b"\0" * 8 + b"DUCK" + b"\x07" * 8000)  # the magic, then garbage
    with pytest.raises(DatabaseError) as e:
        pagedkv_sql.connect(bad)
    assert str(e.value).startswith(f"cannot open {bad}: ")
    assert e.value.hint == "is it a DuckDB database file?"
    assert bad.read_bytes()[:12] == b"\0" * 8 + b"DUCK"  # left as it was


def test_a_connection_keeps_its_path_and_a_closed_one_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "x.duckdb"
    con = duckdb.connect(str(file))
    with pagedkv_sql.connect(con) as db:
        assert db.path == str(file)
    memory = duckdb.connect()
    with pagedkv_sql.connect(memory) as db:
        assert db.path == ":memory:"
        memory.close()  # closed under the Database by its owner
        with pytest.raises(DatabaseError, match=r"^check: .*closed"):
            db.check()
        with pytest.raises(DatabaseError, match=r"closed"):
            db.resolve()
    with pytest.raises(DatabaseError, match=r"^cannot use the connection: .*closed"):
        pagedkv_sql.connect(memory)
    con.close()


def test_a_view_dropped_under_an_open_database_is_a_database_error() -> None:
    with pagedkv_sql.connect(":memory:") as db:
        db.sql("DROP VIEW resolved_kv_address_cpu")
        with pytest.raises(DatabaseError, match=r"^reading :memory:: "):
            db.resolve()


def test_opening_a_current_database_to_write_leaves_its_file_as_it_was(tmp_path: Path) -> None:
    file = tmp_path / "x.duckdb"
    with pagedkv_sql.connect(file) as db:
        db.load(DATA)
    before = file.read_bytes()
    with pagedkv_sql.connect(file):
        pass
    assert file.read_bytes() == before


def test_repair_rewrites_a_view_changed_in_the_shell() -> None:
    with pagedkv_sql.connect(":memory:") as db:
        db.load(DATA)
        db.sql(
            "CREATE OR REPLACE VIEW resolved_kv_address AS "
            "SELECT * FROM resolved_kv_address_gpu LIMIT 0"
        )
        count = "SELECT count(*) FROM resolved_kv_address"
        assert db.sql(count).fetchall() == [(0,)]
        db.repair()
        assert db.sql(count).fetchall() == [(7,)]


def test_progress_is_minus_one_when_nothing_runs() -> None:
    with pagedkv_sql.connect(":memory:") as db:
        assert db.progress() == -1.0


def test_the_output_relation_comes_sorted_and_the_others_as_stored() -> None:
    with pagedkv_sql.connect(":memory:") as db:
        db.load_arrow("root_table", arrow_table("root_table", [(3, 30), (1, 10), (2, 20)]))
        assert db.relation("root_table").fetchall() == [(3, 30), (1, 10), (2, 20)]
        db.load(DATA)
        rows = db.relation("resolved_kv_address").fetchall()
        assert rows == sorted(rows) and len(rows) == 7


def test_a_stream_read_to_the_end_lets_go_of_the_file(tmp_path: Path) -> None:
    """A reader kept after its last batch holds no cursor: the database closes for real,
    and the file opens again with other settings (DuckDB refuses that while an instance
    of it is alive in this process)."""
    file = tmp_path / "x.duckdb"
    with pagedkv_sql.connect(file) as db:
        db.load(DATA)
    db = pagedkv_sql.connect(file)
    readers = [db.resolve(), db.reader("virtual_token")]
    assert [r.read_all().num_rows for r in readers] == [7, 8]
    db.close()
    with pagedkv_sql.connect(file, read_only=True) as again:
        assert again.resolve_table().num_rows == 7
    del readers


def test_a_database_given_as_a_connection_was_not_created_by_pagedkv(tmp_path: Path) -> None:
    con = duckdb.connect()
    with pagedkv_sql.connect(con) as db:
        assert db.created is False
        assert repr(db) == "<pagedkv_sql.Database ':memory:' read-write>"
    con.close()
    file = tmp_path / "x.duckdb"
    pagedkv_sql.connect(file).close()
    with pagedkv_sql.connect(file, read_only=True) as db:
        assert repr(db) == f"<pagedkv_sql.Database {str(file)!r} read-only>"


def test_a_view_dropped_in_the_shell_is_named_with_its_kind(tmp_path: Path) -> None:
    file = tmp_path / "x.duckdb"
    with pagedkv_sql.connect(file) as db:
        db.sql("DROP VIEW resolved_kv_address_cpu")
    with pytest.raises(DatabaseError) as e:
        pagedkv_sql.connect(file, read_only=True)
    assert str(e.value) == (
        f"{file} lacks view resolved_kv_address_cpu (dropped from the DuckDB shell?)"
    )
    pagedkv_sql.connect(file).close()  # a writable open recreates it
    with pagedkv_sql.connect(file, read_only=True) as db:
        assert db.resolve_table().num_rows == 0


def test_a_database_in_a_directory_that_is_not_there_is_refused_cleanly(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "x.duckdb"
    with pytest.raises(DatabaseError, match=rf"^cannot open {re.escape(str(missing))}: "):
        pagedkv_sql.connect(missing)
    assert list(tmp_path.iterdir()) == []


def test_a_stale_schema_stamp_is_renewed_though_no_object_is_missing(tmp_path: Path) -> None:
    """database.py: renewal is skipped only when the stamp is current *and* nothing is
    missing (``or`` would skip it whenever nothing is missing)."""
    path = tmp_path / "t.duckdb"
    pagedkv_sql.connect(path).close()
    con = duckdb.connect(str(path))
    con.execute("COMMENT ON TABLE pagedkv_settings IS 'pagedkv-sql schema old'")
    con.close()
    pagedkv_sql.connect(path).close()
    con = duckdb.connect(str(path), read_only=True)
    (comment,) = con.execute(
        "SELECT comment FROM duckdb_tables() WHERE table_name = 'pagedkv_settings'"
    ).fetchone()
    con.close()
    assert comment.startswith("pagedkv-sql schema ") and comment != "pagedkv-sql schema old"


def test_close_closes_the_streams_still_open_on_a_connection_it_does_not_own() -> None:
    """database.py: close() ends every reader still open, even when the connection stays
    open (one passed to connect): reading on after close is refused."""
    con = duckdb.connect()
    db = pagedkv_sql.connect(con)
    db.load(DATA)
    reader = db.reader("resolved_kv_address", batch_size=1)
    db.close()
    with pytest.raises((ValueError, duckdb.Error, OSError, pa.ArrowException)):
        for _ in reader:
            pass
    con.close()


def test_outputs_have_the_fixed_schema() -> None:
    with pagedkv_sql.connect(":memory:") as db:
        db.load(DATA)
        assert db.resolve().schema == arrow_schema("resolved_kv_address")
        assert db.reader("block_table_entry").schema == arrow_schema("block_table_entry")
        assert all(not f.nullable and f.type == pa.int64() for f in db.resolve().schema)
        assert db.reader("diag_unresolved_token").read_all().num_rows == 1
        assert db.violations().num_rows == 2


def test_resolve_arrow_in_one_call() -> None:
    with pagedkv_sql.connect(":memory:") as db:
        db.load(DATA)
        inputs = {r: db.reader(r).read_all() for r in pagedkv_sql.INPUT_RELATIONS}
    out = pagedkv_sql.resolve_arrow(**inputs)
    assert "".join("\t".join(map(str, r.values())) + "\n" for r in out.to_pylist()) == SEED_OUTPUT


def test_request_ids_sit_right_after_seq_id(db: pagedkv_sql.Database) -> None:
    """When a capability names the requests (the view pagedkv_request_label), results
    carry a request_id column right after seq_id: in resolve's stream and in checks."""
    from .helpers import DATA

    db.load(DATA)
    db.con.execute(
        "CREATE VIEW pagedkv_request_label AS SELECT * FROM "
        "(VALUES (1::BIGINT, 'req-a'), (2::BIGINT, 'req-b')) AS t(seq_id, request_id)"
    )
    labelled = db.label_requests(db.resolve()).read_all()
    assert labelled.column_names == ["seq_id", "request_id", "token_pos", "physical_address"]
    assert set(labelled.column("request_id").to_pylist()) == {"req-a", "req-b"}
    found = {r.name: r.rows for r in db.check().results if r.count}
    names = found["diag_unresolved_token"].column_names
    assert names[: names.index("seq_id") + 2][-2:] == ["seq_id", "request_id"]


def test_arrow_in_and_out(db: pagedkv_sql.Database) -> None:
    db.load(DATA)
    tokens = db.reader("virtual_token").read_all()
    assert tokens.schema == arrow_schema("virtual_token")
    other = pagedkv_sql.connect(":memory:")
    for relation in INPUT_RELATIONS:
        other.load_arrow(relation, db.reader(relation).read_all())
    assert tsv(other.resolve_table()) == SEED_OUTPUT
    reader = db.resolve()
    assert isinstance(reader, pa.RecordBatchReader)
    assert reader.schema == arrow_schema("resolved_kv_address")
    assert reader.read_all().num_rows == 7


def test_readers_do_not_block_the_connection(db: pagedkv_sql.Database) -> None:
    db.load(DATA)
    reader = db.resolve(batch_size=2)
    first = reader.read_next_batch()
    assert db.sql("SELECT count(*) AS n FROM root_table").to_arrow_table().to_pylist() == [{"n": 2}]
    assert first.num_rows >= 1
    reader.close()


def test_a_locked_database_is_a_clear_error_not_a_hang(cli: Cli) -> None:
    path = cli.cwd / "pagedkv.duckdb"
    pagedkv_sql.connect(path).close()
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
        started = time.monotonic()
        result: Any = cli("load", str(DATA))
        # not a speed figure: the holder keeps its lock for 30 s, so an answer well before
        # that means the load did not wait for the lock (a loaded machine may take seconds)
        assert time.monotonic() - started < 20.0
        assert result.exit_code == 1
        first = result.stderr.splitlines()[0]
        assert first.startswith("Error: database pagedkv.duckdb is locked by ")
        assert f"(PID {holder.pid})" in first
        assert result.stderr.splitlines()[1] == (
            "Fix: wait for that process to finish (or close that DuckDB shell) and retry"
        )
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    assert snapshot(path) == before


def test_empty_db_path_is_a_usage_error(cli: Cli) -> None:
    result: Any = cli("load", str(DATA), "--db", "")
    assert result.exit_code == 2
    assert result.stderr == (
        "Error: --db is empty (an unset variable?)\n"
        "Fix: give a database file, or ':memory:' for a throwaway database\n"
    )
    with pytest.raises(UsageError):
        pagedkv_sql.connect("")


def test_a_dropped_view_is_named_with_its_repair(cli: Cli) -> None:
    path = loaded(cli)
    con = duckdb.connect(str(path))
    con.execute("DROP VIEW spec_unaligned_base")
    con.close()
    for command in ("check", "resolve", "stats"):
        result: Any = cli(command)
        assert result.exit_code == 1
        assert result.stderr == (
            "Error: pagedkv.duckdb lacks view spec_unaligned_base (dropped from the DuckDB "
            "shell?)\nFix: recreate them with `pagedkv-sql repair --db pagedkv.duckdb`; the "
            "facts are untouched\n"
        )
    result = cli("repair")
    assert result.exit_code == 0
    assert result.stderr == "repaired pagedkv.duckdb\n"
    assert cli("check").exit_code == 0
    assert snapshot(path) == seed_state()


# -- writers from several threads are serialized, never a write-write conflict ------------


def _tokens(n: int, seqs: int) -> Any:
    import numpy as np
    import pyarrow as pa

    i = np.arange(n, dtype=np.int64)
    return pa.table(
        {
            "seq_id": i % seqs,
            "token_pos": i // seqs,
            "block_index": (i // seqs) // 16,
            "offset_in_block": (i // seqs) % 16,
        }
    )


@pytest.mark.parametrize("where", ["file", ":memory:", "two opens of one file"])
def test_writes_from_several_threads_wait_for_each_other(tmp_path: Path, where: str) -> None:
    """Four threads writing at once through one Database (or two Databases of one file):
    load_arrow, load, load_engine and replay/apply, several times each. Unserialized,
    DuckDB fails some with "write-write conflict" / "Conflict on tuple deletion"."""
    import threading

    from tests.engines.example import example

    path = ":memory:" if where == ":memory:" else str(tmp_path / "x.duckdb")
    first = pagedkv_sql.connect(path)
    second = pagedkv_sql.connect(path) if where == "two opens of one file" else first
    log = tmp_path / "l.jsonl"
    log.write_text(
        '{"step":0,"ops":[{"op":"allocate","req":"a","blocks":[1]},'
        '{"op":"append","req":"a","tokens":3}]}\n'
    )
    table = _tokens(100_000, 50)
    errors: list[str] = []

    def writes(job: int) -> None:
        db = first if job % 2 else second
        try:
            for _ in range(3):
                if job == 0:
                    db.load_arrow("virtual_token", table, diagnostics=False)
                elif job == 1:
                    db.load(DATA, diagnostics=False)
                elif job == 2:
                    db.load_engine(example(), diagnostics=False)
                else:
                    db.replay(str(log))
                    db.replay_at(0)
        except Exception as e:  # what DuckDB said, to show in the assertion
            errors.append(f"job {job}: {e}")

    threads = [threading.Thread(target=writes, args=(j,)) for j in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert first.resolve_table().num_rows >= 0
    finally:
        first.close()
        if second is not first:
            second.close()


@pytest.mark.parametrize("database", [123, 1.5, b"x.duckdb", ["x"]])
def test_a_database_that_is_no_path_is_refused_and_no_file_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database: Any
) -> None:
    """connect(123) is a UsageError, not a file named 123."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(pagedkv_sql.UsageError, match="a database is a file path"):
        pagedkv_sql.connect(database)
    assert list(tmp_path.iterdir()) == []


def test_progress_of_a_cursor_closed_under_the_poller_is_none_running() -> None:
    # the progress line's thread copies the busy cursors, then the command's thread closes
    # the last one: DuckDB's "Connection already closed!" must not reach the terminal as a
    # thread's traceback (the progress line polls on a dozen commands)
    with pagedkv_sql.connect(":memory:") as db:
        closed = db.con.cursor()
        closed.close()
        db._busy.append(closed)
        assert db.progress() == -1.0
        db._busy.remove(closed)
