"""Tests written to kill the survivors of `make mutate` in the readers and generators
(sources, textscan, numbers, datalog, synth, stream, sqlfiles, inspect; docs/mutation.md):
each pins a boundary or a branch the rest of the suite passed through without looking."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql import sources, sqlfiles, textscan
from pagedkv_sql.errors import InputError, Problem
from pagedkv_sql.synth import SynthConfig, synthesize
from pagedkv_sql.textscan import MAX_LINE, LongLine

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
