"""compression.py: gzip and zstd told by content when read, by name when written, with DuckDB
(which reads both natively) and gzip(1) as the oracles."""

from __future__ import annotations

import gzip
import io
import os
import subprocess
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from pagedkv_sql import compression
from pagedkv_sql.errors import InputError

ROWS = b"".join(b"%d\t%d\n" % (i, i * 16) for i in range(5000))


def zstd(data: bytes) -> bytes:
    return bytes(pa.compress(data, codec="zstd", asbytes=True))


PACKED = {"gzip": gzip.compress, "zstd": zstd}


@pytest.mark.parametrize("kind", ["gzip", "zstd"])
def test_a_file_is_told_by_its_first_bytes_whatever_its_name(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "virtual_token.facts"  # no .gz: the content says it
    path.write_bytes(PACKED[kind](ROWS))
    assert compression.compressed_file(path) == kind
    with compression.open_input(path) as f:
        assert f.peek(4)[:4] == ROWS[:4]  # a reader that peeks sees the plain bytes
        assert f.read() == ROWS
    plain = tmp_path / "plain.facts"
    plain.write_bytes(ROWS)
    assert compression.compressed_file(plain) is None
    with compression.open_input(plain) as f:
        assert f.read() == ROWS


def test_concatenated_members_and_frames_are_read_whole() -> None:
    """`cat a.gz b.gz` and `zstd` of several frames are one stream of both, as gzip(1) and
    zstd(1) read them."""
    for pack in PACKED.values():
        stream = io.BytesIO(pack(b"1\t2\n") + pack(b"3\t4\n"))
        assert compression.reader(stream, "<stdin>").read() == b"1\t2\n3\t4\n"


@pytest.mark.parametrize("kind", ["gzip", "zstd"])
@pytest.mark.parametrize("cut", ["truncated", "corrupt"])
def test_damaged_data_is_an_input_error_naming_the_input(kind: str, cut: str) -> None:
    data = PACKED[kind](ROWS)
    damaged = data[: len(data) // 2] if cut == "truncated" else data[:12] + b"\xff" * 64
    with pytest.raises(InputError, match=rf"^<stdin>: its {kind} data is corrupt or truncated"):
        compression.reader(io.BytesIO(damaged), "<stdin>").read()


def test_a_plain_stream_is_read_as_it_is_with_peek() -> None:
    class Unpeekable(io.RawIOBase):  # a pipe's raw reader
        def __init__(self) -> None:
            self.data = io.BytesIO(b"ARROW1 rest")

        def readable(self) -> bool:
            return True

        def readinto(self, b: bytearray) -> int:  # type: ignore[override]
            return self.data.readinto(b)

    stream = compression.reader(Unpeekable(), "<stdin>")
    assert stream.peek(6)[:6] == b"ARROW1"  # type: ignore[attr-defined]
    assert stream.read() == b"ARROW1 rest"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("r.csv.gz", ("r.csv", "gzip")),
        ("r.CSV.ZST", ("r.CSV", "zstd")),
        ("r.csv", ("r.csv", None)),
        ("dir.gz/r", ("dir.gz/r", None)),
        (".gz", (".gz", None)),  # a hidden file named .gz: no suffix at all
    ],
)
def test_a_name_loses_only_its_compression_suffix(name: str, expected: tuple[str, str]) -> None:
    assert compression.strip(name) == expected


@pytest.mark.parametrize(("suffix", "kind"), [(".gz", "gzip"), (".zst", "zstd")])
def test_an_output_is_compressed_as_its_name_says_and_duckdb_reads_it(
    tmp_path: Path, suffix: str, kind: str
) -> None:
    path = tmp_path / f"r.csv{suffix}"
    with compression.output(path) as f:
        f.write(b"seq_id,token_pos\n")
        f.write(memoryview(b"1,0\n2,16\n"))
    assert compression.sniff(path.read_bytes()) == kind
    rows = duckdb.sql(f"SELECT * FROM read_csv('{path}') ORDER BY ALL").fetchall()
    assert rows == [(1, 0), (2, 16)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no draft left


def test_gzip_output_is_what_gzip_reads_and_the_same_bytes_every_time(tmp_path: Path) -> None:
    """No name and no time in the header: the same rows give the same file."""
    written = []
    for name in ("a.tsv.gz", "b.tsv.gz"):
        with compression.output(tmp_path / name) as f:
            f.write(ROWS)
        written.append((tmp_path / name).read_bytes())
    assert written[0] == written[1]
    shown = subprocess.run(
        ["gzip", "-dc", str(tmp_path / "a.tsv.gz")], capture_output=True, check=True
    )
    assert shown.stdout == ROWS


@pytest.mark.parametrize("kind", ["gzip", "zstd"])
def test_a_failed_output_leaves_no_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"r.csv{'.gz' if kind == 'gzip' else '.zst'}"
    with pytest.raises(RuntimeError), compression.output(path) as f:
        f.write(ROWS)
        raise RuntimeError("the query failed half way")
    assert os.listdir(tmp_path) == []


def test_compressing_leaves_the_file_open_for_the_caller() -> None:
    for kind in ("gzip", "zstd"):
        out = io.BytesIO()
        with compression.compressing(out, kind) as z:
            z.write(b"x")
        assert not out.closed
        assert compression.reader(io.BytesIO(out.getvalue()), "x").read() == b"x"
