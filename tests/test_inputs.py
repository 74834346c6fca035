"""Every input format loads the same state; malformed input is refused with the exact
message and leaves the database unchanged."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pagedkv_sql
from pagedkv_sql import InputError, UsageError

from .conftest import DATA, SEED_OUTPUT, SPEC, Cli, snapshot, write_facts

SEED: dict[str, list[tuple[int, ...]]] = {
    "root_table": [(1, 100), (2, 101)],
    "block_table_entry": [
        (100, 0, 0x10000000, 2),
        (100, 1, 0x20000000, 1),
        (101, 0, 0x30000000, 1),
        (101, 2, 0x40000000, 1),
    ],
    "virtual_token": [
        (1, 0, 0, 0),
        (1, 15, 0, 15),
        (1, 16, 1, 0),
        (1, 31, 1, 15),
        (1, 32, 2, 0),
        (2, 0, 0, 0),
        (2, 16, 1, 0),
        (2, 32, 2, 0),
    ],
    "swapped_block": [(100, 2, 0x70000000)],
}


def state(db: pagedkv_sql.Database) -> dict[str, list[tuple[int, ...]]]:
    return {
        r: [
            tuple(x.values())
            for x in db.sql(f"SELECT * FROM {r} ORDER BY ALL").to_arrow_table().to_pylist()
        ]
        for r in SEED
    }


@pytest.mark.parametrize("fmt", ["facts", "csv", "tsv", "parquet", "arrow", "arrows", "dl"])
def test_every_format_loads_the_same_state(fmt: str, tmp_path: Path) -> None:
    directory = write_facts(tmp_path / fmt, SEED, fmt)
    with pagedkv_sql.connect(":memory:") as db:
        db.load(directory)
        assert state(db) == {r: sorted(v) for r, v in SEED.items()}
        assert (
            "".join("\t".join(map(str, r.values())) + "\n" for r in db.resolve_table().to_pylist())
            == SEED_OUTPUT
        )


def test_csv_columns_in_any_order_and_hex_numbers(tmp_path: Path) -> None:
    f = tmp_path / "block_table_entry.csv"
    f.write_text("refcount,physical_block_base,block_index,block_table_id\n2,0x100,0,7\n")
    with pagedkv_sql.connect(":memory:") as db:
        db.load(f)
        assert state(db)["block_table_entry"] == [(7, 0, 256, 2)]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("seq_id\n1\n", "missing column(s) block_table_ptr"),
        ("seq_id,block_table_ptr,extra\n1,2,3\n", "unknown column(s) 'extra'"),
        ("seq_id,seq_id\n1,2\n", "missing column(s) block_table_ptr; repeated column(s) seq_id"),
    ],
)
def test_csv_header_errors_name_the_column(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "root_table.csv"
    f.write_text(content)
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as info:
        db.load(f)
    assert info.value.message == f"{f}:1: header of root_table: {message}"


@pytest.mark.parametrize(
    ("column", "message"),
    [
        (pa.array([1.5], pa.float64()), "column block_table_ptr has type double, not an integer"),
        (pa.array(["1"], pa.string()), "column block_table_ptr has type string, not an integer"),
        (pa.nulls(1), "column block_table_ptr has type null (every value is missing)"),
    ],
)
def test_typed_columns_must_be_integers(tmp_path: Path, column: pa.Array, message: str) -> None:
    f = tmp_path / "root_table.parquet"
    pq.write_table(pa.table({"seq_id": pa.array([1], pa.int8()), "block_table_ptr": column}), f)
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError, match=re.escape(message)):
        db.load(f)


def test_integers_of_any_width_load_when_they_fit(tmp_path: Path) -> None:
    f = tmp_path / "root_table.parquet"
    table = pa.table(
        {
            "seq_id": pa.array([1, 2], pa.uint8()),
            "block_table_ptr": pa.array([3, 2**63 - 1], pa.uint64()),
        }
    )
    pq.write_table(table, f)
    with pagedkv_sql.connect(":memory:") as db:
        db.load(f)
        assert state(db)["root_table"] == [(1, 3), (2, 2**63 - 1)]
        big = pa.table(
            {"seq_id": pa.array([1], pa.int16()), "block_table_ptr": pa.array([2**63], pa.uint64())}
        )
        with pytest.raises(InputError) as info:
            db.load_arrow("root_table", big)
        assert str(info.value.problems[0]) == (
            "<arrow root_table>: column block_table_ptr holds 9223372036854775808, "
            "beyond the signed 64-bit range"
        )
        nullable = pa.table(
            {"seq_id": pa.array([5, None], pa.int64()), "block_table_ptr": pa.array([1, 2])}
        )
        with pytest.raises(InputError) as info:
            db.load_arrow("root_table", nullable)
        assert str(info.value.problems[0]) == "<arrow root_table>: column seq_id holds a null"
        assert state(db)["root_table"] == [(1, 3), (2, 2**63 - 1)]


BAD_LINES = [
    ("1\t1.5\n", "1:3: block_table_ptr: invalid number '1.5'"),
    ("1\t1e3\n", "1:3: block_table_ptr: invalid number '1e3'"),
    ("1\t\n", "1:3: block_table_ptr: empty field"),
    (" 1\t2\n", "1:1: seq_id: invalid number ' 1'"),
    ("1\t2 \n", "1:3: block_table_ptr: invalid number '2 '"),
    (
        "9223372036854775808\t1\n",
        "1:1: seq_id: number 9223372036854775808 is out of the signed 64-bit range",
    ),
    (
        "-9223372036854775809\t1\n",
        "1:1: seq_id: number -9223372036854775809 is out of the signed 64-bit range",
    ),
    ("+-1\t1\n", "1:1: seq_id: invalid number '+-1'"),
    ("1-2\t1\n", "1:1: seq_id: invalid number '1-2'"),
    ("1\t-\n", "1:3: block_table_ptr: invalid number '-'"),
    ("NaN\t1\n", "1:1: seq_id: invalid number 'NaN'"),
    ("1_000\t1\n", "1:1: seq_id: invalid number '1_000'"),
    ("1\t2\t3\n", "1: 3 field(s), expected 2 (seq_id, block_table_ptr) separated by a tab"),
    ("1\n", "1: 1 field(s), expected 2 (seq_id, block_table_ptr) separated by a tab"),
    ("1\t2\n3\t\xff\n", "2:3: not UTF-8 text; save the file as UTF-8"),
]


@pytest.mark.parametrize(("content", "message"), BAD_LINES)
def test_malformed_fact_lines(tmp_path: Path, content: str, message: str) -> None:
    f = tmp_path / "root_table.facts"
    f.write_bytes(content.encode("latin-1"))
    with pagedkv_sql.connect(":memory:") as db:
        db.load(DATA)
        with pytest.raises(InputError) as info:
            db.load(f)
        assert info.value.problems[0].__str__().startswith(f"{f}:{message}")
        assert len(db.resolve_table()) == 7


@pytest.mark.parametrize(
    ("content", "fmt", "plain"),
    [
        (b"1\t-2\n+3\t004\n", "facts", True),
        (b"seq_id\tblock_table_ptr\n1\t2\n", "tsv", True),
        (b"seq_id,block_table_ptr\n1,2\n", "csv", True),
        (b"1,2\n", "facts", False),
        (b"1\t0x2\n", "facts", False),
        (b"1\t2.0\n", "facts", False),
        (b"1\t2\r\n", "facts", False),
        (b'seq_id,block_table_ptr\n"1",2\n', "csv", False),
        (b"1\t2\n" * 2_000_000 + b"1\t2 \n", "facts", False),  # past the first chunk
    ],
)
def test_only_plain_files_take_the_typed_reader(
    tmp_path: Path, content: bytes, fmt: str, plain: bool
) -> None:
    """DuckDB's typed reader is lenient (`1.5` -> 2): it is used only for files where no
    lenient spelling can occur (BAD_LINES checks the errors of both readers)."""
    from pagedkv_sql.sources import TEXT_FORMATS, only_plain_decimals

    f = tmp_path / f"root_table.{fmt}"
    f.write_bytes(content)
    delimiter, header, _ = TEXT_FORMATS[fmt]
    assert only_plain_decimals(f, delimiter, header) is plain


@pytest.mark.parametrize(
    "content",
    [
        b"1\t100\r\n2\t101\r\n",
        b"\xef\xbb\xbf1\t100\n2\t101",
        b"1\t100\n\n2\t101\n\n",
        b"1\t100\r2\t101\r",
        b"\n1\t100\r\n2\t101\r\n",  # mixed: DuckDB's reader refuses, the fallback reads it
    ],
)
def test_line_endings_bom_and_blank_lines(tmp_path: Path, content: bytes) -> None:
    f = tmp_path / "root_table.facts"
    f.write_bytes(content)
    with pagedkv_sql.connect(":memory:") as db:
        db.load(f)
        assert state(db)["root_table"] == [(1, 100), (2, 101)]


def test_number_syntax(tmp_path: Path) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("0x10\t-0x10\n0b101\t+7\n007\t-9223372036854775808\n")
    with pagedkv_sql.connect(":memory:") as db:
        db.load(f)
        assert state(db)["root_table"] == [(5, 7), (7, -(2**63)), (16, -16)]


def test_directory_rules(tmp_path: Path, facts_dir: Callable[..., Path]) -> None:
    d = facts_dir({"root_table": [(1, 2)]})
    (d / "README.md").write_text("ignored")
    with pagedkv_sql.connect(":memory:") as db:
        db.load(DATA)
        report = db.load(d)
        assert [(r.relation, r.mode, r.rows_total) for r in report.relations] == [
            ("root_table", "replaced", 1),
            ("block_table_entry", "kept", 4),
            ("virtual_token", "kept", 8),
            ("swapped_block", "kept", 1),
        ]
        report = db.load(d, empty_missing=True)
        assert [(r.relation, r.mode, r.rows_total) for r in report.relations] == [
            ("root_table", "replaced", 1),
            ("block_table_entry", "emptied", 0),
            ("virtual_token", "emptied", 0),
            ("swapped_block", "emptied", 0),
        ]
        (d / "root_tables.facts").write_text("1\t2\n")
        with pytest.raises(
            InputError,
            match=r"'root_tables' is not a relation name \(did you mean 'root_table'\?\)",
        ):
            db.load(d)
        (d / "root_tables.facts").unlink()
        (d / "root_table.csv").write_text("seq_id,block_table_ptr\n1,2\n")
        with pytest.raises(InputError, match="two sources for root_table in one load"):
            db.load(d)


def test_datalog_facts_for_the_output_relation_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "x.dl"
    f.write_text("// comment\nroot_table(1, 2).\nresolved_kv_address(1, 2, 3).\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as info:
        db.load(f)
    assert [str(p) for p in info.value.problems] == [
        f"{f}:3:1: 'resolved_kv_address' is the spec's output relation; it is computed, not loaded"
    ]


@pytest.mark.skipif(not SPEC.exists(), reason="shared/spec is not beside the checkout")
def test_spec_file_loads_like_data_dir() -> None:
    with pagedkv_sql.connect(":memory:") as a, pagedkv_sql.connect(":memory:") as b:
        a.load(SPEC)
        b.load(DATA)
        assert state(a) == state(b)


def test_stdin_text_and_arrow(cli: Cli) -> None:
    result: Any = cli("load", "-", "--relation", "root_table", input="1\t100\n2\t101\n")
    assert result.exit_code == 0, result.stderr
    sink = pa.BufferOutputStream()
    table = pa.table({"seq_id": [1], "block_table_ptr": [7]})
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    result = cli(
        "load",
        "-",
        "-r",
        "root_table",
        "-f",
        "arrow",
        "--append",
        input=sink.getvalue().to_pybytes(),
    )
    assert result.exit_code == 0, result.stderr
    assert snapshot(cli.cwd / "pagedkv.duckdb")["root_table"] == [(1, 7), (1, 100), (2, 101)]


def test_paths_with_spaces_quotes_and_unicode(tmp_path: Path) -> None:
    d = write_facts(tmp_path / "it's a dïr", SEED)
    with pagedkv_sql.connect(tmp_path / "db ü's.duckdb") as db:
        db.load(d)
        assert len(db.resolve_table()) == 7


def test_relation_name_never_reaches_sql_unchecked(tmp_path: Path) -> None:
    f = tmp_path / "x.facts"
    f.write_text("1\t2\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(UsageError, match="unknown relation"):
        db.load(f, relation="root_table; DROP TABLE root_table")


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


def test_quoted_csv_errors_name_the_line_not_a_wrong_column(tmp_path: Path) -> None:
    f = tmp_path / "root_table.csv"
    f.write_text('seq_id,block_table_ptr\n"1","1.5"\n')
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as info:
        db.load(f)
    assert [str(p) for p in info.value.problems] == [
        f"{f}:2: block_table_ptr: invalid number '1.5'; expected a signed 64-bit integer "
        "(decimal, 0x hex or 0b binary)"
    ]
