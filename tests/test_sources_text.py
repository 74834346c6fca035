"""sources/text.py: facts, TSV and CSV files, which reader each gets (DuckDB's bulk reader or
the Python scanner) and what each refuses, named by its line."""

from __future__ import annotations

import logging
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

import pagedkv_sql
from pagedkv_sql import sources
from pagedkv_sql.errors import ConstraintError, InputError

from .helpers import CUT, DATA, M, loaded_roots, pad, state, table_rows, view_rows


@pytest.mark.parametrize("content", [b"1\t100\t\n", b"1\t100\n2\t200\t\n", b"1\t0x64\t\n"])
def test_a_trailing_empty_field_is_refused(tmp_path: Path, content: bytes) -> None:
    """A trailing tab makes a third, empty field: too many for root_table, whichever
    reader (typed for plain decimals, text otherwise) the bulk load takes."""
    f = tmp_path / "root_table.facts"
    f.write_bytes(content)
    with pagedkv_sql.connect(":memory:") as db:
        with pytest.raises(InputError) as info:
            db.load(f)
        assert info.value.problems
        assert table_rows(db.sql("SELECT * FROM root_table").to_arrow_table()) == []


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


def test_quoted_csv_errors_name_the_line_not_a_wrong_column(tmp_path: Path) -> None:
    f = tmp_path / "root_table.csv"
    f.write_text('seq_id,block_table_ptr\n"1","1.5"\n')
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as info:
        db.load(f)
    assert [str(p) for p in info.value.problems] == [
        f"{f}:2: block_table_ptr: invalid number '1.5'; expected a signed 64-bit integer "
        "(decimal, 0x hex or 0b binary)"
    ]


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


def test_errors_do_not_echo_huge_fields(tmp_path: Path) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("1\t" + "x" * 500_000 + "\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert len(e.value.problems[0].message) < 200
    assert "(500,000 characters)" in str(e.value.problems[0])


B = M // 2  # preflight looks for a line end in every aligned block of half a MiB


@pytest.mark.parametrize(
    "data, python_only",
    [
        (b"1\t100\n", False),
        (b"1\t100", False),  # a short last line without its LF
        (b"7" * (B - 1), False),
        (b"7" * B, True),  # a whole block without a line end
        (b"7" * (B - 1) + b"\n" + b"7" * (B - 1) + b"\n", False),
        (b"\n" + b"7" * (B - 1) + b"\n" + b"7" * (B - 1) + b"\n", False),  # LF first in a block
        (b"\r" + b"7" * (B - 1) + b"\r" + b"7" * (B - 1) + b"\r", False),  # CR line ends
        (b"7" * B + b"\n", True),
        (b"5\n" + b"7" * (M - 1) + b"\n", True),  # a line of a MiB covers a whole block
        (pad(CUT - 10) + b"7" * (M - 1) + b"\n", True),
        (pad(CUT) + b"7" * B + b"\n", True),  # the first block of the second chunk
        (pad(CUT + B) + b"7" * (B - 1) + b"\n", False),
        (pad(CUT) + b"1\t\x00\n", True),  # a NUL byte in the second chunk
    ],
)
def test_preflight_sends_a_file_with_a_block_without_line_end_to_python(
    tmp_path: Path, data: bytes, python_only: bool
) -> None:
    f = tmp_path / "t.facts"
    f.write_bytes(data)
    assert sources.preflight(f, "\t", False).python_only is python_only


@pytest.mark.parametrize("length, python_only", [(M - 1, False), (M, True)])
def test_preflight_sends_a_header_of_a_mib_to_python(
    tmp_path: Path, length: int, python_only: bool
) -> None:
    f = tmp_path / "t.tsv"
    f.write_bytes(b"h" * length + b"\n1\t100\n")
    assert sources.preflight(f, "\t", True).python_only is python_only


@pytest.mark.parametrize(
    "data, plain",
    [
        (b"1\t100\n-2\t+3\n", True),
        (b"1\t100\r\n", False),  # a CR: not for the BIGINT reader
        (b"1\t0x10\n", False),
        (pad(CUT) + b"1\t1.5\n", False),  # the first unplain byte in the second chunk
        (b"1,100\n", False),  # the delimiter is a tab
    ],
)
def test_preflight_calls_plain_only_digits_signs_delimiters_and_line_ends(
    tmp_path: Path, data: bytes, plain: bool
) -> None:
    f = tmp_path / "t.facts"
    f.write_bytes(data)
    assert sources.preflight(f, "\t", False) == sources.Preflight(plain, False)


def test_contains_finds_a_byte_in_any_chunk(tmp_path: Path) -> None:
    f = tmp_path / "t.facts"
    f.write_bytes(pad(CUT) + b"1\t2\r\n")
    assert sources.contains(f, b"\r")
    assert not sources.contains(f, b"\0")


@pytest.mark.parametrize(
    "data, reader",
    [
        (b"1\t100\n2\t200\n", "read_csv"),  # plain: DuckDB's reader, straight to BIGINT
        (b"1\t0x64\n2\t200\n", "read_csv"),  # not plain: DuckDB's reader, cast strictly
        (b"1\t100\r\n2\t200\r", "_pagedkv_src_"),  # CR line ends: pyarrow's reader
        (b"1\t100\n2\t2\x0000\n", "_pagedkv_src_"),  # a NUL byte: the Python reader
    ],
)
def test_each_text_file_gets_the_reader_that_can_take_it(
    tmp_path: Path, data: bytes, reader: str
) -> None:
    f = tmp_path / "root_table.facts"
    f.write_bytes(data)
    source = sources.TextSource("root_table", str(f), path=f, format="facts")
    con = duckdb.connect()
    try:
        sql = source.scan_sql(con)
        assert reader in sql.split(" FROM ")[-1]
        if b"\0" in data:
            assert source.fallback
            return
        assert not source.fallback
        assert con.execute(f"{sql} ORDER BY ALL").fetchall() == [(1, 100), (2, 200)]
    finally:
        source.close()
        con.close()


def test_a_crlf_file_refused_by_pyarrow_falls_back_and_names_the_line(tmp_path: Path) -> None:
    """A CRLF file with a bad number: pyarrow's reader refuses it whole, the Python reader
    names the line; a good one loads through pyarrow with every row."""
    f = tmp_path / "root_table.facts"
    f.write_bytes(b"1\t100\r\n2\t2x\r\n")
    with pagedkv_sql.connect(":memory:") as db:
        with pytest.raises(InputError) as e:
            db.load(f)
        assert [str(p) for p in e.value.problems] == [
            f"{f}:2:3: block_table_ptr: invalid number '2x'; expected a signed 64-bit "
            "integer (decimal, 0x hex or 0b binary)"
        ]
        f.write_bytes(b"1\t100\r\n\r\n2\t-0x10\r3\t300")
        db.load(f)
        assert db.con.execute("SELECT * FROM root_table ORDER BY ALL").fetchall() == [
            (1, 100),
            (2, -16),
            (3, 300),
        ]


@pytest.mark.parametrize(
    "name, data",
    [
        ("root_table.tsv", b"block_table_ptr\tseq_id\r\n100\t1\r\n200\t2\r\n300\t3\r"),
        ("root_table.csv", b'seq_id,block_table_ptr\r\n1,"100"\r2,200\r\n"3",300\r\n'),
        ("root_table.facts", b"1\t100\r\n2\t200\r3\t300\n"),
    ],
)
def test_a_file_with_cr_line_ends_loads_every_row_after_its_header(
    tmp_path: Path, name: str, data: bytes
) -> None:
    """pyarrow's reader skips the header line, and only it, in any column order."""
    f = tmp_path / name
    f.write_bytes(data)
    assert loaded_roots(f) == [(1, 100), (2, 200), (3, 300)]


def test_a_malformed_quoted_csv_line_is_named_not_a_crash(tmp_path: Path) -> None:
    f = tmp_path / "root_table.csv"
    f.write_text('seq_id,block_table_ptr\n1,100\n2,"20"0\n')
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert [str(p) for p in e.value.problems] == [f"{f}:3: malformed CSV: ',' expected after '\"'"]


@pytest.mark.parametrize(
    "name, data, rows",
    [
        ("root_table.csv", b'seq_id,block_table_ptr\n"1",100\n2,"2,0"\n', None),
        ("root_table.csv", b'seq_id,block_table_ptr\n"1",100\n2,"200"\n', [(1, 100), (2, 200)]),
        ("root_table.facts", b'"1"\t100\n', None),
        ("root_table.tsv", b'seq_id\tblock_table_ptr\n1\t"100"\n', None),
    ],
)
def test_only_csv_fields_may_be_quoted(
    tmp_path: Path,
    name: str,
    data: bytes,
    rows: list[tuple[int, int]] | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """In CSV a quoted field is its text (a comma inside it included), read by the bulk
    reader, not the slow Python one; in facts and TSV a quote is a character like any
    other, which no number has."""
    f = tmp_path / name
    f.write_bytes(data)
    caplog.set_level(logging.INFO, logger="pagedkv_sql")
    with pagedkv_sql.connect(":memory:") as db:
        if rows is None:
            with pytest.raises(InputError):
                db.load(f)
        else:
            db.load(f)
            assert db.con.execute("SELECT * FROM root_table ORDER BY ALL").fetchall() == rows
            assert "reading it in Python" not in caplog.text


def test_a_csv_header_that_is_not_csv_is_shown_whole(tmp_path: Path) -> None:
    f = tmp_path / "root_table.csv"
    f.write_text('seq_id,"block_table_ptr\n1,100\n')
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert str(e.value).startswith(
        f"{f}:1: header of root_table: missing column(s) seq_id, block_table_ptr; "
        "unknown column(s) 'seq_id,\"block_table_ptr'"
    )


def test_every_line_with_the_wrong_number_of_fields_is_named(tmp_path: Path) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("1\n2\t3\t4\n5\t6\n7\tx\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert [(p.line, p.message.split(",")[0]) for p in e.value.problems] == [
        (1, "1 field(s)"),
        (2, "3 field(s)"),
        (4, "block_table_ptr: invalid number 'x'; expected a signed 64-bit integer (decimal"),
    ]


def test_a_file_sent_to_the_python_reader_loads_every_good_row(tmp_path: Path) -> None:
    """A first line of 600,000 leading zeros covers the first half-MiB block: the file goes
    to the Python reader, which loads it (in Arrow batches) like any other."""
    f = tmp_path / "root_table.facts"
    f.write_bytes(b"2\t" + b"0" * 600_000 + b"200\n1\t100\n3\t300\n")
    assert sources.preflight(f, "\t", False).python_only
    assert loaded_roots(f) == [(1, 100), (2, 200), (3, 300)]


def test_the_python_reader_loads_its_batches_in_the_callers_thread_too(tmp_path: Path) -> None:
    """DuckDB pulls the Python reader's batches in its worker threads, where coverage (and
    so `make mutate`'s choice of tests) cannot see them; with one thread it pulls them in
    the caller's. The same rows either way; a batch of no rows is an empty batch."""
    f = tmp_path / "root_table.facts"
    f.write_bytes(b"2\t" + b"0" * 600_000 + b"200\n1\t100\n3\t300\n")
    with pagedkv_sql.connect(":memory:") as db:
        db.con.execute("SET threads TO 1")
        db.load(f)
        assert view_rows(db, "root_table") == [(1, 100), (2, 200), (3, 300)]
    schema = pa.schema([("seq_id", pa.int64()), ("block_table_ptr", pa.int64())])
    assert sources.text._batch([], schema).num_rows == 0
    assert sources.text._batch([(1, 2)], schema).to_pylist() == [
        {"seq_id": 1, "block_table_ptr": 2}
    ]


def test_a_refused_text_file_keeps_a_thousand_problems_and_counts_all(tmp_path: Path) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("1\tx\n" * 1001)
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert (len(e.value.problems), e.value.total) == (1000, 1001)


def test_a_text_source_diagnoses_the_first_thousand_problems_and_counts_all(
    tmp_path: Path,
) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("1\tx\n" * 1001)
    (source,) = sources.discover([str(f)], None, None, None).sources
    with pagedkv_sql.connect(":memory:") as db:
        total, problems = source.diagnose(db.con)
    source.close()
    assert (total, len(problems)) == (1001, 1000)
    assert problems[-1].line == 1000


def test_a_plain_text_file_goes_to_duckdbs_bulk_reader(tmp_path: Path) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("1\t100\n")
    (source,) = sources.discover([str(f)], None, None, None).sources
    with pagedkv_sql.connect(":memory:") as db:
        assert source.fallback is False
        assert "read_csv(" in source.scan_sql(db.con)
    source.close()


@pytest.mark.parametrize(
    ("name", "data", "loaded"),
    [
        ("root_table.csv", b'seq_id,block_table_ptr\r"1",100\r2,"200"\r', [(1, 100), (2, 200)]),
        ("root_table.facts", b'1\t100\r"2"\t200\r', None),
    ],
)
def test_quotes_in_a_cr_file_are_csvs_alone(
    tmp_path: Path, name: str, data: bytes, loaded: list[tuple[int, int]] | None
) -> None:
    """CR line ends take pyarrow's reader: it unquotes CSV fields, and only those."""
    f = tmp_path / name
    f.write_bytes(data)
    with pagedkv_sql.connect(":memory:") as db:
        if loaded is None:
            with pytest.raises(InputError) as e:
                db.load(f)
            assert [p.line for p in e.value.problems] == [2]
        else:
            db.load(f)
            assert db.sql("SELECT * FROM root_table ORDER BY ALL").fetchall() == loaded


def test_a_violation_in_a_text_file_keeps_it_on_the_bulk_reader(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "block_table_entry.facts"
    f.write_text("1\t0\t257\t1\n")
    with (
        pagedkv_sql.connect(":memory:") as db,
        caplog.at_level(logging.INFO),
        pytest.raises(ConstraintError),
    ):
        db.load(f)
    assert "Python" not in caplog.text
