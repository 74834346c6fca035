"""sources.py: discovery, which reader a source gets, and what each reader refuses."""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql import paths, sources
from pagedkv_sql.errors import ConstraintError, InputError, PagedKVError

from .conftest import CUT, M, _insert, _pad, _streamed, _view, arrow_table

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
        (_pad(CUT - 10) + b"7" * (M - 1) + b"\n", True),
        (_pad(CUT) + b"7" * B + b"\n", True),  # the first block of the second chunk
        (_pad(CUT + B) + b"7" * (B - 1) + b"\n", False),
        (_pad(CUT) + b"1\t\x00\n", True),  # a NUL byte in the second chunk
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
        (_pad(CUT) + b"1\t1.5\n", False),  # the first unplain byte in the second chunk
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
    f.write_bytes(_pad(CUT) + b"1\t2\r\n")
    assert sources.contains(f, b"\r")
    assert not sources.contains(f, b"\0")


@pytest.mark.parametrize(
    "names, listed",
    [
        (["a.txt", "b.txt", "c.txt", "d.txt", "e.txt"], "a.txt, b.txt, c.txt, d.txt, e.txt)"),
        (
            ["a.txt", "b.txt", "c.txt", "d.txt", "e.txt", "f.txt"],
            "a.txt, b.txt, c.txt, d.txt, e.txt, ...)",
        ),
    ],
)
def test_a_directory_without_facts_lists_five_of_its_files(
    tmp_path: Path, names: list[str], listed: str
) -> None:
    for name in names:
        (tmp_path / name).write_text("1\t100\n")
    with pytest.raises(InputError) as e:
        sources.discover([str(tmp_path)])
    assert f"no facts in this directory (found only: {listed}; nothing was loaded" in str(e.value)


def _loaded_roots(path: Path) -> list[tuple[Any, ...]]:
    """The rows of root_table after loading ``path`` into a fresh database, sorted."""
    with pagedkv_sql.connect(":memory:") as db:
        db.load(path)
        return db.con.execute("SELECT * FROM root_table ORDER BY ALL").fetchall()


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
    "args, options, error, message",
    [
        ([], {}, "UsageError", "no SOURCE given; name a directory, fact files, or - for stdin"),
        (
            ["DIR/sub"],
            {"relation": "root_table"},
            "UsageError",
            "--relation names the relation of one file, not a directory",
        ),
        (
            ["DIR/root_table.xyz"],
            {},
            "UsageError",
            "DIR/root_table.xyz: unknown extension '.xyz'; use --format "
            "(facts, tsv, csv, parquet, arrow, arrows, dl)",
        ),
        (
            ["DIR/roottable.facts"],
            {},
            "InputError",
            "DIR/roottable.facts: 'roottable' is not a relation name (did you mean 'root_table'?)",
        ),
        (
            ["DIR/noext"],
            {"fmt": "json"},
            "UsageError",
            "unknown format 'json'; formats are: facts, tsv, csv, parquet, arrow, arrows, dl",
        ),
        (
            ["-"],
            {"fmt": "parquet", "relation": "root_table", "stdin": b"x"},
            "UsageError",
            "--format parquet cannot be read from stdin; use facts, tsv, csv or arrow",
        ),
        (
            ["-"],
            {"fmt": "arrow", "relation": "root_table", "stdin": b"x"},
            "InputError",
            "<stdin>: not an Arrow IPC stream (",
        ),
        (
            ["DIR/bad/root_table.parquet"],
            {},
            "InputError",
            "DIR/bad/root_table.parquet: not a readable Parquet file (",
        ),
        (
            ["DIR/bad/root_table.arrow"],
            {},
            "InputError",
            "DIR/bad/root_table.arrow: not a readable Arrow IPC file or stream (",
        ),
        (
            ["DIR/sub", "DIR/sub/root_table.facts"],
            {},
            "InputError",
            "two sources for root_table in one load: DIR/sub/root_table.facts and "
            "DIR/sub/root_table.facts",
        ),
    ],
)
def test_discovery_refuses_with_a_message_that_says_what(
    tmp_path: Path, args: list[str], options: dict[str, Any], error: str, message: str
) -> None:
    import io

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "root_table.facts").write_text("1\t100\n")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "root_table.parquet").write_bytes(b"not parquet")
    (tmp_path / "bad" / "root_table.arrow").write_bytes(b"not arrow")
    for name in ("root_table.xyz", "roottable.facts", "noext"):
        (tmp_path / name).write_text("1\t100\n")
    if "stdin" in options:
        options = {**options, "stdin": io.BytesIO(options["stdin"])}
    with pytest.raises(PagedKVError) as e:
        sources.discover([a.replace("DIR", str(tmp_path)) for a in args], **options)
    assert type(e.value).__name__ == error
    assert str(e.value).startswith(message.replace("DIR", str(tmp_path)))


@pytest.mark.parametrize("kind", ["file", "stream"])
@pytest.mark.parametrize("ext", [".arrow", ".feather", ".arrows"])
def test_arrow_files_and_streams_load_under_every_arrow_extension(
    tmp_path: Path, kind: str, ext: str
) -> None:
    table = arrow_table("root_table", [(1, 100), (2, 200)])
    f = tmp_path / f"root_table{ext}"
    with (pa.ipc.new_file if kind == "file" else pa.ipc.new_stream)(f, table.schema) as w:
        w.write_table(table)
    assert _loaded_roots(f) == [(1, 100), (2, 200)]


@pytest.mark.parametrize("fmt", ["arrow-table", "parquet"])
def test_a_violation_in_arrow_data_is_located_by_its_row_number(tmp_path: Path, fmt: str) -> None:
    table = arrow_table("block_table_entry", [(1, 0, 256, 1), (1, 1, 300, 1), (1, 2, 512, -1)])
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(ConstraintError) as e:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            label = str(tmp_path / "block_table_entry.parquet")
            pq.write_table(table, label)
            db.load(label)
        else:
            label = "<arrow block_table_entry>"
            db.load_arrow("block_table_entry", table)
    assert [(v.check, v.locations) for v in e.value.violations] == [
        ("spec_unaligned_base", (f"{label} row 2",)),
        ("spec_negative_refcount", (f"{label} row 3",)),
    ]


def test_a_sequence_with_two_block_tables_is_a_conflicting_root(db: pagedkv_sql.Database) -> None:
    _insert(db, "root_table", [(1, 10), (1, 20), (2, 30), (3, 3)])
    assert _view(db, "diag_conflicting_root") == [(1, [10, 20], "2 block tables for one sequence")]


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
    assert _loaded_roots(f) == [(1, 100), (2, 200), (3, 300)]


def test_rows_left_after_the_join_with_a_bigger_batch_come_out_sorted(
    db: pagedkv_sql.Database,
) -> None:
    """A small batch below the watermark joined with a big earlier one: DuckDB may build
    its hash table on the small side and give the rows left in any order; they are
    sorted again."""
    db.load_arrow("root_table", arrow_table("root_table", [(1, 10)]))
    db.load_arrow(
        "block_table_entry",
        arrow_table("block_table_entry", [(10, b, 256 * (b + 1), 1) for b in range(400)]),
    )
    big = [(1, p, p // 16, p % 16) for p in range(0, 6400, 2)]
    small = [(1, p, p // 16, p % 16) for p in range(200)]
    out = _streamed(db, [big, small])
    assert out[1] == [(1, p, 256 * (p // 16 + 1) + p % 16) for p in range(1, 200, 2)]


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


def test_duckdb_s_own_error_is_named_by_its_first_line() -> None:
    ours = duckdb.Error("Invalid Input Error: pagedkv: column x holds a null\nLINE 1: ...")
    theirs = duckdb.Error("Conversion Error: bad\nLINE 1: SELECT ...")
    assert sources.problem_from_duckdb("f", ours).message == "column x holds a null"
    assert sources.problem_from_duckdb("f", theirs).message == "Conversion Error: bad"
    assert sources.problem_from_duckdb("f", duckdb.Error("one line")).message == "one line"


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
    assert _loaded_roots(f) == [(1, 100), (2, 200), (3, 300)]


def test_the_python_reader_loads_its_batches_in_the_callers_thread_too(tmp_path: Path) -> None:
    """DuckDB pulls the Python reader's batches in its worker threads, where coverage (and
    so `make mutate`'s choice of tests) cannot see them; with one thread it pulls them in
    the caller's. The same rows either way; a batch of no rows is an empty batch."""
    f = tmp_path / "root_table.facts"
    f.write_bytes(b"2\t" + b"0" * 600_000 + b"200\n1\t100\n3\t300\n")
    with pagedkv_sql.connect(":memory:") as db:
        db.con.execute("SET threads TO 1")
        db.load(f)
        assert _view(db, "root_table") == [(1, 100), (2, 200), (3, 300)]
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


def test_an_object_is_taken_for_a_dataset_only_with_schema_batches_and_scanner() -> None:
    class ScannerOnly:
        def scanner(self) -> None: ...

    with pytest.raises(pagedkv_sql.UsageError, match=r"^cannot load a ScannerOnly as root_table"):
        sources.arrow_source("root_table", ScannerOnly(), "<x>")


def test_a_spool_has_no_name_in_the_file_system() -> None:
    import io

    spool = paths.Spool(io.BytesIO(b"1\t2\n"))
    try:
        assert str(spool.path).startswith("/proc/self/fd/")
        assert spool.path.read_bytes() == b"1\t2\n"
    finally:
        spool.close()


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


def test_a_violation_in_an_arrow_table_is_located_by_its_row() -> None:
    bte = arrow_table("block_table_entry", [(1, 0, 256, 1), (1, 1, 257, 1)])
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(ConstraintError) as e:
        db.load_arrow("block_table_entry", bte, label="<bte>")
    assert [v.locations for v in e.value.violations] == [("<bte> row 2",)]


def test_a_regular_file_is_read_in_place_and_a_fifo_through_a_spool(tmp_path: Path) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("1\t100\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (regular,) = sources.discover([str(f)], None, None, None).sources
    assert regular.spools == [] and getattr(regular, "path", None) == f
    regular.close()
    writer = subprocess.Popen(["sh", "-c", f"printf '2\\t200\\n' > {fifo}"])
    (piped,) = sources.discover([str(fifo)], "facts", "root_table", None).sources
    writer.wait()
    assert len(piped.spools) == 1 and piped.spools[0].path.read_bytes() == b"2\t200\n"
    piped.close()


def test_an_empty_directory_lists_the_extensions_of_the_relation_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(InputError) as e:
        sources.discover([str(tmp_path)], None, None, None)
    assert e.value.hint == (
        "name each file after its relation (root_table.facts, block_table_entry.csv, ...; "
        "extensions .facts .tsv .csv .parquet .arrow .feather .arrows) or give .dl files"
    )


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
