"""Nothing lost, nothing silently wrong, no traceback. One test (or more) per
failure found, each checking the exact error text or the exact database state, and a
property test over each class where one fits (path spellings, line lengths, numbers)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv_sql
from pagedkv_sql import InputError, UsageError

from .conftest import DATA, SEED_OUTPUT, Cli, snapshot

BIN = Path(sys.executable).parent / "pagedkv-sql"
_SEED: dict[str, list[tuple[int, ...]]] = {}


def seed_state() -> dict[str, list[tuple[int, ...]]]:
    """The seed data as snapshot() shows it."""
    if not _SEED:
        with pagedkv_sql.connect(":memory:") as db:
            db.load(DATA)
            for r in ("root_table", "block_table_entry", "virtual_token", "swapped_block"):
                rows = db.sql(f"SELECT * FROM {r}").to_arrow_table().to_pylist()
                _SEED[r] = sorted(tuple(x.values()) for x in rows)
    return _SEED


def loaded(cli: Cli, db: str = "pagedkv.duckdb") -> Path:
    result: Any = cli("load", str(DATA), "--db", db)
    assert result.exit_code == 0, result.stderr
    return cli.cwd / db


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


def test_protect_output_refuses_inputs_and_hard_links(tmp_path: Path) -> None:
    from pagedkv_sql.paths import protect_output

    source = tmp_path / "in.facts"
    source.write_text("1\t2\n")
    os.link(source, tmp_path / "hard")
    with pytest.raises(UsageError, match="it is an input of this command"):
        protect_output(tmp_path / "hard", None, [source])
    protect_output(tmp_path / "other", str(tmp_path / "db"), [source])  # fine


def test_a_failed_output_leaves_no_partial_file(tmp_path: Path) -> None:
    from pagedkv_sql.errors import PagedKVError
    from pagedkv_sql.paths import atomic_output

    out = tmp_path / "out.tsv"
    out.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_output(out) as f:
        f.write(b"half")
        raise RuntimeError("writer failed")
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tsv"]
    with (
        pytest.raises(PagedKVError, match=r"cannot write .*: No such file or directory"),
        atomic_output(tmp_path / "missing" / "x"),
    ):
        pass


def test_load_of_a_directory_without_facts_is_an_error(cli: Cli) -> None:
    path = loaded(cli)
    before = snapshot(path)
    cases = {
        "empty": [],
        "txt": ["notes.txt", "root_table.txt"],
    }
    for name, files in cases.items():
        d = cli.cwd / name
        d.mkdir()
        for f in files:
            (d / f).write_text("1\t2\n")
        result: Any = cli("load", name)
        assert result.exit_code == 1
        found = " (found only: notes.txt, root_table.txt)" if files else ""
        assert result.stderr.splitlines()[0] == (
            f"Error: {name}: no facts in this directory{found}; nothing was loaded"
        )
    (cli.cwd / "dangling").mkdir()
    (cli.cwd / "dangling" / "root_table.facts").symlink_to(cli.cwd / "nowhere")
    result = cli("load", "dangling")
    assert result.stderr == (
        f"Error: dangling/root_table.facts: a broken symbolic link (to {cli.cwd / 'nowhere'})\n"
    )
    (cli.cwd / "subdir" / "root_table.facts").mkdir(parents=True)
    result = cli("load", "subdir")
    assert result.stderr == (
        "Error: subdir/root_table.facts: a directory where a fact file was expected\n"
    )
    assert snapshot(path) == before


def test_a_directory_load_keeps_relations_without_a_file_unless_asked(cli: Cli) -> None:
    path = loaded(cli)
    d = cli.cwd / "part"
    d.mkdir()
    (d / "root_table.facts").write_text("7\t700\n")
    result: Any = cli("load", "part")
    assert result.exit_code == 0
    assert "swapped_block         1  -     -           kept      (no file: kept)" in result.stderr
    state = snapshot(path)
    assert state["root_table"] == [(7, 700)]
    assert state["swapped_block"] == seed_state()["swapped_block"]
    result = cli("load", "part", "--empty-missing")
    assert result.exit_code == 0
    assert "(no file: emptied)" in result.stderr
    assert snapshot(path) == {
        "root_table": [(7, 700)],
        "block_table_entry": [],
        "virtual_token": [],
        "swapped_block": [],
    }


def test_empty_db_path_is_a_usage_error(cli: Cli) -> None:
    result: Any = cli("load", str(DATA), "--db", "")
    assert result.exit_code == 2
    assert result.stderr == (
        "Error: --db is empty (an unset variable?)\n"
        "Fix: give a database file, or ':memory:' for a throwaway database\n"
    )
    with pytest.raises(UsageError):
        pagedkv_sql.connect("")


# -- paths are taken literally ---------------------------------------------------------


GLOBBY = ["a[12]", "a*", "a?", "{a,b}", "~", "~x", "a b", "a'b", 'a"b', "[!x]", "a,b", "é"]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    name=st.sampled_from(GLOBBY) | st.text(st.sampled_from("ab[]*?{},~ '!-"), min_size=1),
    fmt=st.sampled_from(["facts", "csv", "tsv", "parquet", "arrow", "dl"]),
)
def test_the_path_given_is_the_file_read(tmp_path: Path, name: str, fmt: str) -> None:
    """Decoys beside the file would be read if the name were expanded as a glob."""
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    for decoy in ("a1", "a2", "ab", "b", "x", "a", "aa"):
        (work / f"{decoy}.{fmt}").write_text("garbage\n")
    target = work / f"{name}.{fmt}"
    table = pa.table({"seq_id": [5], "block_table_ptr": [500]})
    if fmt == "parquet":
        pq.write_table(table, target)
    elif fmt == "arrow":
        with ipc.new_file(target, table.schema) as w:
            w.write_table(table)
    elif fmt == "dl":
        target.write_text("root_table(5, 500).\n")
    elif fmt == "facts":
        target.write_text("5\t500\n")
    else:
        sep = "," if fmt == "csv" else "\t"
        target.write_text(f"seq_id{sep}block_table_ptr\n5{sep}500\n")
    # A private temporary directory: the copies a load makes of such names go there, and
    # none may stay (a shared /tmp would see other processes' copies and leftovers).
    scratch = Path(tempfile.mkdtemp(dir=tmp_path))
    cwd, saved = os.getcwd(), tempfile.tempdir
    os.chdir(work)
    tempfile.tempdir = str(scratch)
    try:
        with pagedkv_sql.connect(":memory:") as db:
            extra = {} if fmt == "dl" else {"relation": "root_table"}
            db.load(target.name, diagnostics=False, **extra)
            assert db.sql("SELECT * FROM root_table").to_arrow_table().to_pylist() == [
                {"seq_id": 5, "block_table_ptr": 500}
            ]
    finally:
        os.chdir(cwd)
        tempfile.tempdir = saved
    assert not list(scratch.iterdir())


def test_special_files_are_read_not_reported_missing(cli: Cli) -> None:
    fifo = cli.cwd / "fifo"
    os.mkfifo(fifo)
    writer = subprocess.Popen(["sh", "-c", f"printf '1\\t100\\n' > {fifo}"])
    result: Any = cli("load", "fifo", "-f", "facts", "-r", "root_table", "--db", "f.duckdb")
    writer.wait()
    assert result.exit_code == 0, result.stderr
    assert snapshot(cli.cwd / "f.duckdb")["root_table"] == [(1, 100)]
    result = cli("load", "/dev/null", "-f", "facts", "-r", "root_table", "--db", "f.duckdb")
    assert result.exit_code == 0
    assert snapshot(cli.cwd / "f.duckdb")["root_table"] == []


def test_a_file_that_reports_size_zero_is_read_whole(tmp_path: Path) -> None:
    """/proc files say st_size 0 and have content: every byte is read (and here refused)."""
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load("/proc/self/status", format="facts", relation="root_table")
    assert e.value.problems[0].message.startswith("seq_id: invalid number 'Name:'")


# -- every byte loaded or reported ------------------------------------------------------


@pytest.mark.parametrize(
    "content, line",
    [
        (b"1" * 35_000_000 + b"\n2\t200\n", 1),
        (b"2\t200\n" + b"1" * 35_000_000, 2),
        (b"2\t200\n" + b"1" * 35_000_000 + b"\n", 2),
        (b"2\t200\r\n" + b"1" * 3_000_000 + b"\r\n3\t300\r\n", 2),
        (b"2\t200\r" + b"1" * 3_000_000 + b"\r", 2),
    ],
)
def test_long_lines_are_reported(tmp_path: Path, content: bytes, line: int) -> None:
    f = tmp_path / "root_table.facts"
    f.write_bytes(content)
    with pagedkv_sql.connect(":memory:") as db:
        with pytest.raises(InputError) as e:
            db.load(f)
        assert e.value.total == 1
        p = e.value.problems[0]
        assert p.line == line
        assert p.message.startswith("a line of ")
        assert p.message.endswith(
            "longer than any fact line can be (at most 1,048,576 bytes are read a line)"
        )
        assert db.sql("SELECT count(*) AS n FROM root_table").to_arrow_table().to_pylist() == [
            {"n": 0}
        ]


def test_csv_header_then_a_long_line(tmp_path: Path) -> None:
    f = tmp_path / "root_table.csv"
    f.write_bytes(b"seq_id,block_table_ptr\n" + b"1" * 40_000_000 + b"\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert str(e.value.problems[0]).startswith(f"{f}:2: a line of 40,000,000 bytes")


def test_nul_bytes_are_reported(tmp_path: Path) -> None:
    f = tmp_path / "virtual_token.facts"
    f.write_bytes(b"\0" * 50_000_000)
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert e.value.problems[0].message.startswith("a line of 50,000,000 bytes")
    f.write_bytes(b"1\t0\t0\t0\n\0\n1\t1\t0\t1\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert [str(p) for p in e.value.problems] == [
        f"{f}:2: 1 field(s), expected 4 (seq_id, token_pos, block_index, offset_in_block) "
        "separated by a tab"
    ]


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    sizes=st.lists(
        st.sampled_from([0, 1, 5, 600_000, 1_048_576, 1_048_577, 2_500_000]), max_size=4
    ),
    ending=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    final=st.booleans(),
)
def test_every_line_length_is_loaded_or_reported(
    tmp_path: Path, sizes: list[int], ending: bytes, final: bool
) -> None:
    """Good lines around lines of any length: the good ones load only if no line is bad,
    and every bad one is named by its number."""
    lines = [b"1\t100"]
    for n in sizes:
        lines += [b"7" * n, b"2\t200"]
    data = ending.join(lines) + (ending if final else b"")
    f = tmp_path / "root_table.facts"
    f.write_bytes(data)
    bad = [i + 1 for i, line in enumerate(lines) if line and b"\t" not in line]
    with pagedkv_sql.connect(":memory:") as db:
        if not bad:
            db.load(f, diagnostics=False)
            rows = db.sql("SELECT * FROM root_table ORDER BY ALL").to_arrow_table().to_pylist()
            assert len(rows) == (2 if sizes else 1)
            return
        with pytest.raises(InputError) as e:
            db.load(f, diagnostics=False)
        assert [p.line for p in e.value.problems] == bad


def test_datalog_fact_missing_its_final_dot(tmp_path: Path) -> None:
    f = tmp_path / "facts.dl"
    f.write_text(
        "root_table(1, 100)\nroot_table(2, 200).\n"
        "block_table_entry(100, 0, 256, 1)\nfoo(X) :- root_table(X, _).\n"
    )
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert [str(p) for p in e.value.problems] == [
        f"{f}:1:19: missing '.' after this clause (every fact ends with '.')",
        f"{f}:3:34: missing '.' after this clause (every fact ends with '.')",
    ]


# -- no tracebacks ---------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["facts", "csv", "dl"])
def test_huge_decimals_are_out_of_range_not_a_crash(tmp_path: Path, fmt: str) -> None:
    digits = "9" * 5000
    if fmt == "dl":
        f = tmp_path / "x.dl"
        f.write_text(f"root_table(1, {digits}).\n")
    elif fmt == "csv":
        f = tmp_path / "root_table.csv"
        f.write_text(f"seq_id,block_table_ptr\n1,{digits}\n")
    else:
        f = tmp_path / "root_table.facts"
        f.write_text(f"1\t{digits}\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    message = e.value.problems[0].message
    assert f"number '{'9' * 32}'... (5,000 characters) is out of the signed 64-bit range" in (
        message
    )


@given(
    text=st.one_of(
        st.integers(-(2**70), 2**70).map(str),
        st.integers(0, 2**70).map(lambda v: f"0x{v:x}"),
        st.integers(0, 2**70).map(lambda v: f"-0b{v:b}"),
        st.integers(1, 6000).map(lambda n: "0" * n + "1"),
        st.integers(1, 6000).map(lambda n: "1" * n),
        st.text(max_size=50),
    )
)
def test_parse_number_never_crashes(text: str) -> None:
    from pagedkv_sql.numbers import NumberSyntaxError, parse_number

    try:
        value = parse_number(text)
    except NumberSyntaxError as e:
        assert len(str(e)) < 300
    else:
        assert -(2**63) <= value < 2**63


def test_stats_near_int64_limits_and_defined_figures(tmp_path: Path) -> None:
    top = 2**63 - 1
    with pagedkv_sql.connect(tmp_path / "s.duckdb") as db:
        db.load(DATA)
        s = db.stats().counts
        assert (
            s["logical_blocks"]
            == s["resident_blocks"] + s["swapped_blocks"] + (s["missing_blocks"])
        )
        assert (s["logical_blocks"], s["resident_blocks"], s["swapped_blocks"]) == (6, 4, 1)
        assert s["missing_blocks"] == 1
        # one logical block with three GPU bases shares nothing
        db.load_arrow(
            "block_table_entry",
            pa.table(
                {
                    "block_table_id": [9, 9, 9],
                    "block_index": [0, 0, 0],
                    "physical_block_base": [256, 512, 768],
                    "refcount": [1, 1, 1],
                }
            ),
            diagnostics=False,
        )
        assert db.stats().counts["blocks_saved_by_sharing"] == 0
        db.load_arrow(
            "virtual_token",
            pa.table(
                {
                    "seq_id": [1, 1],
                    "token_pos": [top, -5],
                    "block_index": [top // 16, 0],
                    "offset_in_block": [15, 0],
                }
            ),
            diagnostics=False,
        )
        s = db.stats(256).counts
        assert s["unused_token_slots_in_last_blocks"] == 0  # 2^63 is a multiple of 256


@pytest.mark.parametrize("size", ["0", "-1", "257", "9223372036854775807", "9223372036854775808"])
def test_block_size_bounds(cli: Cli, size: str) -> None:
    loaded(cli)
    for command in (["load", str(DATA)], ["stats"], ["check"]):
        result: Any = cli(*command, "--block-size", size)
        assert result.exit_code == 2, (command, result.stderr)
        assert "Error: --block-size must be a number of tokens in [1, 256]" in result.stderr


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


def test_check_limit_bounds(cli: Cli) -> None:
    loaded(cli)
    result: Any = cli("check", "--limit", "9223372036854775808")
    assert result.exit_code == 0, result.stderr
    assert "diag_unresolved_token" in result.stdout
    result = cli("check", "--limit", "-1")
    assert result.exit_code == 2
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb", read_only=True) as db:
        with pytest.raises(UsageError, match=r"limit must be 0 or more rows .*not -1"):
            db.check(limit=-1)
        assert db.check(limit=2**64).warnings == 2


@pytest.mark.parametrize("which", ["parquet", "arrow"])
def test_duplicated_column_names(tmp_path: Path, which: str) -> None:
    table = pa.Table.from_arrays(
        [pa.array([1]), pa.array([2]), pa.array([3])], names=["seq_id", "block_table_ptr", "seq_id"]
    )
    f = tmp_path / f"root_table.{which}"
    if which == "parquet":
        pq.write_table(table, f)
    else:
        with ipc.new_file(f, table.schema) as w:
            w.write_table(table)
    with pagedkv_sql.connect(":memory:") as db:
        with pytest.raises(InputError) as e:
            db.load(f)
        assert e.value.message == f"{f}: root_table: repeated column(s) seq_id"
        with pytest.raises(InputError, match="repeated column"):
            db.load_arrow("root_table", table)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sequences", "-1"], "need sequences >= 1"),
        (["--mean-length", "0"], "need sequences >= 1, mean length >= 1"),
        (["--sequences", "1000000", "--mean-length", "1000"], "more than 100,000,000 tokens"),
        (["--anomalies", "-2"], "anomalies must be within [0, 1,000,000], not -2"),
        (["--seed", "-1"], "seed must be within [0, 2^63), not -1"),
        (["--block-size", "0"], "1 <= block size <= 256"),
    ],
)
def test_synth_parameter_bounds(cli: Cli, args: list[str], message: str) -> None:
    result: Any = cli("synth", "out", *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert not (cli.cwd / "out").exists()


def test_synth_onto_an_existing_file(cli: Cli) -> None:
    (cli.cwd / "out").write_text("keep me")
    result: Any = cli("synth", "out", "--sequences", "2", "--mean-length", "10")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: out exists and is not a directory\n")
    assert (cli.cwd / "out").read_text() == "keep me"


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


def test_repair_of_a_database_that_is_not_there_creates_none(cli: Cli) -> None:
    # a typo in --db must not leave an empty database named like the intended one
    # (found while checking issue 29's commands; `repair` alone opened to create)
    result: Any = cli("repair", "--db", "typo.duckdb")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: no database at typo.duckdb\nFix: ")
    assert list(cli.cwd.iterdir()) == []


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


def test_a_failing_producer_is_reported(db: pagedkv_sql.Database) -> None:
    schema = pa.schema([("seq_id", pa.int64()), ("block_table_ptr", pa.int64())])

    def batches() -> Any:
        yield pa.record_batch([pa.array([1]), pa.array([2])], schema=schema)
        raise RuntimeError("producer broke")

    reader = pa.RecordBatchReader.from_batches(schema, batches())
    with pytest.raises(InputError) as e:
        db.load_arrow("root_table", reader)
    assert "producer broke" in e.value.message
    assert db.sql("SELECT count(*) AS n FROM root_table").to_arrow_table().to_pylist() == [{"n": 0}]


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


def test_max_errors_must_not_be_negative(cli: Cli) -> None:
    (cli.cwd / "root_table.facts").write_text("1\tx\n2\ty\n")
    result: Any = cli("load", "root_table.facts", "--max-errors", "-1")
    assert result.exit_code == 2
    result = cli("load", "root_table.facts", "--max-errors", "0")
    assert result.stderr.count("invalid number") == 2


@pytest.mark.parametrize("text", ["1.0", "1_5", " 0", "0x", "1e3"])
def test_explain_reads_numbers_as_fact_files_do(cli: Cli, text: str) -> None:
    loaded(cli)
    result: Any = cli("explain", "1", text)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: TOKEN_POS: invalid number {text!r}")


def test_explain_takes_hex_and_negative_ids(cli: Cli) -> None:
    loaded(cli)
    result: Any = cli("explain", "0x1", "0x10")
    assert result.exit_code == 0
    assert result.stdout.startswith("token seq_id 1, token_pos 16\n")
    result = cli("explain", "-3", "0")
    assert result.exit_code == 1
    assert result.stdout.endswith(
        "=> unresolved: no virtual_token row for seq_id -3, token_pos 0\n"
    )


def test_errors_do_not_echo_huge_fields(tmp_path: Path) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("1\t" + "x" * 500_000 + "\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert len(e.value.problems[0].message) < 200
    assert "(500,000 characters)" in str(e.value.problems[0])


def test_many_bad_lines_keep_only_what_is_printed(tmp_path: Path) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("x\ty\n" * 200_000)
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert e.value.total == 200_000
    assert len(e.value.problems) == 1000
    dl = tmp_path / "x.dl"
    dl.write_text("root_table(x, y).\n" * 50_000)
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(dl)
    assert (e.value.total, len(e.value.problems)) == (50_000, 1000)


def test_check_report_repr_is_short(db: pagedkv_sql.Database) -> None:
    db.load(DATA)
    report = db.check(limit=None)
    assert repr(report) == (
        "CheckReport(errors=0, warnings=2, diag_refcount_mismatch=1, diag_unresolved_token=1)"
    )
    assert repr(report.results[0]).startswith(
        "CheckResult('spec_unaligned_base', 'error', count=0)"
    )


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


# Helper "rel" (issue 28, DL2's class): `synth FILE --steps` had no --db to compare, so
# `synth pagedkv.duckdb --steps 5` wrote a step log over the default database, rc 0; an
# output over any other DuckDB database went through as well. No output of ours is a
# database: an existing DuckDB file is refused as an output, whatever --db says.
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
