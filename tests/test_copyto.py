"""Files written by DuckDB's COPY (copyto.py) against output.py's writers, byte for byte:
every format DuckDB writes, plain, gzip and zstd, for every command that writes rows to a
file with -o (`resolve`, `sql`). Compressed files are compared decompressed (DuckDB's gzip
and zstd streams are its own), Parquet by its schema and rows."""

from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pagedkv_sql
from pagedkv_sql import copyto, output
from pagedkv_sql.compression import strip

from .helpers import Cli

FORMATS = ["facts", "tsv", "csv", "json", "jsonl", "ndjson", "parquet"]
SUFFIXES = ["", ".gz", ".zst"]
QUERY = (
    "SELECT seq_id, count(*) AS tokens, max(token_pos) - 3 AS last FROM virtual_token "
    "GROUP BY seq_id ORDER BY tokens DESC, seq_id"
)


def plain(path: Path) -> bytes:
    data = path.read_bytes()
    kind = strip(path)[1]
    if kind == "gzip":
        return gzip.decompress(data)
    if kind == "zstd":
        with pa.input_stream(pa.py_buffer(data), compression="zstd") as stream:
            return bytes(stream.read())
    return data


def python_bytes(reader: pa.RecordBatchReader, fmt: str) -> bytes:
    buffer = io.BytesIO()
    output.write_batches(reader, fmt, buffer)
    return buffer.getvalue()


def same_content(path: Path, expected: bytes, fmt: str) -> None:
    if fmt == "parquet":
        ours = pq.read_table(io.BytesIO(plain(path)))
        theirs = pq.read_table(io.BytesIO(expected))
        assert ours.schema == theirs.schema
        assert ours.equals(theirs)
    else:
        assert plain(path) == expected


@pytest.fixture
def synth_db(cli: Cli) -> Cli:
    args = ["synth", "data", "-s", "40", "--mean-length", "300", "--wide-addresses"]
    assert cli(*args).exit_code == 0
    assert cli("load", "data", "-q").exit_code == 0
    return cli


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_resolve_to_a_file_is_what_the_python_writer_writes(
    synth_db: Cli, fmt: str, suffix: str
) -> None:
    cli = synth_db
    target = cli.cwd / f"out.{fmt}{suffix}"
    assert cli("resolve", "-f", fmt, "-o", str(target)).exit_code == 0
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb", read_only=True) as db:
        expected = python_bytes(db.resolve(), fmt)
        if fmt == "parquet":  # pyarrow's schema (DuckDB's NOT NULL differs by its version)
            assert copyto.options(str(target), fmt) is None
            assert plain(target) == expected
            return
        # DuckDB writes it: the bag is proven a set
        again = cli.cwd / f"again.{fmt}{suffix}"
        assert copyto.resolve(db, str(again), fmt) is not None
    same_content(again, expected, fmt)
    same_content(target, expected, fmt)
    assert [p.name for p in cli.cwd.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_sql_to_a_file_is_what_the_python_writer_writes(
    synth_db: Cli, fmt: str, suffix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = synth_db
    copies: list[str] = []
    real = copyto.copy

    def counted(*args: Any) -> int:
        copies.append(args[3])
        return real(*args)

    monkeypatch.setattr(copyto, "copy", counted)
    target = cli.cwd / f"q.{fmt}{suffix}"
    assert cli("sql", QUERY, "-f", fmt, "-o", str(target)).exit_code == 0
    # Parquet: pyarrow's (DuckDB would mark the group key NOT NULL, the Arrow export not)
    assert copies == ([] if fmt == "parquet" else [fmt])
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb", read_only=True) as db:
        relation = db.sql(QUERY)
        assert copyto.writes(relation.columns, relation.types)
        expected = python_bytes(relation.to_arrow_reader(65536), fmt)
    same_content(target, expected, fmt)


def test_a_query_with_text_columns_is_written_by_python(synth_db: Cli) -> None:
    cli = synth_db
    query = "SELECT 'a,\"b' AS s, 1 AS n UNION ALL SELECT NULL, 2 ORDER BY n"
    assert cli("sql", query, "-o", "t.csv").exit_code == 0
    assert (cli.cwd / "t.csv").read_text() == 's,n\n"a,""b",1\n,2\n'
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb", read_only=True) as db:
        relation = db.sql(query)
        assert not copyto.writes(relation.columns, relation.types)
        named = db.sql('SELECT 1 AS "a b"')
        assert not copyto.writes(named.columns, named.types)


def test_integer_nulls_are_written_as_the_python_writer_writes_them(synth_db: Cli) -> None:
    cli = synth_db
    query = "SELECT * FROM (VALUES (1, NULL), (NULL, -2), (3, 4)) AS t(a, b) ORDER BY a NULLS LAST"
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb", read_only=True) as db:
        relation = db.sql(query)
        assert copyto.writes(relation.columns, relation.types)
        for fmt in ("csv", "tsv", "facts", "json", "jsonl"):
            assert cli("sql", query, "-f", fmt, "-o", f"n.{fmt}").exit_code == 0
            expected = python_bytes(db.sql(query).to_arrow_reader(65536), fmt)
            assert (cli.cwd / f"n.{fmt}").read_bytes() == expected, fmt


@pytest.mark.parametrize("fmt", ["json", "csv", "facts", "jsonl"])
@pytest.mark.parametrize("suffix", SUFFIXES)
def test_no_rows_are_written_as_the_python_writer_writes_them(
    cli: Cli, fmt: str, suffix: str
) -> None:
    cli("synth", "data", "-s", "2")
    (cli.cwd / "data" / "virtual_token.facts").write_text("")
    assert cli("load", "data", "-q").exit_code == 0
    target = cli.cwd / f"e.{fmt}{suffix}"
    assert cli("resolve", "-f", fmt, "-o", str(target)).exit_code == 0
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb", read_only=True) as db:
        assert copyto.resolve(db, str(cli.cwd / f"x.{fmt}{suffix}"), fmt) == 0
        assert plain(target) == python_bytes(db.resolve(), fmt)


def test_a_bag_not_proven_a_set_is_written_by_the_reader_that_drops_duplicates(
    cli: Cli,
) -> None:
    cli("synth", "data", "-s", "3", "--mean-length", "40")
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb") as db:
        db.load(cli.cwd / "data", diagnostics=False)
        # a token row twice (as a shell user may insert it): it resolves twice
        db.con.execute("INSERT INTO virtual_token SELECT * FROM virtual_token LIMIT 1")
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb", read_only=True) as db:
        assert copyto.resolve(db, str(cli.cwd / "x.tsv"), "tsv") is None
        expected = python_bytes(db.resolve(), "tsv")
    assert not (cli.cwd / "x.tsv").exists()
    assert cli("resolve", "-o", "r.tsv").exit_code == 0
    assert (cli.cwd / "r.tsv").read_bytes() == expected
    lines = expected.splitlines()
    assert len(lines) == len(set(lines)) > 40
