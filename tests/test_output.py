"""output.py: the text table, CSV and JSON writers and the address format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedkv_sql.output import hex_or_int, write_table

from .helpers import table_text


def test_addresses_print_in_hex_with_a_sign_only_below_zero() -> None:
    assert [hex_or_int(v) for v in (0, 255, -1)] == ["0 (0x0)", "255 (0xff)", "-1 (-0x1)"]


def test_a_table_whose_every_integer_column_holds_a_null_shows_each_null() -> None:
    """Integer columns without nulls take numpy's layout; here every column has a null,
    so none may: each null is '-'."""
    import io

    from pagedkv_sql import output

    rows = pa.table(
        {"seq_id": pa.array([None, 2], pa.int64()), "token_pos": pa.array([5, None], pa.int64())}
    )
    out = io.BytesIO()
    output.write_table(rows, "table", out)
    assert out.getvalue().decode() == (
        "seq_id  token_pos\n     -          5\n     2          -\n(2 rows)\n"
    )


def test_a_plain_table_right_aligns_numbers_only_and_fits_its_widest_cell() -> None:
    from pagedkv_sql.output import text_table

    assert text_table(["name", "n", "ok"], [["a", 1, True], ["bbbbbb", 12345, None]]) == (
        "name    n      ok\na           1  True\nbbbbbb  12345  -"
    )
    for ragged in ([1, 2], []):  # a row must have a cell for every column
        with pytest.raises(ValueError):
            text_table(["a"], [ragged])


def test_a_table_column_is_as_wide_as_its_widest_cell_or_header() -> None:
    """An all-null integer column is one '-' wide, a string or list column as wide as its
    longest cell; lists print as DuckDB prints them, a null as '-'."""
    t = pa.table(
        {
            "n": pa.array([None, None], pa.int64()),
            "s": ["abcdef", None],
            "l": [[1, 2], None],
            "b": [True, None],
            "f": [1.5, None],
            "d": [5, 7],
        }
    )
    assert table_text(*t.to_batches()) == (
        "n       s       l     b    f  d\n"
        "-  abcdef  [1, 2]  True  1.5  5\n"
        "-       -       -     -    -  7\n"
        "(2 rows)\n"
    )


_BETWEEN = {
    "table": "seq_id\n     1\n     2\n(2 rows)\n",
    "json": '[\n\t{"seq_id":1},\n\t{"seq_id":2}\n]\n',
    "jsonl": '{"seq_id":1}\n{"seq_id":2}\n',
    "csv": "seq_id\n1\n2\n",
    "facts": "1\n2\n",
}


@pytest.mark.parametrize("fmt", ["table", "json", "jsonl", "csv", "facts", "arrow", "parquet"])
def test_an_empty_batch_between_two_is_skipped_and_the_rows_counted(fmt: str) -> None:
    import io

    import pyarrow.parquet as pq

    from pagedkv_sql.output import write_batches

    schema = pa.schema([("seq_id", pa.int64())])
    batches = [pa.record_batch([pa.array(v, pa.int64())], schema=schema) for v in ([1], [], [2])]
    out = io.BytesIO()
    assert write_batches(pa.RecordBatchReader.from_batches(schema, batches), fmt, out) == 2
    if fmt == "arrow":
        assert pa.ipc.open_file(out.getvalue()).read_all().column(0).to_pylist() == [1, 2]
    elif fmt == "parquet":
        assert pq.read_table(io.BytesIO(out.getvalue())).column(0).to_pylist() == [1, 2]
    else:
        assert out.getvalue().decode() == _BETWEEN[fmt]


def test_mixed_csv_and_json_rows_are_counted_and_an_integer_null_is_null() -> None:
    import io

    from pagedkv_sql.output import write_batches

    t = pa.table({"n": pa.array([None, 3], pa.int64()), "s": ["a,b", None]})
    out = io.BytesIO()
    assert (
        write_batches(pa.RecordBatchReader.from_batches(t.schema, t.to_batches()), "csv", out) == 2
    )
    assert out.getvalue().decode() == 'n,s\n,"a,b"\n3,\n'
    out = io.BytesIO()
    assert (
        write_batches(pa.RecordBatchReader.from_batches(t.schema, t.to_batches()), "jsonl", out)
        == 2
    )
    assert out.getvalue().decode() == '{"n":null,"s":"a,b"}\n{"n":3,"s":null}\n'


def test_a_number_exactly_as_wide_as_its_column_keeps_its_top_digit() -> None:
    t = pa.table({"n": pa.array([1000, 7, -100], pa.int64())})
    assert table_text(*t.to_batches()) == "   n\n1000\n   7\n-100\n(3 rows)\n"


def test_a_sliced_string_array_writes_only_its_own_characters() -> None:
    import io

    from pagedkv_sql.output import _write_strings

    out = io.BytesIO()
    _write_strings(pa.array(["ab", "cd", "ef"]).slice(1, 1), out)
    assert out.getvalue() == b"cd"
    out = io.BytesIO()
    _write_strings(pa.chunked_array([["ab"], ["cd,\n"]]), out, cut=2)
    assert out.getvalue() == b"abcd"


@pytest.mark.parametrize("base", [10, 16])
def test_the_digit_tables_built_afresh_print_every_triple_as_python_does(
    base: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table layout reads digits three at a time from a table built once a process
    (output._TRIPLES): built afresh here, every value of one, two and three digits, and
    some longer ones, print as str() and hex() print them."""
    from pagedkv_sql import output

    monkeypatch.setattr(output, "_TRIPLES", {})
    name = "physical_address" if base == 16 else "token_pos"
    values = [*range(-(base**3), base**3 + 1), 2**63 - 1, -(2**63), base**4 + 5]
    t = pa.table({name: pa.array(values, pa.int64())})
    lines = table_text(*t.to_batches()).splitlines()[1:-1]
    column = -1 if base == 16 else 0
    expected = [f"-0x{-v:x}" if v < 0 else f"0x{v:x}" for v in values] if base == 16 else values
    assert [line.split()[column] for line in lines] == [str(v) for v in expected]


def test_a_table_of_integer_columns_with_nulls_shows_each_null_as_a_dash() -> None:
    """Only integer columns without nulls take the all-numpy layout; nulls go the mixed way."""
    t = pa.table(
        {
            "seq_id": pa.array([1, None], pa.int64()),
            "physical_address": pa.array([None, 4096], pa.int64()),
        }
    )
    # the first batch's address column is all null: its hex column has no value to size
    assert table_text(*t.to_batches(max_chunksize=1)) == (
        "seq_id  physical_address  physical_address (hex)\n"
        "     1                 -                       -\n"
        "     -              4096                  0x1000\n"
        "(2 rows)\n"
    )


def test_table_cells_are_never_cut_and_nulls_show(tmp_path: Path) -> None:
    """Widths come from the first batch; a wider value later widens its column (it was
    cut to the first batch's width), a null is '-' (its whole line was lost), the most
    negative int64 and its hex are whole."""
    import io

    from pagedkv_sql import output

    schema = pa.schema([("seq_id", pa.int64()), ("physical_address", pa.int64())])
    first = pa.record_batch([pa.array([1]), pa.array([256])], schema=schema)
    wider = pa.record_batch([pa.array([12345678901]), pa.array([-(2**63)])], schema=schema)
    out = io.BytesIO()
    output.write_batches(pa.RecordBatchReader.from_batches(schema, [first, wider]), "table", out)
    assert out.getvalue().decode() == (
        "seq_id  physical_address  physical_address (hex)\n"
        "     1               256                   0x100\n"
        "12345678901  -9223372036854775808     -0x8000000000000000\n"
        "(2 rows)\n"
    )
    labelled = pa.schema(
        [("seq_id", pa.int64()), ("request_id", pa.string()), ("physical_address", pa.int64())]
    )
    rows = pa.table([[1, 2], ["req-a", None], [None, 4096]], schema=labelled)
    out = io.BytesIO()
    output.write_table(rows, "table", out)
    assert out.getvalue().decode() == (
        "seq_id  request_id  physical_address  physical_address (hex)\n"
        "     1       req-a                 -                       -\n"
        "     2           -              4096                  0x1000\n"
        "(2 rows)\n"
    )


def test_table_matches_python_formatting_on_random_integers() -> None:
    """The numpy layout of integer cells against str() and hex() of every value."""
    import io
    import random

    from pagedkv_sql import output

    rng = random.Random(7)
    edges = [0, 1, -1, 9, 10, 99, 100, 255, 256, -256, 2**63 - 1, -(2**63)]
    values = edges + [rng.randint(-(2**63), 2**63 - 1) for _ in range(300)]
    values += [rng.randint(-(10**6), 10**6) for _ in range(300)]
    schema = pa.schema([("token_pos", pa.int64()), ("physical_address", pa.int64())])
    table = pa.table([values, values[::-1]], schema=schema)
    out = io.BytesIO()
    output.write_batches(
        pa.RecordBatchReader.from_batches(schema, table.to_batches(max_chunksize=97)), "table", out
    )
    lines = out.getvalue().decode().splitlines()
    assert lines[-1] == f"({len(values)} rows)"
    for line, a, b in zip(lines[1:-1], values, values[::-1], strict=True):
        hexed = f"-0x{-b:x}" if b < 0 else f"0x{b:x}"
        assert line.split() == [str(a), str(b), hexed]


def test_a_table_counts_one_row_and_no_rows_in_words() -> None:
    schema = pa.schema([("seq_id", pa.int64())])
    one = pa.record_batch([pa.array([5], pa.int64())], schema=schema)
    assert table_text(one).endswith("\n(1 row)\n")
    assert table_text(schema=schema) == "seq_id\n(0 rows)\n"


# -- strings from an engine reach a terminal escaped, data formats exact -------------------


HOSTILE = [
    "\x1b]0;owned\x07\x1b[2Jx\n0 error(s), 0 warning(s)",  # OSC title, clear screen, a line
    "\x1b]52;c;ZXZpbA==\x07clip",  # OSC 52: the clipboard
    "cr\roverwrite",
    "del\x7f and c1 \x85\x9b31m",
    "bidi \u202egnp.exe\u202c \u2066x\u2069",
    "line\u2028para\u2029",
    "nul\x00tab\tvt\x0b",
]


@given(st.text())
def test_printable_leaves_nothing_a_terminal_obeys_and_is_idempotent(text: str) -> None:
    from pagedkv_sql.formats import printable

    shown = printable(text)
    assert shown.isprintable()
    assert printable(shown) == shown
    if text.isprintable():
        assert shown == text


def test_the_arrow_column_escaper_agrees_with_printable() -> None:
    from pagedkv_sql.formats import printable
    from pagedkv_sql.output import printable_column

    values = ["plain", "émoji 😀", None, *HOSTILE, "nbsp\xa0", "zw\u200bj"]
    got = printable_column(pa.array(values, pa.string())).to_pylist()
    assert got == [None if v is None else printable(v) for v in values]


def _hostile_db(cli: Any, tmp_path: Path) -> None:
    from pagedkv_sql.engines import flashinfer

    n = len(HOSTILE)
    flashinfer.snapshot(
        np.arange(n + 1, dtype=np.int32),
        np.arange(n, dtype=np.int32) + 1,
        np.full(n, 0, np.int32),  # an empty last page: a finding that names each request
        16,
        request_ids=HOSTILE,
    ).save(tmp_path / "e.npz")
    assert cli("import", "flashinfer", str(tmp_path / "e.npz")).exit_code == 0


@pytest.mark.parametrize(
    "args",
    [
        ["check"],
        ["explain", "0", "0"],
        ["explain", "6", "0"],
        ["resolve", "--format", "table"],
        ["violations", "--format", "table"],
        ["import", "flashinfer", "e.npz"],
    ],
)
def test_text_output_shows_control_characters_escaped(
    cli: Any, tmp_path: Path, args: list[str]
) -> None:
    _hostile_db(cli, tmp_path)
    if args[0] == "import":
        args = [*args[:2], str(tmp_path / "e.npz")]
    r = cli(*args)
    text = r.output
    assert text.isprintable() or set(text) - set(filter(str.isprintable, text)) == {"\n"}
    assert "\x1b" not in text and "\r" not in text and "\u202e" not in text
    assert "\n0 error(s), 0 warning(s)" not in text.replace("0 error(s), 1 warning(s)", "")


def test_a_replay_report_and_an_error_show_request_ids_escaped(cli: Any, tmp_path: Path) -> None:
    rid = "r\x1b[2J\nstep 9: forged"
    log = tmp_path / "l.jsonl"
    steps = [
        {"step": 0, "ops": [{"op": "allocate", "req": rid, "blocks": [1]}]},
        {"step": 1, "ops": [{"op": "free", "req": rid}, {"op": "free", "req": rid}]},
    ]
    log.write_text("".join(json.dumps(s) + "\n" for s in steps))
    for extra in ([], ["--keep-going"]):
        r = cli("replay", str(log), *extra)
        assert r.exit_code == 1
        assert "\x1b" not in r.output and "\nstep 9: forged" not in r.output
        assert "r\\x1b[2J\\nstep 9: forged" in r.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"step": 0, "ops": [{"op": "free", "req": rid}]}) + "\n")
    r = cli("replay", str(bad), "--db", str(tmp_path / "b.duckdb"))
    assert r.exit_code == 1 and r.output.startswith("Error: ")
    assert "\x1b" not in r.output and "\nstep 9: forged" not in r.output


def test_data_formats_keep_the_strings_exact(cli: Any, tmp_path: Path) -> None:
    """check --format json: the request ids of the findings, exactly as the engine gave
    them (JSON's own escapes, parsed back)."""
    _hostile_db(cli, tmp_path)
    r = cli("check", "--format", "json", "--output", str(tmp_path / "c.json"))
    assert r.exit_code == 0, r.output
    text = (tmp_path / "c.json").read_text()
    for rid in HOSTILE:
        assert json.dumps(rid)[1:-1] in text


def test_facts_of_mixed_columns_are_never_quoted() -> None:
    """Soufflé's facts have no quoting: a JSON cell is written as it is (CSV would double
    its quotes), a tab or newline inside a cell escaped; tsv still quotes as CSV does."""
    import io

    table = pa.table(
        {"check": ["x", "y"], "row": [{"a": 1, "b": "q"}, None], "why": ["a\tb", "c\nd"]}
    )
    facts = io.BytesIO()
    write_table(table, "facts", facts)
    assert facts.getvalue().decode() == 'x\t{"a": 1, "b": "q"}\ta\\tb\ny\t\tc\\nd\n'
    tsv = io.BytesIO()
    write_table(table, "tsv", tsv)
    assert tsv.getvalue().decode().splitlines()[1] == 'x\t"{""a"": 1, ""b"": ""q""}"\t"a\tb"'
