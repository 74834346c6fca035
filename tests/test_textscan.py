"""textscan.py: the chunked line reader, across its 4 MiB cuts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv_sql
from pagedkv_sql import InputError, textscan
from pagedkv_sql.errors import Problem
from pagedkv_sql.textscan import LongLine

from .helpers import CUT, M, pad

BOM = b"\xef\xbb\xbf"


def _reference_lines(data: bytes) -> list[tuple[int, Any]]:
    """The lines of the whole file split at once: what the chunked reader must give."""
    if data.startswith(BOM):
        data = data[3:]
    parts = re.split(rb"\r\n|\r|\n", data)
    if parts[-1] == b"":
        parts.pop()
    return [(i, p if len(p) <= M else ("long", len(p))) for i, p in enumerate(parts, start=1)]


def _read_lines(path: Path) -> list[tuple[int, Any]]:
    return [
        (n, ("long", raw.length) if isinstance(raw, LongLine) else raw)
        for n, raw in textscan._lines(path)
    ]


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(pad(CUT - 400) + b"7" * 399 + b"\r\n8\n", id="CRLF split by the cut"),
        pytest.param(pad(CUT - 400) + b"7" * 399 + b"\r9\n", id="CR the last byte of a chunk"),
        pytest.param(pad(CUT - 400) + b"7" * 399 + b"\n" + BOM + b"8\n", id="BOM bytes at a cut"),
        pytest.param(pad(CUT - M // 2) + b"7" * 2 * M + b"\n8\n", id="long line over a cut"),
        pytest.param(pad(CUT - M) + b"7" * M + b"\n8\n", id="MAX_LINE ending at a cut"),
        pytest.param(pad(CUT - M) + b"7" * (M + 1) + b"\n8\n", id="MAX_LINE+1 over a cut"),
        pytest.param(pad(CUT - M - 1) + b"7" * (M + 1) + b"\n8\n", id="MAX_LINE+1 to a cut"),
        pytest.param(pad(CUT - 3 * M // 2) + b"7" * (3 * M // 2) + b"\n8\n", id="LF after a cut"),
        pytest.param(pad(CUT - 3 * M // 2) + b"7" * 2 * M + b"\r\n8\r\n", id="long, CRLF"),
        pytest.param(pad(CUT - 3 * M // 2) + b"7" * (3 * M // 2 - 1) + b"\r\n8\n", id="long CR|LF"),
        pytest.param(pad(CUT - 3 * M // 2) + b"7" * (3 * M // 2 - 1) + b"\r8\n", id="long CR|8"),
        pytest.param(
            pad(CUT - 3 * M // 2) + b"7" * (3 * M // 2 + CUT - 1) + b"\r\n8\n",
            id="long over a whole chunk, CR|LF",
        ),
        pytest.param(
            pad(CUT - 3 * M // 2) + b"7" * (3 * M // 2 + CUT - 1) + b"\r8\n",
            id="long over a whole chunk, CR|8",
        ),
        pytest.param(pad(CUT - 3 * M // 2) + b"7" * (2 * M), id="long line to the end"),
        pytest.param(
            pad(CUT - 3 * M // 2) + b"7" * (3 * M // 2 - 1) + b"\r\n" + pad(CUT - 2) + b"9\n8\n",
            id="long CR|LF, then LF first in the next chunk",
        ),
        pytest.param(
            pad(CUT - 3 * M // 2) + b"7" * (3 * M // 2 + CUT - 1) + b"\n\n8\n",
            id="long over a whole chunk, LF|LF",
        ),
        pytest.param(BOM + pad(1000) + b"8\r", id="BOM, CR at the end"),
        pytest.param(b"\r", id="a lone CR"),
        pytest.param(b"\n\n8", id="blank lines first"),
        pytest.param(b"7" * (M + 1), id="one long line"),
    ],
)
def test_the_chunked_reader_gives_the_lines_of_the_whole_file(tmp_path: Path, data: bytes) -> None:
    """Line numbers, contents and over-long lengths are those of splitting the whole file
    at once, wherever the 4 MiB reads cut it (inside a CRLF, a long line, a BOM)."""
    f = tmp_path / "lines.facts"
    f.write_bytes(data)
    assert _read_lines(f) == _reference_lines(data)


def test_an_over_long_line_is_named_with_its_length_and_the_next_line_still_read(
    tmp_path: Path,
) -> None:
    f = tmp_path / "root_table.facts"
    f.write_bytes(b"1\t100\n" + b"7" * (3 * M // 2) + b"\r\n2\tx\n")
    found = list(textscan.scan(f, "f", ("seq_id", "block_table_ptr"), "\t", False, False))
    assert found[0] == (1, (1, 100))
    assert found[1] == (2, Problem("f", 2, None, textscan.long_line(3 * M // 2)))
    assert found[2][0] == 3
    assert textscan.long_line(3 * M // 2) == (
        "a line of 1,572,864 bytes, longer than any fact line can be "
        "(at most 1,048,576 bytes are read a line)"
    )


def test_the_lines_after_a_non_utf8_or_malformed_csv_line_are_still_read(tmp_path: Path) -> None:
    columns = ("seq_id", "block_table_ptr")
    facts = tmp_path / "root_table.facts"
    facts.write_bytes(b"1\t100\n\xff\t2\n3\t300\n")
    found = list(textscan.scan(facts, "f", columns, "\t", False, False))
    assert [n for n, _ in found] == [1, 2, 3]
    assert found[1][1] == Problem("f", 2, 1, "not UTF-8 text; save the file as UTF-8")
    assert found[2] == (3, (3, 300))
    csv_file = tmp_path / "root_table.csv"
    csv_file.write_text('seq_id,block_table_ptr\n1,"1"0\n2,200\n')
    found = list(textscan.scan(csv_file, "c", columns, ",", True, True))
    assert [n for n, _ in found] == [2, 3]
    assert isinstance(found[0][1], Problem) and found[0][1].message.startswith("malformed CSV")
    assert found[1] == (3, (2, 200))


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
