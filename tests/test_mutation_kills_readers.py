"""Tests written to kill the survivors of `make mutate` in the readers and generators
(sources, textscan, numbers, datalog, synth, stream, sqlfiles, inspect; docs/mutation.md):
each pins a boundary or a branch the rest of the suite passed through without looking."""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql import datalog, paths, sources, spill, sqlfiles, stream, textscan
from pagedkv_sql.errors import ConstraintError, DatabaseError, InputError, PagedKVError, Problem
from pagedkv_sql.synth import SynthConfig, synthesize
from pagedkv_sql.textscan import MAX_LINE, LongLine

from .conftest import DATA, arrow_table, write_facts

# -- synth.py ------------------------------------------------------------------------------


def _synth_shape(tables: dict[str, pa.Table]) -> dict[str, Any]:
    """What a synthesized cache says about itself, read back from its tables."""
    tokens = tables["virtual_token"].to_pydict()
    lengths: dict[int, int] = defaultdict(int)
    for s in tokens["seq_id"]:
        lengths[s] += 1
    bte = tables["block_table_entry"].to_pydict()
    base = {
        (t, i): b
        for t, i, b in zip(
            bte["block_table_id"], bte["block_index"], bte["physical_block_base"], strict=True
        )
    }
    swapped = tables["swapped_block"].to_pydict()
    cpu = {
        (t, i): a
        for t, i, a in zip(
            swapped["block_table_id"],
            swapped["block_index"],
            swapped["cpu_base_address"],
            strict=True,
        )
    }
    return {"tokens": tokens, "lengths": lengths, "bte": bte, "base": base, "cpu": cpu}


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_synth_gives_each_sequence_exactly_the_blocks_its_tokens_fill(block_size: int) -> None:
    """ceil(length / block size) logical blocks a sequence, each resident or swapped (none
    missing): a length that is an exact multiple of the block size gets no extra block."""
    config = SynthConfig(
        sequences=40, mean_length=24, block_size=block_size, swap_fraction=0.3, seed=5
    )
    shape = _synth_shape(synthesize(config))
    lengths = shape["lengths"]
    assert any(n % block_size == 0 for n in lengths.values())  # the boundary is exercised
    blocks: dict[int, set[int]] = defaultdict(set)
    for t, i in [*shape["base"], *shape["cpu"]]:
        blocks[t - 100].add(i)
    assert set(blocks) == set(lengths)
    for seq, n in lengths.items():
        assert blocks[seq] == set(range(-(-n // block_size))), seq
    tokens = shape["tokens"]
    for pos, index, offset in zip(
        tokens["token_pos"], tokens["block_index"], tokens["offset_in_block"], strict=True
    ):
        assert (index, offset) == divmod(pos, block_size)


def test_a_fork_shares_the_first_half_of_its_parents_blocks_and_no_more() -> None:
    """Every sequence but the first forks (fork fraction 1): sequence k holds the bases of
    sequence k-1 for its first min(blocks of k, blocks of k-1) // 2 blocks, fresh ones after;
    a base's refcount is the number of entries holding it."""
    config = SynthConfig(
        sequences=30, mean_length=40, block_size=4, fork_fraction=1.0, swap_fraction=0, seed=2
    )
    shape = _synth_shape(synthesize(config))
    base, lengths = shape["base"], shape["lengths"]
    nblocks = {s: -(-n // 4) for s, n in lengths.items()}
    for k in range(1, 30):
        shared = min(nblocks[k], nblocks[k - 1]) // 2
        parent = {base[(k + 99, i)] for i in range(nblocks[k - 1])}
        for i in range(nblocks[k]):
            if i < shared:
                assert base[(k + 100, i)] == base[(k + 99, i)], (k, i)
            else:
                assert base[(k + 100, i)] not in parent, (k, i)
    holders: dict[int, int] = defaultdict(int)
    for b in base.values():
        holders[b] += 1
    bte = shape["bte"]
    for b, r in zip(bte["physical_block_base"], bte["refcount"], strict=True):
        assert r == holders[b]
    assert max(holders.values()) > 2  # chains of forks share a block three ways and more


def test_synth_without_forks_gives_every_block_its_own_base() -> None:
    shape = _synth_shape(synthesize(SynthConfig(sequences=20, mean_length=30, fork_fraction=0)))
    assert len(set(shape["base"].values())) == len(shape["base"])
    assert set(shape["bte"]["refcount"]) == {1}


def test_synth_by_default_injects_no_anomaly() -> None:
    """The Python API's defaults make a consistent cache: nothing for `check` to find."""
    with pagedkv_sql.connect(":memory:") as db:
        for relation, table in synthesize(SynthConfig(sequences=20, mean_length=50)).items():
            db.load_arrow(relation, table)
        assert {r.name: r.count for r in db.check().results if r.count} == {}
    bases = synthesize(SynthConfig(sequences=5, mean_length=50))["block_table_entry"]
    assert max(bases.column("physical_block_base").to_pylist()) < 1 << 44


@pytest.mark.parametrize("block_size", [16, 4])
def test_anomalies_are_n_of_each_kind_and_nothing_else(block_size: int) -> None:
    """More anomalies than a block has tokens: the tokens in no block are still decomposed
    right for the block size, so `check` finds exactly n orphans and n unresolved tokens,
    and no wrong decomposition."""
    config = SynthConfig(
        sequences=40, mean_length=40, block_size=block_size, anomalies=37, swap_fraction=0
    )
    with pagedkv_sql.connect(":memory:") as db:
        for relation, table in synthesize(config).items():
            db.load_arrow(relation, table)
        found = {r.name: r.count for r in db.check(block_size=block_size).results if r.count}
    assert found.pop("diag_refcount_mismatch") >= 1
    assert found == {"diag_unresolved_token": 37, "diag_orphan_block_table": 37}


def test_synth_addresses_are_aligned_and_wide_ones_above_two_to_the_44() -> None:
    for wide in (False, True):
        shape = _synth_shape(
            synthesize(
                SynthConfig(sequences=10, mean_length=50, swap_fraction=0.3, wide_addresses=wide)
            )
        )
        addresses = np.array([*shape["base"].values(), *shape["cpu"].values()], dtype=np.int64)
        assert (addresses % 256 == 0).all()
        assert ((addresses >= 1 << 44) == wide).all()
        cpu = sorted(shape["cpu"].values())
        assert len(set(cpu)) == len(cpu)


# -- textscan.py: lines across the reader's 4 MiB cuts -------------------------------------

CUT = 1 << 22  # textscan reads 4 MiB at a time, sources.preflight too
M = MAX_LINE
BOM = b"\xef\xbb\xbf"


def _pad(size: int) -> bytes:
    """``size`` bytes of complete lines of decimal digits (each ends with LF)."""
    count, rest = divmod(size, 1000)
    lines = [b"5" * 999 + b"\n"] * count
    if rest:
        lines[-1] = b"5" * (999 + rest) + b"\n"
    return b"".join(lines)


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
        pytest.param(_pad(CUT - 400) + b"7" * 399 + b"\r\n8\n", id="CRLF split by the cut"),
        pytest.param(_pad(CUT - 400) + b"7" * 399 + b"\r9\n", id="CR the last byte of a chunk"),
        pytest.param(_pad(CUT - 400) + b"7" * 399 + b"\n" + BOM + b"8\n", id="BOM bytes at a cut"),
        pytest.param(_pad(CUT - M // 2) + b"7" * 2 * M + b"\n8\n", id="long line over a cut"),
        pytest.param(_pad(CUT - M) + b"7" * M + b"\n8\n", id="MAX_LINE ending at a cut"),
        pytest.param(_pad(CUT - M) + b"7" * (M + 1) + b"\n8\n", id="MAX_LINE+1 over a cut"),
        pytest.param(_pad(CUT - M - 1) + b"7" * (M + 1) + b"\n8\n", id="MAX_LINE+1 to a cut"),
        pytest.param(_pad(CUT - 3 * M // 2) + b"7" * (3 * M // 2) + b"\n8\n", id="LF after a cut"),
        pytest.param(_pad(CUT - 3 * M // 2) + b"7" * 2 * M + b"\r\n8\r\n", id="long, CRLF"),
        pytest.param(
            _pad(CUT - 3 * M // 2) + b"7" * (3 * M // 2 - 1) + b"\r\n8\n", id="long CR|LF"
        ),
        pytest.param(_pad(CUT - 3 * M // 2) + b"7" * (3 * M // 2 - 1) + b"\r8\n", id="long CR|8"),
        pytest.param(
            _pad(CUT - 3 * M // 2) + b"7" * (3 * M // 2 + CUT - 1) + b"\r\n8\n",
            id="long over a whole chunk, CR|LF",
        ),
        pytest.param(
            _pad(CUT - 3 * M // 2) + b"7" * (3 * M // 2 + CUT - 1) + b"\r8\n",
            id="long over a whole chunk, CR|8",
        ),
        pytest.param(_pad(CUT - 3 * M // 2) + b"7" * (2 * M), id="long line to the end"),
        pytest.param(
            _pad(CUT - 3 * M // 2) + b"7" * (3 * M // 2 - 1) + b"\r\n" + _pad(CUT - 2) + b"9\n8\n",
            id="long CR|LF, then LF first in the next chunk",
        ),
        pytest.param(
            _pad(CUT - 3 * M // 2) + b"7" * (3 * M // 2 + CUT - 1) + b"\n\n8\n",
            id="long over a whole chunk, LF|LF",
        ),
        pytest.param(BOM + _pad(1000) + b"8\r", id="BOM, CR at the end"),
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


# -- sources.py: which reader a text file gets ---------------------------------------------

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


# -- sources.py: discovery -----------------------------------------------------------------


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


# -- sqlfiles.py ---------------------------------------------------------------------------


def test_a_statement_doc_is_its_comment_lines_without_the_dashes() -> None:
    text = "-- name: a\n-- One line,\n--and the next.\n--\nSELECT 1;\n-- not doc\n"
    (statement,) = sqlfiles.parse(text, "x.sql")
    assert statement.doc == "One line, and the next."
    assert statement.sql == "SELECT 1;\n-- not doc"
    assert (statement.name, statement.file, statement.line) == ("a", "x.sql", 1)


class _ArrowStream:
    """An object that exports an Arrow C stream (as polars or a DuckDB result do), read once."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        reader = pa.RecordBatchReader.from_batches(self.table.schema, self.table.to_batches())
        return reader.__arrow_c_stream__(requested_schema)


def test_a_stream_refused_is_described_from_the_error_not_read_twice() -> None:
    """An Arrow C stream is read once: a refusal names the bad value from the load's own
    error, never from a second read of a stream that is gone."""
    table = pa.table(
        {"seq_id": pa.array([1, None], pa.int64()), "block_table_ptr": pa.array([100, 200])}
    )
    with pagedkv_sql.connect(":memory:") as db:
        with pytest.raises(InputError) as e:
            db.load_arrow("root_table", _ArrowStream(table))
        assert [p.message for p in e.value.problems] == ["column seq_id holds a null"]
        table = table.set_column(0, "seq_id", pa.array([1, 2], pa.int64()))
        db.load_arrow("root_table", _ArrowStream(table))
        assert db.sql("SELECT * FROM root_table ORDER BY ALL").fetchall() == [(1, 100), (2, 200)]


# -- sql/schema.sql, constraints.sql, resolve.sql, inspect.sql: data on the boundaries ------

INT64_MAX = 2**63 - 1


def _loaded_roots(path: Path) -> list[tuple[Any, ...]]:
    """The rows of root_table after loading ``path`` into a fresh database, sorted."""
    with pagedkv_sql.connect(":memory:") as db:
        db.load(path)
        return db.con.execute("SELECT * FROM root_table ORDER BY ALL").fetchall()


def _insert(db: pagedkv_sql.Database, relation: str, rows: list[tuple[int, ...]]) -> None:
    """Rows as a DuckDB shell user would INSERT them: exact duplicates stay."""
    marks = ", ".join("?" * len(rows[0]))
    db.con.executemany(f"INSERT INTO {relation} VALUES ({marks})", rows)


def _view(db: pagedkv_sql.Database, view: str, columns: str = "*") -> list[tuple[Any, ...]]:
    return db.con.execute(f"SELECT {columns} FROM {view} ORDER BY ALL").fetchall()


def _findings(db: pagedkv_sql.Database) -> dict[str, int]:
    return {r.name: r.count for r in db.check().results if r.count}


def test_a_refused_load_names_each_spec_violation_on_its_boundary(tmp_path: Path) -> None:
    """A base of 384 is 128- but not 256-aligned; refcount 0 and offsets 0 and 255 are
    fine, refcount -1 and offset 256 are not; a row given twice is one violation."""
    f = tmp_path / "block_table_entry.facts"
    f.write_text("1\t0\t256\t0\n1\t1\t384\t1\n1\t2\t512\t-1\n1\t2\t512\t-1\n")
    g = tmp_path / "virtual_token.facts"
    g.write_text("1\t0\t0\t0\n1\t255\t0\t255\n1\t256\t1\t256\n")
    with pagedkv_sql.connect(":memory:") as db:
        with pytest.raises(ConstraintError) as e:
            db.load(f)
        assert e.value.total == 2
        assert [
            (v.check, tuple(v.values.values()), v.reason, v.locations) for v in e.value.violations
        ] == [
            (
                "spec_unaligned_base",
                (1, 1, 384, 1),
                "physical_block_base 384 is not 256-byte aligned (384 mod 256 = 128)",
                (f"{f}:2",),
            ),
            (
                "spec_negative_refcount",
                (1, 2, 512, -1),
                "refcount -1 is negative",
                (f"{f}:3", f"{f}:4"),
            ),
        ]
        with pytest.raises(ConstraintError) as e:
            db.load(g)
        assert [(v.check, tuple(v.values.values())) for v in e.value.violations] == [
            ("spec_offset_out_of_block", (1, 256, 1, 256))
        ]
        f.write_text("1\t0\t256\t0\n")
        g.write_text("1\t0\t0\t0\n1\t255\t15\t255\n")
        db.load(f, g)
        assert db.con.execute("SELECT count(*) FROM virtual_token").fetchone() == (2,)


@pytest.mark.parametrize(
    "relation, row",
    [
        ("block_table_entry", (1, 0, 384, 1)),
        ("block_table_entry", (1, 0, 256, -1)),
        ("virtual_token", (1, 0, 0, -1)),
        ("virtual_token", (1, 256, 1, 256)),
    ],
)
def test_the_schema_refuses_what_the_spec_forbids_from_the_shell(
    db: pagedkv_sql.Database, relation: str, row: tuple[int, ...]
) -> None:
    with pytest.raises(duckdb.ConstraintException):
        _insert(db, relation, [row])


def test_the_schema_takes_refcount_zero_and_offsets_zero_and_255(db: pagedkv_sql.Database) -> None:
    _insert(db, "block_table_entry", [(1, 0, 256, 0)])
    _insert(db, "virtual_token", [(1, 0, 0, 0), (1, 255, 0, 255)])


def test_refcounts_are_held_against_their_holders(db: pagedkv_sql.Database) -> None:
    """Base 256: one holder, refcount 0. Base 512: two holders that disagree (2 and 3, the
    lower equal to the holders). Base 768: three holders saying 2. Base 1024: refcount 2 in
    a row given twice by one holder. Base 1280: two holders saying 2 (right)."""
    _insert(
        db,
        "block_table_entry",
        [
            (1, 0, 256, 0),
            (1, 1, 512, 2),
            (2, 0, 512, 3),
            (1, 2, 768, 2),
            (2, 1, 768, 2),
            (3, 0, 768, 2),
            (4, 0, 1024, 2),
            (4, 0, 1024, 2),
            (5, 0, 1280, 2),
            (5, 1, 1280, 2),
        ],
    )
    expected = [
        (256, 1, [0], "1:0", "refcount 0 but 1 holder(s)"),
        (512, 2, [2, 3], "1:1 2:0", "holders disagree on the refcount"),
        (768, 3, [2], "1:2 2:1 3:0", "refcount 2 but 3 holder(s)"),
        (1024, 1, [2], "4:0", "refcount 2 but 1 holder(s)"),
    ]
    assert _view(db, "diag_refcount_mismatch") == expected
    report = db.check()
    (result,) = [r for r in report.results if r.name == "diag_refcount_mismatch"]
    assert result.count == 4


def test_sorted_unique_keys_are_proven_unique_and_refcounts_still_checked(
    db: pagedkv_sql.Database,
) -> None:
    """Keys in ascending order let check() count holders without grouping; holders saying
    2 and 3 for a base held twice still disagree, and an exact duplicate row (keys not
    strictly ascending) is not taken for a second holder."""
    _insert(db, "root_table", [(1, 1), (2, 2)])
    _insert(db, "block_table_entry", [(1, 0, 256, 2), (1, 1, 256, 3), (2, 0, 512, 1)])
    assert _findings(db) == {"diag_refcount_mismatch": 1}
    db.con.execute("DELETE FROM block_table_entry")
    _insert(db, "block_table_entry", [(1, 0, 256, 1), (1, 0, 256, 1), (1, 1, 512, 1)])
    assert _findings(db) == {}


def test_conflicting_locations_count_distinct_addresses(db: pagedkv_sql.Database) -> None:
    """Key (1, 0) at two GPU bases, one given twice; key (1, 1) at two CPU addresses; key
    (1, 2) resident and swapped; block 3 swapped only, beside resident blocks of its table."""
    _insert(db, "root_table", [(1, 1)])
    _insert(
        db, "block_table_entry", [(1, 0, 256, 1), (1, 0, 256, 1), (1, 0, 512, 1), (1, 2, 768, 1)]
    )
    _insert(
        db,
        "swapped_block",
        [
            (
                1,
                1,
                4096,
            ),
            (1, 1, 8192),
            (1, 2, 12288),
            (1, 3, 16384),
        ],
    )
    assert _view(db, "diag_conflicting_location") == [
        (1, 0, [256, 512], None, "2 different GPU bases"),
        (1, 1, None, [4096, 8192], "2 different CPU addresses"),
        (1, 2, [768], [12288], "resident and swapped at once"),
    ]


def test_cpu_addresses_overlap_only_closer_than_256_bytes(db: pagedkv_sql.Database) -> None:
    """128 is aligned to 128 but not 256, so it is unaligned and 128 bytes from 256; 256
    and 512 are exactly 256 apart: no overlap."""
    _insert(db, "swapped_block", [(1, 0, 128), (1, 1, 256), (1, 2, 512)])
    assert _view(db, "diag_overlapping_blocks", "tier, lower_address, upper_address") == [
        ("cpu", 128, 256)
    ]
    assert _view(db, "diag_unaligned_cpu_address", "cpu_base_address") == [(128,)]


def test_token_decompositions_on_every_boundary(db: pagedkv_sql.Database) -> None:
    """Block index 2^31 (past 32 bits: the 128-bit branch) decomposes right; two wrong
    tokens of one sequence are two findings, not two decompositions of one token; a wrong
    row given twice is one finding; a right token beside a wrong one is not listed."""
    big = 2**31
    _insert(
        db,
        "virtual_token",
        [
            (1, big * 16 + 3, big, 3),
            (1, 2**40 * 16 + 4, 2**40, 3),
            (2, 0, 0, 0),
            (2, 5, 0, 4),
            (2, 7, 0, 6),
            (2, 7, 0, 6),
            (2, 17, 1, 1),
            (3, 16, 0, 16),
            (3, 15, 0, 15),
        ],
    )
    assert _view(db, "diag_token_decomposition") == [
        (
            1,
            2**44 + 4,
            2**40,
            3,
            f"block_index * 16 + offset_in_block = {2**44 + 3}, not token_pos {2**44 + 4}",
        ),
        (2, 5, 0, 4, "block_index * 16 + offset_in_block = 4, not token_pos 5"),
        (2, 7, 0, 6, "block_index * 16 + offset_in_block = 6, not token_pos 7"),
        (3, 16, 0, 16, "offset_in_block 16 >= block size 16"),
    ]


def test_decompositions_follow_the_stored_block_size(tmp_path: Path) -> None:
    f = tmp_path / "virtual_token.facts"
    f.write_text("1\t16\t0\t16\n1\t17\t1\t1\n")
    with pagedkv_sql.connect(":memory:") as db:
        db.load(f, block_size=32)
        assert _view(db, "diag_token_decomposition", "token_pos") == [(17,)]


def test_unresolved_tokens_are_listed_once_with_why(db: pagedkv_sql.Database) -> None:
    """Sequence 1 (table 10) has block 0 resident and block 1 nowhere; sequence 2 has no
    root; a token given twice is listed once; sequence numbers differ from table ids."""
    _insert(db, "root_table", [(1, 10)])
    _insert(db, "block_table_entry", [(10, 0, 256, 1)])
    _insert(db, "swapped_block", [(10, 2, 4096)])
    _insert(
        db,
        "virtual_token",
        [(1, 0, 0, 0), (1, 16, 1, 0), (1, 16, 1, 0), (1, 32, 2, 0), (2, 0, 0, 0)],
    )
    assert _view(db, "diag_unresolved_token") == [
        (1, 16, 1, 0, "block 1 of block table 10 is neither resident nor swapped"),
        (2, 0, 0, 0, "no root_table row for seq_id 2"),
    ]


def test_an_orphan_table_counts_its_distinct_blocks(db: pagedkv_sql.Database) -> None:
    _insert(db, "root_table", [(1, 10)])
    _insert(
        db,
        "block_table_entry",
        [(10, 0, 256, 1), (20, 0, 512, 1), (20, 0, 512, 1), (20, 1, 768, 1)],
    )
    _insert(db, "swapped_block", [(20, 2, 4096), (20, 2, 4096), (10, 1, 8192)])
    assert _view(
        db, "diag_orphan_block_table", "block_table_id, resident_blocks, swapped_blocks"
    ) == [(20, 2, 1)]
    assert _view(db, "diag_orphan_swapped_block", "block_table_id, block_index") == [(20, 2)]


def test_a_cpu_address_near_the_top_wraps_as_in_souffle(db: pagedkv_sql.Database) -> None:
    """INT64_MAX - 5 + 5 is INT64_MAX exactly; INT64_MAX - 1 + 5 wraps to INT64_MIN + 3."""
    _insert(db, "root_table", [(1, 10)])
    _insert(db, "swapped_block", [(10, 0, INT64_MAX - 5), (10, 1, INT64_MAX - 1)])
    _insert(db, "virtual_token", [(1, 5, 0, 5), (1, 21, 1, 5), (1, 16, 1, 0)])
    assert _view(db, "resolved_kv_address") == [
        (1, 5, INT64_MAX),
        (1, 16, INT64_MAX - 1),
        (1, 21, -(2**63) + 3),
    ]


def _stats_cache(db: pagedkv_sql.Database) -> None:
    """Sequence 1 (table 10): 64 tokens, blocks 0-2 resident (block 2 with a CPU copy),
    block 3 swapped. Sequence 2 (table 20): 20 tokens, block 0 shares base 256 with
    sequence 1, block 1 nowhere."""
    _insert(db, "root_table", [(1, 10), (2, 20)])
    _insert(db, "virtual_token", [(1, p, p // 16, p % 16) for p in range(64)])
    _insert(db, "virtual_token", [(2, p, p // 16, p % 16) for p in range(20)])
    _insert(
        db,
        "block_table_entry",
        [(10, 0, 256, 2), (10, 1, 512, 1), (10, 2, 768, 1), (20, 0, 256, 2)],
    )
    _insert(db, "swapped_block", [(10, 2, 4096), (10, 3, 8192)])


def test_stats_of_a_cache_with_every_kind_of_block(db: pagedkv_sql.Database) -> None:
    _stats_cache(db)
    stats = db.stats()
    assert stats.counts == {
        "sequences": 2,
        "tokens": 84,
        "logical_blocks": 6,
        "resident_blocks": 4,
        "swapped_blocks": 1,
        "missing_blocks": 1,
        "resident_blocks_with_cpu_copy": 1,
        "physical_gpu_blocks": 3,
        "physical_cpu_blocks": 2,
        "blocks_saved_by_sharing": 1,
        "unused_token_slots_in_last_blocks": 12,  # 64 fills its last block; 20 leaves 12
        "block_size_tokens": 16,
        "gpu_bytes": 768,
        "cpu_bytes": 512,
    }
    assert stats.refcount_histogram == [(1, 2), (2, 1)]


def test_explain_gives_each_address_as_base_plus_offset(db: pagedkv_sql.Database) -> None:
    _stats_cache(db)
    found = db.explain(1, 37)
    assert [(r.tier, r.base, r.physical_address) for r in found.resolutions] == [
        ("gpu", 768, 773),
        ("cpu", 4096, 4101),
    ]
    assert found.roots == [10] and found.decompositions == [(2, 5)] and found.broken is None


def test_resolve_takes_each_tokens_own_block_and_sorts_by_address_too(
    db: pagedkv_sql.Database,
) -> None:
    """One table of 8 blocks, each resident and swapped (4 tokens a block): a token
    resolves through its own block only (not every block of its table), and its two
    addresses come out in address order: the GPU one first in odd blocks, the CPU one in
    even blocks, so no order of ties (the rules' order, or its reverse) passes for both."""
    blocks, size = 8, 4
    gpu = [(7, k, (1 << 20) + 256 * k if k % 2 == 0 else 256 * k, 1) for k in range(blocks)]
    cpu = [(7, k, (1 << 16) + 256 * k) for k in range(blocks)]
    _insert(db, "root_table", [(3, 7)])
    _insert(db, "block_table_entry", gpu)
    _insert(db, "swapped_block", cpu)
    db.con.execute(
        f"INSERT INTO virtual_token SELECT 3, t, t // {size}, t % {size} FROM range(32) r(t)"
    )
    want = sorted(
        (3, t, base + t % size)
        for t in range(blocks * size)
        for base in (gpu[t // size][2], cpu[t // size][2])
    )
    got = db.resolve_table()
    assert list(zip(*(got.column(c).to_pylist() for c in got.column_names), strict=True)) == want


def test_the_resolved_view_is_a_set(db: pagedkv_sql.Database) -> None:
    """A token whose block is resident and swapped at the same address is one row of
    resolved_kv_address, as in Soufflé, not one a rule."""
    _insert(db, "root_table", [(3, 7)])
    _insert(db, "block_table_entry", [(7, 0, 4096, 1)])
    _insert(db, "swapped_block", [(7, 0, 4096)])
    _insert(db, "virtual_token", [(3, 0, 0, 5)])
    assert _view(db, "resolved_kv_address") == [(3, 0, 4101)]


# -- datalog.py ----------------------------------------------------------------------------


def test_datalog_facts_among_comments_directives_and_rules() -> None:
    """A directive ends at its line's end, or at a block comment that spans lines; facts
    take signs, hex and binary, a sign apart from its number; each row keeps its line."""
    text = (
        "// comment\n"
        ".decl root_table(seq_id: number, block_table_ptr: number)\n"
        ".input root_table /* a comment\n"
        "   over two lines */ root_table(1, 100).\n"
        "root_table(-2, +0x20). root_table(3, - 5).\n"
        "  /* c */ block_table_entry(100, 0, 0b100000000, 1).\n"
        "foo(X) :- root_table(X, _).\n"
        "virtual_token(1, 0, 0, 0).\n"
    )
    facts = datalog.parse_facts(text, "x.dl")
    assert facts.rows == {
        "root_table": [(1, 100), (-2, 32), (3, -5)],
        "block_table_entry": [(100, 0, 256, 1)],
        "virtual_token": [(1, 0, 0, 0)],
    }
    assert facts.lines == {"root_table": [4, 5, 5], "block_table_entry": [6], "virtual_token": [8]}
    assert facts.problem_count == 0


def test_datalog_problems_are_named_at_their_line_and_column() -> None:
    text = (
        "root_table(1, 2.5).\n"
        "root_table(1 2, 3).\n"
        "  root_table(1, x).\n"
        "root_table(, 100).\n"
        "root_table(1, + - 5).\n"
        "unknown_rel(1).\n"
        "resolved_kv_address(1, 2, 3).\n"
        "root_table(1, 2, 3).\n"
        "root_table(1, 2) ` .\n"
        "/* a\n"
        "  b */ root_table(1, y).\n"
        "root_table(0x, 1).\n"
        "root_table(3, 4). /* open\n"
    )
    facts = datalog.parse_facts(text, "x.dl")
    expected = "expected a signed 64-bit integer (decimal, 0x hex or 0b binary)"
    assert [str(p) for p in facts.problems] == [
        f"x.dl:1:15: invalid number '2.5'; {expected}",
        "x.dl:2:12: fact argument '12' is not a number literal",
        "x.dl:3:17: fact argument 'x' is not a number literal",
        f"x.dl:4:1: empty field; {expected}",
        "x.dl:5:15: fact argument '+-5' is not a number literal",
        "x.dl:6:1: facts for unknown relation 'unknown_rel'; input relations are: "
        "root_table, block_table_entry, virtual_token, swapped_block",
        "x.dl:7:1: 'resolved_kv_address' is the spec's output relation; it is computed, not loaded",
        "x.dl:8:1: root_table has 2 attributes, this fact has 3",
        "x.dl:9:18: unexpected character '`'",
        "x.dl:11:22: fact argument 'y' is not a number literal",
        f"x.dl:12:12: invalid number '0x'; {expected}",
        "x.dl:13:19: unterminated /* comment",
    ]
    assert facts.rows == {"root_table": [(1, 2), (3, 4)]}


def test_datalog_keeps_the_first_thousand_problems_and_counts_all(tmp_path: Path) -> None:
    f = tmp_path / "x.dl"
    f.write_text("root_table(1, x).\n" * (datalog.MAX_PROBLEMS + 1))
    facts = datalog.read_facts(f, "x.dl")
    assert len(facts.problems) == datalog.MAX_PROBLEMS
    assert facts.problem_count == datalog.MAX_PROBLEMS + 1
    assert facts.problems[-1].line == datalog.MAX_PROBLEMS


def test_datalog_not_utf8_is_named_at_its_line(tmp_path: Path) -> None:
    f = tmp_path / "x.dl"
    f.write_bytes(b"\xef\xbb\xbfroot_table(1, 100).\nroot_table(2, \xff).\n")
    facts = datalog.read_facts(f, "x.dl")
    assert [str(p) for p in facts.problems] == ["x.dl:2: not UTF-8 text; save the file as UTF-8"]
    f.write_bytes(b"\xef\xbb\xbfroot_table(1, 100).\n")
    assert datalog.read_facts(f, "x.dl").rows == {"root_table": [(1, 100)]}


# -- stream.py -----------------------------------------------------------------------------


def _stream_db(db: pagedkv_sql.Database) -> None:
    """Sequence 1, table 10: block 0 at 256."""
    db.load_arrow("root_table", arrow_table("root_table", [(1, 10)]))
    db.load_arrow("block_table_entry", arrow_table("block_table_entry", [(10, 0, 256, 1)]))


def _streamed(db: pagedkv_sql.Database, batches: list[list[tuple[int, ...]]]) -> list[list[Any]]:
    tables = [arrow_table("virtual_token", b) for b in batches]
    return [[tuple(r.values()) for r in out.to_pylist()] for out in db.resolve_stream(tables)]


def test_a_batch_starting_at_the_watermark_drops_the_row_given_there(
    db: pagedkv_sql.Database,
) -> None:
    """Batch 2 starts with the very token batch 1 ended with (key == watermark)."""
    _stream_db(db)
    out = _streamed(db, [[(1, 3, 0, 3), (1, 5, 0, 5)], [(1, 5, 0, 5), (1, 6, 0, 6)]])
    assert out == [[(1, 3, 259), (1, 5, 261)], [(1, 6, 262)]]


def test_a_batch_ending_where_an_earlier_one_began_is_joined_with_it(
    db: pagedkv_sql.Database,
) -> None:
    """Batch 2 covers keys 5-6, below batch 1's; batch 3's last key is batch 2's first:
    the key ranges touch, so batch 3 is checked against batch 2."""
    _stream_db(db)
    out = _streamed(
        db,
        [
            [(1, 10, 0, 10), (1, 12, 0, 12)],
            [(1, 5, 0, 5), (1, 6, 0, 6)],
            [(1, 4, 0, 4), (1, 5, 0, 5)],
        ],
    )
    assert out == [[(1, 10, 266), (1, 12, 268)], [(1, 5, 261), (1, 6, 262)], [(1, 4, 260)]]


def test_a_token_given_again_at_another_address_is_new(db: pagedkv_sql.Database) -> None:
    """Rows repeat only when the whole row does: the same token decomposed otherwise
    resolves to another address, which is a new row."""
    _stream_db(db)
    out = _streamed(db, [[(1, 5, 0, 5), (1, 9, 0, 9)], [(1, 5, 0, 6), (1, 9, 0, 9)]])
    assert out == [[(1, 5, 261), (1, 9, 265)], [(1, 5, 262)]]


def test_every_batch_yields_at_least_one_batch_even_empty(db: pagedkv_sql.Database) -> None:
    _stream_db(db)
    out = _streamed(db, [[(1, 0, 0, 0)], [(2, 0, 0, 0)], [(1, 0, 0, 0)], [(1, 1, 0, 1)]])
    assert out == [[(1, 0, 256)], [], [], [(1, 1, 257)]]


def test_duplicates_within_a_batch_collapse_at_any_position(db: pagedkv_sql.Database) -> None:
    """Exact duplicates anywhere in a sorted batch (first two rows, last two, all)."""
    _stream_db(db)
    out = _streamed(
        db,
        [
            [(1, 0, 0, 0), (1, 0, 0, 0), (1, 1, 0, 1)],
            [(1, 2, 0, 2), (1, 3, 0, 3), (1, 3, 0, 3)],
            [(1, 4, 0, 4), (1, 4, 0, 4)],
            [(1, 5, 0, 5)],
        ],
    )
    assert out == [
        [(1, 0, 256), (1, 1, 257)],
        [(1, 2, 258), (1, 3, 259)],
        [(1, 4, 260)],
        [(1, 5, 261)],
    ]
    assert stream.distinct_sorted(pa.table({"a": [1, 1], "b": [2, 3]})).num_rows == 2


def test_a_bad_batch_is_named_by_its_number_with_a_hundred_rows_shown(
    db: pagedkv_sql.Database,
) -> None:
    _stream_db(db)
    bad = [(1, p, 0, 256 + p) for p in range(150)]
    with pytest.raises(ConstraintError) as e:
        _streamed(db, [[(1, 0, 0, 0)], bad])
    assert str(e.value).startswith("<token batch 2>: 150 token(s) violate")
    assert e.value.total == 150 and len(e.value.violations) == 100
    assert e.value.violations[0].locations == ("<token batch 2>",)
    with pytest.raises(InputError) as f:
        list(db.resolve_stream([pa.table({"seq_id": [1]})]))
    assert str(f.value).startswith("<token batch 1>: ")


def test_a_stream_takes_a_table_a_reader_and_a_c_stream(db: pagedkv_sql.Database) -> None:
    _stream_db(db)
    table = arrow_table("virtual_token", [(1, 0, 0, 0), (1, 1, 0, 1)])
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches())
    for given in (table, reader, _ArrowStream(table), table.to_batches()):
        got = [tuple(r.values()) for b in db.resolve_stream(given) for r in b.to_pylist()]
        assert got == [(1, 0, 256), (1, 1, 257)]


# -- sources.py: reader switching ----------------------------------------------------------


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


# -- sources.py: what discovery refuses, and where Arrow rows are ----------------------------


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


# -- inspect.py, textscan.py, datalog.py, synth.py: survivors of the first run ----------------


def test_explanations_are_immutable_and_resolutions_hashable(db: pagedkv_sql.Database) -> None:
    _stats_cache(db)
    found = db.explain(1, 37)
    assert len({*found.resolutions, *found.resolutions}) == 2
    for value, name in [
        (found, "broken"),
        (found.hops[0], "block_index"),
        (found.resolutions[0], "base"),
        (db.stats(), "counts"),
    ]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, None)


def test_a_malformed_quoted_csv_line_is_named_not_a_crash(tmp_path: Path) -> None:
    f = tmp_path / "root_table.csv"
    f.write_text('seq_id,block_table_ptr\n1,100\n2,"20"0\n')
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert [str(p) for p in e.value.problems] == [f"{f}:3: malformed CSV: ',' expected after '\"'"]


def test_datalog_keeps_exactly_one_thousand_problems(tmp_path: Path) -> None:
    f = tmp_path / "x.dl"
    f.write_text("root_table(1, x).\n" * 1002)
    facts = datalog.read_facts(f, "x.dl")
    assert (len(facts.problems), facts.problem_count) == (1000, 1002)


def test_injected_orphans_hold_bases_of_their_own() -> None:
    """An orphan block table's block is a leak, not a share of a live block: its base is
    held by no other entry (else it would add refcount findings of its own)."""
    tables = synthesize(SynthConfig(sequences=40, mean_length=100, anomalies=25, swap_fraction=0))
    bte = tables["block_table_entry"].to_pydict()
    orphan = {
        b
        for t, b in zip(bte["block_table_id"], bte["physical_block_base"], strict=True)
        if t >= 10**12
    }
    live = {
        b
        for t, b in zip(bte["block_table_id"], bte["physical_block_base"], strict=True)
        if t < 10**12
    }
    assert len(orphan) == 25 and not orphan & live
    assert len(bte["block_table_id"]) > 25 + 200  # enough live blocks to meet a careless base


@pytest.mark.parametrize("fmt", ["facts", "tsv", "csv", "parquet", "arrow"])
def test_synth_writes_each_format_that_loads_back(tmp_path: Path, fmt: str) -> None:
    from pagedkv_sql.synth import write

    tables = synthesize(SynthConfig(sequences=5, mean_length=30, swap_fraction=0.3, seed=4))
    written = write(tables, tmp_path / "out", fmt)
    assert [p.name for p in written] == [f"{r}.{fmt}" for r in tables]
    with pagedkv_sql.connect(":memory:") as db:
        db.load(tmp_path / "out", format=fmt)
        for relation, table in tables.items():
            got = db.con.execute(f"SELECT * FROM {relation} ORDER BY ALL").fetchall()
            assert got == sorted(zip(*table.to_pydict().values(), strict=True)), relation


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


def test_only_the_rows_up_to_the_watermark_are_joined(
    db: pagedkv_sql.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 2 holds keys 2-7 after batch 1's 0-4: its first three rows (keys 2-4) may
    repeat rows given before and are joined; keys 5-7 are above the watermark, new."""
    prefixes: list[int] = []
    unseen = stream._Seen._unseen
    monkeypatch.setattr(
        stream._Seen, "_unseen", lambda self, out, n: prefixes.append(n) or unseen(self, out, n)
    )
    _stream_db(db)
    out = _streamed(db, [[(1, p, 0, p) for p in range(5)], [(1, p, 0, p) for p in range(2, 8)]])
    assert prefixes == [3]
    assert out[1] == [(1, 5, 261), (1, 6, 262), (1, 7, 263)]


def test_synth_writes_into_a_directory_that_exists(tmp_path: Path) -> None:
    from pagedkv_sql.synth import write

    tables = synthesize(SynthConfig(sequences=2, mean_length=5))
    write(tables, tmp_path / "out")
    assert write(tables, tmp_path / "out") == [tmp_path / "out" / f"{r}.facts" for r in tables]


def test_synth_seeds_from_zero_by_default() -> None:
    """The Python default seed is the CLI's (0): the same facts either way."""
    a = synthesize(SynthConfig(sequences=5, mean_length=20))
    b = synthesize(SynthConfig(sequences=5, mean_length=20, seed=0))
    c = synthesize(SynthConfig(sequences=5, mean_length=20, seed=1))
    assert all(a[r].equals(b[r]) for r in a)
    assert not all(a[r].equals(c[r]) for r in a)


def test_loading_files_leaves_no_file_descriptor_open(tmp_path: Path) -> None:
    """DuckDB reads each file through /proc/self/fd/N: every N is closed after the load,
    whether it succeeded or was refused."""
    import os

    good = write_facts(
        tmp_path / "good", {"root_table": [(1, 100)], "swapped_block": [(100, 0, 256)]}
    )
    bad = tmp_path / "bad" / "root_table.facts"
    bad.parent.mkdir()
    bad.write_text("1\tx\n")
    with pagedkv_sql.connect(":memory:") as db:
        db.load(good)
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(3):
            db.load(good)
            with pytest.raises(InputError):
                db.load(bad)
        assert len(os.listdir("/proc/self/fd")) == before


def test_a_refused_arrow_table_counts_one_problem(db: pagedkv_sql.Database) -> None:
    table = pa.table({"seq_id": pa.array([1, None], pa.int64()), "block_table_ptr": [1, 2]})
    with pytest.raises(InputError) as e:
        db.load_arrow("root_table", table)
    assert str(e.value).startswith(
        "1 malformed value(s) or line(s) in <arrow root_table>; nothing was loaded"
    )
    assert e.value.total == 1


def test_an_unreadable_file_says_why_and_a_broken_link_where_it_points(tmp_path: Path) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("1\t100\n")
    denied = sources._unreadable("f", PermissionError(13, "Permission denied"), f)
    assert (str(denied), denied.hint) == (
        "f: cannot read it: Permission denied",
        "make it (and the directories above it) readable by this user",
    )
    link = tmp_path / "gone.facts"
    link.symlink_to(tmp_path / "nowhere.facts")
    broken = sources._unreadable("g", FileNotFoundError(2, "No such file"), link)
    assert str(broken) == f"g: a broken symbolic link (to {tmp_path / 'nowhere.facts'})"
    missing = sources._unreadable("h", FileNotFoundError(2, "No such file"), tmp_path / "none")
    assert str(missing) == "h: no such file or directory"


def test_duckdb_s_own_error_is_named_by_its_first_line() -> None:
    ours = duckdb.Error("Invalid Input Error: pagedkv: column x holds a null\nLINE 1: ...")
    theirs = duckdb.Error("Conversion Error: bad\nLINE 1: SELECT ...")
    assert sources.problem_from_duckdb("f", ours).message == "column x holds a null"
    assert sources.problem_from_duckdb("f", theirs).message == "Conversion Error: bad"
    assert sources.problem_from_duckdb("f", duckdb.Error("one line")).message == "one line"


def test_synth_lengths_spread_a_quarter_of_the_mean_around_it() -> None:
    lengths = np.array(
        list(
            _synth_shape(synthesize(SynthConfig(sequences=2000, mean_length=400, seed=3)))[
                "lengths"
            ].values()
        )
    )
    assert abs(lengths.mean() - 400) < 8
    assert 90 < lengths.std() < 110  # a quarter of the mean, 100


def test_synth_swaps_and_loses_the_fractions_of_blocks_asked_for() -> None:
    config = SynthConfig(
        sequences=400,
        mean_length=160,
        swap_fraction=0.2,
        missing_fraction=0.3,
        fork_fraction=0,
        seed=9,
    )
    shape = _synth_shape(synthesize(config))
    logical = sum(-(-n // 16) for n in shape["lengths"].values())
    swapped, resident = len(shape["cpu"]), len(shape["base"])
    missing = logical - swapped - resident
    assert abs(swapped / logical - 0.2) < 0.03
    assert abs(missing / logical - 0.3) < 0.03


def test_a_violation_in_a_datalog_file_is_located_by_its_line(tmp_path: Path) -> None:
    f = tmp_path / "x.dl"
    f.write_text("block_table_entry(1, 0, 256, 1).\n\nblock_table_entry(1, 1, 300, 1).\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(ConstraintError) as e:
        db.load(f)
    assert [v.locations for v in e.value.violations] == [(f"{f}:3",)]


def test_a_csv_header_that_is_not_csv_is_shown_whole(tmp_path: Path) -> None:
    f = tmp_path / "root_table.csv"
    f.write_text('seq_id,"block_table_ptr\n1,100\n')
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert str(e.value).startswith(
        f"{f}:1: header of root_table: missing column(s) seq_id, block_table_ptr; "
        "unknown column(s) 'seq_id,\"block_table_ptr'"
    )


def test_synth_config_defaults_are_the_cli_defaults_and_frozen() -> None:
    import typer

    from pagedkv_sql.cli import app

    command = typer.main.get_command(app).commands["synth"]  # type: ignore[attr-defined]
    cli_defaults = {p.name: p.default for p in command.params}
    config = SynthConfig()
    for f in dataclasses.fields(SynthConfig):
        assert getattr(config, f.name) == cli_defaults[f.name], f.name
    assert hash(config) == hash(SynthConfig())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 1  # type: ignore[misc]


def test_synth_sequences_are_at_least_one_token_long() -> None:
    shape = _synth_shape(synthesize(SynthConfig(sequences=50, mean_length=1)))
    assert set(shape["lengths"].values()) == {1}


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
    assert sources._batch([], schema).num_rows == 0
    assert sources._batch([(1, 2)], schema).to_pylist() == [{"seq_id": 1, "block_table_ptr": 2}]


def test_each_unexpected_character_in_datalog_is_named() -> None:
    facts = datalog.parse_facts("root_table(1, 2) `` .\n", "x.dl")
    assert [str(p) for p in facts.problems] == [
        "x.dl:1:18: unexpected character '`'",
        "x.dl:1:19: unexpected character '`'",
    ]


def test_synth_says_why_it_cannot_create_its_directory(tmp_path: Path) -> None:
    from pagedkv_sql.synth import write

    (tmp_path / "f").write_text("")
    with pytest.raises(PagedKVError) as e:
        write(synthesize(SynthConfig(sequences=1, mean_length=1)), tmp_path / "f" / "out")
    assert str(e.value) == f"cannot create {tmp_path / 'f' / 'out'}: Not a directory"


def test_an_injected_refcount_is_off_by_exactly_one() -> None:
    tables = synthesize(SynthConfig(sequences=30, mean_length=50, anomalies=10, fork_fraction=0.5))
    bte = tables["block_table_entry"].to_pydict()
    holders: dict[int, int] = defaultdict(int)
    for b in bte["physical_block_base"]:
        holders[b] += 1
    off = [r - holders[b] for b, r in zip(bte["physical_block_base"], bte["refcount"], strict=True)]
    assert set(off) == {0, 1} and off.count(1) == 10


def test_a_refused_text_file_keeps_a_thousand_problems_and_counts_all(tmp_path: Path) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("1\tx\n" * 1001)
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert (len(e.value.problems), e.value.total) == (1000, 1001)


def test_a_good_arrow_source_beside_a_bad_text_file_adds_no_problem(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(arrow_table("root_table", [(1, 100)]), tmp_path / "root_table.parquet")
    (tmp_path / "swapped_block.facts").write_text("100\t0\tx\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(tmp_path)
    assert e.value.total == 1
    assert str(e.value).startswith("1 malformed value(s) or line(s) in ")


# -- spill.py: whose temp directory, and when it goes ----------------------------------------


def test_a_spill_directory_sits_beside_its_file_or_in_the_temp_directory(tmp_path: Path) -> None:
    """``DB.<pid>.tmp`` beside a file; ``pagedkv-<pid>-<8 hex digits>.tmp`` in the system's
    temp directory for any ``:memory:`` database (named ones too), a fresh one each time."""
    pid = os.getpid()
    file = tmp_path / "x.duckdb"
    assert spill.spill_directory(str(file)) == f"{file}.{pid}.tmp"
    made = set()
    for memory in (":memory:", ":memory:", ":memory:named"):
        directory = Path(spill.spill_directory(memory))
        assert directory.parent == Path(tempfile.gettempdir())
        assert re.fullmatch(rf"pagedkv-{pid}-[0-9a-f]{{8}}\.tmp", directory.name), directory
        made.add(directory)
    assert len(made) == 3


def test_a_spill_directory_is_removed_by_the_last_of_its_users(tmp_path: Path) -> None:
    path = str(tmp_path / "x.duckdb")
    first, second = spill.acquire(path), spill.acquire(path)
    assert first == second
    Path(first).mkdir()
    spill.release(first)
    assert Path(first).is_dir()  # the other open still uses it
    spill.release(second)
    assert not Path(first).exists()
    Path(first).mkdir()  # a directory no open holds goes at its release
    spill.release(first)
    assert not Path(first).exists()
    spill.release(None)


def test_asking_whether_a_process_lives_sends_it_no_signal() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        assert spill._dead(str(child.pid)) is False
    finally:
        assert child.stdin is not None
        child.stdin.close()
        code = child.wait()
    assert code == 0  # it ended by itself, at the end of its input: no signal reached it


def test_a_process_that_cannot_be_asked_about_counts_as_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert spill._dead("9" * 30) is False  # beyond any pid: OverflowError
    assert spill._dead("x1") is False
    assert spill._dead(str(os.getpid())) is False

    def refused(pid: int, sig: int) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")  # another user's

    monkeypatch.setattr(os, "kill", refused)
    assert spill._dead("12345") is False


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_sweep_goes_on_past_a_directory_it_cannot_remove(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    left = [f"a.duckdb.{pid}.tmp" for pid in sorted({_dead_pid(), _dead_pid()})]
    assert len(left) == 2
    for name in left:
        (tmp_path / name).mkdir()
    real, calls = spill.remove, []

    def remove(directory: str | None) -> None:
        calls.append(directory)
        if len(calls) == 1:  # whichever comes first
            raise PermissionError(errno.EACCES, "Permission denied")
        real(directory)

    monkeypatch.setattr(spill, "remove", remove)
    removed = spill.sweep(str(tmp_path / f"a.duckdb.{os.getpid()}.tmp"))
    assert len(calls) == 2
    kept = [p.name for p in tmp_path.iterdir()]
    assert len(kept) == 1 and sorted([*kept, *removed]) == left


def test_the_sweep_looks_past_every_name_it_keeps(tmp_path: Path) -> None:
    """The database file, a live process's directory (pid 1) and the opener's own sort
    before the dead processes' directories: each is passed over, not the end of the sweep."""
    dead = sorted({_dead_pid(), _dead_pid()})
    own = tmp_path / f"a.duckdb.{os.getpid()}.tmp"
    (tmp_path / "a.duckdb").write_bytes(b"")
    kept = ["a.duckdb", "a.duckdb.1.tmp", own.name]
    left = [f"a.duckdb.{pid}.tmp" for pid in dead]
    for name in [*kept[1:], *left]:
        (tmp_path / name).mkdir()
    assert spill.sweep(str(own)) == left
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


def test_a_memory_databases_sweep_reads_the_pid_before_the_tag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pagedkv-<pid>-<tag>.tmp``: the pid is the part before the first dash. A temp
    directory of the test's own: other processes sweep the system's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = _dead_pid()
    stale, alive = f"pagedkv-{dead}-0badcafe.tmp", "pagedkv-1-0badcafe.tmp"
    for name in (stale, alive):
        (tmp_path / name).mkdir()
    own = spill.spill_directory(":memory:")
    assert Path(own).parent == tmp_path
    assert spill.sweep(own) == [stale]
    assert [p.name for p in tmp_path.iterdir()] == [alive]


def test_an_empty_file_is_refused_as_a_database_and_left_empty(tmp_path: Path) -> None:
    empty = tmp_path / "e.db"
    empty.write_bytes(b"")
    with pytest.raises(DatabaseError) as e:
        pagedkv_sql.connect(empty)
    assert "it is an empty file, not a DuckDB database" in str(e.value)
    assert empty.read_bytes() == b""


# -- paths.py: writing outputs, reading sources, the standard streams -----------------------


def test_a_write_that_fails_midway_keeps_the_old_file_and_says_why(tmp_path: Path) -> None:
    target = tmp_path / "out.csv"
    target.write_text("old\n")
    with pytest.raises(PagedKVError) as e, paths.atomic_output(target) as f:
        f.write(b"new, partly\n")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(e.value) == f"cannot write {target}: No space left on device"
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]


def test_a_source_spelling_holds_one_descriptor_until_closed(tmp_path: Path) -> None:
    source = tmp_path / "a[1].facts"
    source.write_text("1\t2\n")
    before = sorted(os.listdir("/proc/self/fd"))
    spelling = paths.DuckDBPath(source)
    text = str(spelling)
    assert text.startswith("/proc/self/fd/") and Path(text).read_text() == "1\t2\n"
    fd = int(text.rsplit("/", 1)[1])
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC  # no child process inherits it
    assert str(spelling) == text  # opened once
    spelling.close()
    spelling.close()  # twice is harmless
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_a_database_path_that_names_nothing_yet_is_not_there(tmp_path: Path) -> None:
    assert paths.check_database_path(str(tmp_path / "new.duckdb")) is False
    assert paths.check_database_path(":memory:") is False
    pagedkv_sql.connect(tmp_path / "made.duckdb").close()
    assert paths.check_database_path(str(tmp_path / "made.duckdb")) is True


def test_an_unreadable_database_file_is_named_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Root reads any file: the refusal a user meets on a file of mode 000 is simulated.)"""
    made = tmp_path / "x.duckdb"
    made.write_bytes(b"\0" * 64)

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(paths, "open", refused, raising=False)
    with pytest.raises(DatabaseError) as e:
        paths.check_database_path(str(made))
    assert str(e.value) == f"cannot open {made}: Permission denied"


_STREAMS_PROBE = r"""
import json, os, sys
from pagedkv_sql import paths
saved = {fd: os.dup(fd) for fd in (0, 1, 2)}
names = ("stdin", "stdout", "stderr")
originals = [getattr(sys, n) for n in names]
found = []
for closed in ([0], [1], [2], [0, 1, 2]):
    for fd in closed:
        os.close(fd)
    paths.reserve_standard_streams()
    seen = {"closed": sorted(paths.CLOSED_STREAMS)}
    for fd, name in enumerate(names):
        stream = getattr(sys, name)
        seen[name] = [
            stream is not originals[fd], stream.fileno(),
            getattr(stream.buffer, "raw", stream.buffer).closefd,
            os.readlink(f"/proc/self/fd/{fd}") == os.devnull,
        ]
    found.append(seen)
    replaced = [getattr(sys, n) for n in names]  # kept alive: a closefd=True would close
    for fd, name in enumerate(names):
        os.dup2(saved[fd], fd)
        setattr(sys, name, originals[fd])
    paths.CLOSED_STREAMS.clear()
with open(sys.argv[1], "w") as out:
    json.dump(found, out)
"""


def test_closed_standard_streams_get_dev_null_each_on_its_own_descriptor(tmp_path: Path) -> None:
    result = tmp_path / "found.json"
    run = subprocess.run(
        [sys.executable, "-c", _STREAMS_PROBE, str(result)],
        input="",  # all three are pipes, not /dev/null, to begin with
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(result.read_text())

    def expected(closed: list[int]) -> dict[str, Any]:
        seen: dict[str, Any] = {"closed": closed}
        for fd, name in enumerate(("stdin", "stdout", "stderr")):
            # a closed one: a new stream on the same descriptor, which it does not own
            seen[name] = [fd in closed, fd, False, fd in closed]
        return seen

    assert found == [expected([0]), expected([1]), expected([2]), expected([0, 1, 2])]


# -- database.py: opening, the schema, the Python API's defaults ----------------------------


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
    from pagedkv_sql.database import _distinct_sorted

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


# -- load.py: what a load reports, its stages, and what it refuses ----------------------------


def _report(report: Any) -> list[tuple[Any, ...]]:
    return [
        (r.relation, r.source, r.mode, r.rows_read, r.duplicates_dropped, r.rows_total)
        for r in report.relations
    ]


def test_a_load_reports_each_relation_read_dropped_and_kept(tmp_path: Path) -> None:
    """Keys out of order but unique, keys repeated with other values, an exact duplicate
    and an empty file: only the exact duplicate is dropped."""
    data = tmp_path / "d"
    data.mkdir()
    (data / "root_table.facts").write_text("2\t20\n1\t10\n")
    (data / "swapped_block.facts").write_text("100\t0\t512\n100\t0\t256\n")
    (data / "block_table_entry.facts").write_text("10\t0\t256\t1\n10\t0\t256\t1\n")
    (data / "virtual_token.facts").write_text("")
    with pagedkv_sql.connect(":memory:") as db:
        report = db.load(data)
        assert _report(report) == [
            ("root_table", str(data / "root_table.facts"), "replaced", 2, 0, 2),
            ("block_table_entry", str(data / "block_table_entry.facts"), "replaced", 2, 1, 1),
            ("virtual_token", str(data / "virtual_token.facts"), "replaced", 0, 0, 0),
            ("swapped_block", str(data / "swapped_block.facts"), "replaced", 2, 0, 2),
        ]
        with pytest.raises(dataclasses.FrozenInstanceError):
            report.relations[0].rows_total = 0  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            report.warnings = []  # type: ignore[misc]
        (data / "swapped_block.facts").unlink()
        report = db.load(data)
        assert _report(report)[3] == ("swapped_block", None, "kept", 0, 0, 2)
        report = db.load(data, empty_missing=True)
        assert _report(report)[3] == ("swapped_block", None, "emptied", 0, 0, 0)
        report = db.load(data / "root_table.facts", append=True)
        assert _report(report) == [
            ("root_table", str(data / "root_table.facts"), "appended", 2, 2, 2)
        ]


def test_a_load_tells_its_stages_and_looks_closer_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_facts(tmp_path / "d", {"root_table": [(1, 100)]})
    with pagedkv_sql.connect(":memory:") as db:
        stages: list[tuple[str, bool]] = []
        monkeypatch.setattr(
            db, "_begin_stage", lambda label, measured: stages.append((label, measured))
        )
        read = ("read and check root_table", True)
        for options, expected in [
            ({}, [read, ("diagnostics", False), ("write", False)]),
            ({"diagnostics": False}, [read, ("write", False)]),
            (
                {"diagnostics": False, "strict": True},
                [read, ("diagnostics", False), ("write", False)],
            ),
        ]:
            stages.clear()
            db.load(data, **options)
            assert stages == expected, options
        (data / "root_table.facts").write_text("1\tx\n")
        stages.clear()
        with pytest.raises(InputError):
            db.load(data)
        assert stages == [read, ("find what was refused", False)]
        assert db.stage() is None


def _trtllm(rows: list[list[int | None]], lengths: list[int]) -> Any:
    """A TensorRT-LLM snapshot of one pool (16 tokens a block, 2 layers): each row a
    request's primary blocks, None for a placeholder."""
    from pagedkv_sql.engines import trtllm

    offsets = np.zeros((1, len(rows), 2, 4), dtype=np.int32)
    for r, blocks in enumerate(rows):
        for b, block in enumerate(blocks):
            k = -1 if block is None else block * 2 * 2
            offsets[0, r, 0, b], offsets[0, r, 1, b] = k, -1 if block is None else k + 1
    ids = [f"req{i}" for i in range(len(rows))]
    return trtllm.snapshot(offsets, np.array(lengths, np.int32), 16, 2, request_ids=ids)


def test_an_import_warns_by_default_and_a_replacing_load_empties_its_engine_tables() -> None:
    engine_rows = "SELECT count(*) FROM engine_block_table"
    with pagedkv_sql.connect(":memory:") as db:
        report = db.load_engine(_trtllm([[1, None]], [20]))  # a placeholder: a page fault
        assert [(w.name, w.count) for w in report.warnings] == [("diag_unresolved_token", 4)]
        held = db.sql(engine_rows).fetchall()
        assert held != [(0,)]
        db.load(DATA / "root_table.facts", append=True)
        assert db.sql(engine_rows).fetchall() == held
        db.load(DATA / "root_table.facts")
        assert db.sql(engine_rows).fetchall() == [(0,)]


def test_io_failures_are_told_apart_from_refused_data() -> None:
    from pagedkv_sql.load import _is_io

    assert _is_io(duckdb.IOException("could not write"))
    assert _is_io(duckdb.OutOfMemoryException("out of memory"))
    assert _is_io(duckdb.TransactionException("Failed to commit: could not write the WAL"))
    assert _is_io(duckdb.Error("write failed: No space left on device"))
    assert not _is_io(duckdb.ConstraintException("CHECK constraint failed"))
    assert not _is_io(duckdb.ConversionException("Could not convert string 'x' to INT64"))


def test_problems_of_several_files_are_capped_at_a_thousand_and_all_counted(
    tmp_path: Path,
) -> None:
    for name in ("root_table", "swapped_block"):
        (tmp_path / f"{name}.facts").write_text("x\n" * 600)
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(tmp_path)
    assert (len(e.value.problems), e.value.total) == (1000, 1200)


def test_a_load_locates_ten_thousand_violations_and_counts_all(tmp_path: Path) -> None:
    bte = tmp_path / "block_table_entry.facts"
    bte.write_text("".join(f"1\t{i}\t{i * 256 + 1}\t1\n" for i in range(10_001)))
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(ConstraintError) as e:
        db.load(bte)
    assert (len(e.value.violations), e.value.total) == (10_000, 10_001)


def _reader(relation: str, rows: list[tuple[int, ...]]) -> pa.RecordBatchReader:
    table = arrow_table(relation, rows)
    return pa.RecordBatchReader.from_batches(table.schema, table.to_batches())


def test_a_violation_in_a_file_loaded_after_a_stream_is_located(tmp_path: Path) -> None:
    """A stream (read once) is checked as it is staged; the files after it are still
    staged and checked when the load is refused, and their offending lines named."""
    from pagedkv_sql.load import load_sources

    bte = tmp_path / "block_table_entry.facts"
    bte.write_text("1\t0\t256\t1\n1\t1\t257\t1\n")
    with pagedkv_sql.connect(":memory:") as db:
        cur = db.con.cursor()
        given = [
            sources.arrow_source("root_table", _reader("root_table", [(1, 1)]), "<reader>"),
            *sources.discover([str(bte)], None, None, None).sources,
        ]
        with pytest.raises(ConstraintError) as e:
            load_sources(cur, given, append=False, strict=False, diagnostics=True)
        cur.close()
    assert e.value.total == 1
    assert [(v.relation, v.locations) for v in e.value.violations] == [
        ("block_table_entry", (f"{bte}:2",))
    ]


def test_load_sources_leaves_no_staging_table_on_its_connection() -> None:
    from pagedkv_sql.load import load_sources

    with pagedkv_sql.connect(":memory:") as db:
        cur = db.con.cursor()
        reader = _reader("root_table", [(1, 100)])
        load_sources(
            cur,
            [sources.arrow_source("root_table", reader, "<reader>")],
            append=False,
            strict=False,
            diagnostics=True,
        )
        left = "SELECT count(*) FROM duckdb_tables() WHERE table_name LIKE '_pagedkv%'"
        assert cur.execute(left).fetchall() == [(0,)]
        assert cur.execute("SELECT * FROM root_table").fetchall() == [(1, 100)]
        cur.close()


def test_an_output_is_nameless_while_written_and_gets_the_usual_mode(tmp_path: Path) -> None:
    """Nothing of a write in progress shows in the directory (a SIGKILL then leaves
    nothing behind); the finished file has mode 0o666 less the umask, like any new file."""
    target = tmp_path / "out.csv"
    old = os.umask(0o022)
    try:
        with paths.atomic_output(target) as f:
            f.write(b"x\n")
            assert list(tmp_path.iterdir()) == []
    finally:
        os.umask(old)
    assert target.read_bytes() == b"x\n"
    assert target.stat().st_mode & 0o777 == 0o644


def test_a_database_path_through_a_file_is_named_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    inside = tmp_path / "file" / "x.duckdb"
    with pytest.raises(DatabaseError) as e:
        pagedkv_sql.connect(inside)
    assert str(e.value) == f"cannot open {inside}: Not a directory"


def test_the_sweep_does_not_follow_a_symlink_named_like_a_spill_directory(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")
    (tmp_path / f"x.duckdb.{dead.pid}.tmp").symlink_to(target)
    assert spill.sweep(str(tmp_path / f"x.duckdb.{os.getpid()}.tmp")) == []
    assert (target / "keep").exists()


def test_a_given_temp_directory_replaces_the_own_one(tmp_path: Path) -> None:
    mine = str(tmp_path / "spill")
    with pagedkv_sql.connect(config={"temp_directory": mine}) as db:
        assert db.sql("SELECT current_setting('temp_directory')").fetchall() == [(mine,)]
    with pagedkv_sql.connect() as db:
        (temp,) = db.sql("SELECT current_setting('temp_directory')").fetchall()[0]
        assert Path(temp).name.startswith(f"pagedkv-{os.getpid()}-")


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


def test_a_source_that_switches_to_its_fallback_reader_is_loaded_by_a_second_attempt() -> None:
    """The load's side of a switch (sources.py decides when DuckDB's reader refuses what
    our grammar accepts): the first attempt is rolled back and the whole load runs again."""
    from pagedkv_sql.load import load_sources

    @dataclasses.dataclass
    class Switching(sources.Source):
        diagnosed: int = 0

        def scan_sql(self, con: duckdb.DuckDBPyConnection) -> str:
            if self.fallback:
                return "SELECT 1::BIGINT AS seq_id, 100::BIGINT AS block_table_ptr"
            return "SELECT error('the bulk reader refused it')::BIGINT AS seq_id, 1 AS p"

        def diagnose(self, con: duckdb.DuckDBPyConnection) -> tuple[int, list[Problem]]:
            self.diagnosed += 1
            self.fallback = True
            return 0, []

    with pagedkv_sql.connect(":memory:") as db:
        cur = db.con.cursor()
        source = Switching("root_table", "<switching>")
        report = load_sources(cur, [source], append=False, strict=False, diagnostics=True)
        assert [(r.relation, r.rows_read) for r in report.relations] == [("root_table", 1)]
        assert source.diagnosed == 1
        assert cur.execute("SELECT * FROM root_table").fetchall() == [(1, 100)]
        cur.close()


def test_a_file_the_bulk_reader_refuses_and_the_grammar_takes_switches_to_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("1\t100\n")
    (source,) = sources.discover([str(f)], None, None, None).sources
    refused = (1, [Problem(str(f), None, None, "DuckDB refused it")])
    monkeypatch.setattr(sources.Source, "diagnose", lambda self, con: refused)
    with pagedkv_sql.connect(":memory:") as db, caplog.at_level(logging.WARNING):
        assert source.diagnose(db.con) == (0, [])
    assert source.fallback is True
    assert "the bulk reader refused it; reading it in Python" in caplog.text
    source.close()


def test_a_failed_rename_leaves_no_part_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out.csv"

    def refused(src: str, dst: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "replace", refused)
    with pytest.raises(PagedKVError) as e, paths.atomic_output(target) as f:
        f.write(b"x\n")
    assert str(e.value) == f"cannot write {target}: Permission denied"
    assert list(tmp_path.iterdir()) == []


def test_a_database_in_a_directory_that_is_not_there_is_refused_cleanly(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "x.duckdb"
    with pytest.raises(DatabaseError, match=rf"^cannot open {re.escape(str(missing))}: "):
        pagedkv_sql.connect(missing)
    assert list(tmp_path.iterdir()) == []


# -- textscan.py, sources.py: every line after a bad one is still read ----------------------


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


def test_a_load_leaves_no_descriptor_open(tmp_path: Path) -> None:
    data = write_facts(tmp_path / "d", {"root_table": [(1, 100)], "virtual_token": [(1, 0, 0, 0)]})
    with pagedkv_sql.connect(":memory:") as db:
        db.load(data)  # the first load opens what stays open (DuckDB's own files)
        before = sorted(os.listdir("/proc/self/fd"))
        db.load(data)
        with pytest.raises(InputError):
            db.load(
                write_facts(tmp_path / "bad", {"root_table": [(1, 100)]}, "csv") / "root_table.csv",
                format="facts",
            )
        assert sorted(os.listdir("/proc/self/fd")) == before


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


_SILENCE_PROBE = r"""
import os, sys
from pagedkv_sql import paths
paths.silence_stdout()
print(os.readlink("/proc/self/fd/1") == os.devnull, os.readlink("/proc/self/fd/2") == os.devnull,
      file=sys.stderr)
"""


def test_a_failed_stdout_is_pointed_at_dev_null_and_stderr_left_alone() -> None:
    run = subprocess.run(
        [sys.executable, "-c", _SILENCE_PROBE], capture_output=True, text=True, check=False
    )
    assert (run.returncode, run.stdout, run.stderr) == (0, "", "True False\n")


# -- the three survivors of the fresh-clone run (30 Nov, 21:18) -------------------------------


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
