"""database.py: opening a database, its schema, and the Python API's defaults."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql import paths
from pagedkv_sql.errors import (
    DatabaseError,
    UsageError,
)

from .conftest import DATA, arrow_table, write_facts


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


def _unresolved(n: int) -> dict[str, list[tuple[int, ...]]]:
    """n tokens of a sequence that has no block table: n diag_unresolved_token findings."""
    return {"virtual_token": [(7, p, 0, p) for p in range(n)]}


def test_load_replaces_warns_and_does_not_refuse_by_default(tmp_path: Path) -> None:
    data = write_facts(tmp_path / "d", _unresolved(3))
    with pagedkv_sql.connect(":memory:") as db:
        db.load(write_facts(tmp_path / "first", _unresolved(5)))
        report = db.load(data)  # replaces what was there
        assert [(r.relation, r.mode, r.rows_total) for r in report.relations] == [
            ("root_table", "kept", 0),
            ("block_table_entry", "kept", 0),
            ("virtual_token", "replaced", 3),
            ("swapped_block", "kept", 0),
        ]
        assert [(w.name, w.count) for w in report.warnings] == [("diag_unresolved_token", 3)]
        arrow = db.load_arrow(
            "virtual_token", arrow_table("virtual_token", _unresolved(2)["virtual_token"])
        )
        assert [(w.name, w.count) for w in arrow.warnings] == [("diag_unresolved_token", 2)]
        assert [(r.relation, r.mode) for r in arrow.relations] == [("virtual_token", "replaced")]
        assert db.sql("SELECT count(*) FROM virtual_token").fetchall() == [(2,)]


def test_check_keeps_a_hundred_rows_of_each_by_default_the_limit_given_or_all() -> None:
    tokens = arrow_table("virtual_token", _unresolved(130)["virtual_token"])
    with pagedkv_sql.connect(":memory:") as db:
        db.load_arrow("virtual_token", tokens)
        for options, kept in [
            ({}, 100),
            ({"limit": 0}, 0),
            ({"limit": 127}, 127),
            ({"limit": None}, 130),
            ({"limit": 2**62}, 130),
            ({"limit": 2**63 - 1}, 130),
            ({"limit": 2**63}, 130),  # beyond DuckDB's BIGINT LIMIT: no LIMIT at all
            ({"limit": 2**64}, 130),
        ]:
            found = {r.name: r for r in db.check(**options).results}["diag_unresolved_token"]
            assert (found.count, found.rows.num_rows) == (130, kept), options
        with pytest.raises(pagedkv_sql.UsageError, match="limit must be 0 or more"):
            db.check(limit=-1)


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


def test_a_stored_step_log_replays_on_a_read_only_open(tmp_path: Path) -> None:
    from pagedkv_sql.replay.log import read_jsonl

    header = {"pagedkv_step_log": 1, "block_size": 4, "num_gpu_blocks": 8, "reserved_blocks": [0]}
    step = {"step": 0, "ops": [{"op": "allocate", "req": "a", "blocks": [1]}]}
    log = read_jsonl([json.dumps(header), json.dumps(step)], "<test>")
    file = tmp_path / "x.duckdb"
    with pagedkv_sql.connect(file) as db:
        assert db.replay(log).findings == []
    with pagedkv_sql.connect(file, read_only=True) as db:
        assert db.replay().findings == []
        with pytest.raises(pagedkv_sql.UsageError, match="open read-only"):
            db.replay(log)


def _batches(*rows: list[tuple[int, int, int]]) -> list[pa.RecordBatch]:
    from pagedkv_sql.relations import OUTPUT_SCHEMA

    return [
        pa.RecordBatch.from_pylist(
            [dict(zip(OUTPUT_SCHEMA.names, r, strict=True)) for r in batch], schema=OUTPUT_SCHEMA
        )
        for batch in rows
    ]


def test_sorted_output_drops_exact_duplicates_and_only_those() -> None:
    """Rows equal in the first column but not the others are kept; a duplicate is found in
    one batch and across batches, past empty and one-row batches."""
    from pagedkv_sql.readers import distinct_sorted as _distinct_sorted

    ended: list[bool] = []
    batches = _batches(
        [(1, 0, 5), (1, 0, 5), (1, 1, 5), (1, 1, 6)],
        [],
        [(1, 1, 6)],
        [(1, 1, 6), (2, 0, 5), (3, 0, 5)],
    )
    out = list(_distinct_sorted(batches, lambda: ended.append(True)))
    assert [tuple(r.values()) for b in out for r in b.to_pylist()] == [
        (1, 0, 5),
        (1, 1, 5),
        (1, 1, 6),
        (2, 0, 5),
        (3, 0, 5),
    ]
    assert ended == [True]
    assert len(list(_distinct_sorted(_batches([(1, 0, 5)], [(1, 0, 5)])))) == 2


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


@pytest.mark.parametrize(
    "message",
    [
        "IO Error: The file is not a valid DuckDB database file!",
        "IO Error: Corrupt database file: block checksum mismatch",
    ],
)
def test_either_corrupt_file_message_gets_the_database_file_hint(message: str) -> None:
    """paths.py: DuckDB says 'not a valid DuckDB database' or 'corrupt database file':
    each alone gets the hint (``and`` would ask for both)."""
    error = paths.database_io_error("x.duckdb", duckdb.IOException(message), "open")
    assert error.hint == "is it a DuckDB database file?"


# -- writers from several threads are serialized, never a write-write conflict (issue 28, U7) --


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


@pytest.mark.parametrize("args", [("a", 0), (0, None), (0, 1.0), (True, 0)])
def test_explain_refuses_what_is_no_token(db: pagedkv_sql.Database, args: Any) -> None:
    """Database.explain("a", None) is a UsageError, not an Explanation."""
    with pytest.raises(pagedkv_sql.UsageError, match="must be an integer"):
        db.explain(*args)


@pytest.mark.parametrize("args", [(2**70, 0), (0, 2**63), (-(2**63) - 1, 0)])
def test_explain_refuses_a_number_no_row_can_hold(db: pagedkv_sql.Database, args: Any) -> None:
    """explain(2**70, 0) is a UsageError, not an empty Explanation (the CLI refuses
    the same number as out of the signed 64-bit range)."""
    with pytest.raises(pagedkv_sql.UsageError, match="out of the signed 64-bit range"):
        db.explain(*args)
    assert db.explain(-(2**63), 2**63 - 1).seq_id == -(2**63)  # the ends themselves are fine


def test_progress_of_a_cursor_closed_under_the_poller_is_none_running() -> None:
    # the progress line's thread copies the busy cursors, then the command's thread closes
    # the last one: DuckDB's "Connection already closed!" reached the terminal as a thread's
    # traceback (review of issue 29's merge, which polls on a dozen commands)
    with pagedkv_sql.connect(":memory:") as db:
        closed = db.con.cursor()
        closed.close()
        db._busy.append(closed)
        assert db.progress() == -1.0
        db._busy.remove(closed)
