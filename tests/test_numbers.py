"""numbers.py: parsing the numbers of the input formats, and how a field is quoted in a message."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pagedkv_sql
from pagedkv_sql.errors import InputError
from pagedkv_sql.numbers import NumberSyntaxError, parse_number, shown

from .helpers import state, table_rows

INT64_MIN = -(2**63)


def test_a_field_is_quoted_whole_up_to_forty_characters_then_cut_to_thirty_two() -> None:
    assert shown("7" * 40) == repr("7" * 40)
    assert shown("7" * 41) == repr("7" * 32) + "... (41 characters)"
    assert shown("x" * 12_345) == repr("x" * 32) + "... (12,345 characters)"


def test_an_out_of_range_number_of_forty_characters_is_named_as_written() -> None:
    text = "-" + "9" * 39
    with pytest.raises(NumberSyntaxError) as e:
        parse_number(text)
    assert str(e.value).startswith(f"number {text} is out of the signed 64-bit range")
    longer = "9" * 41
    with pytest.raises(NumberSyntaxError) as e:
        parse_number(longer)
    assert str(e.value).startswith(f"number {shown(longer)} is out of the signed")


def test_the_smallest_int64_in_binary_has_sixty_four_digits_and_loads() -> None:
    assert parse_number("-0b1" + "0" * 63) == INT64_MIN
    assert parse_number("-0b" + "0" * 100 + "1" + "0" * 63) == INT64_MIN
    with pytest.raises(NumberSyntaxError):
        parse_number("0b1" + "0" * 63)


def test_the_smallest_int64_loads_through_the_python_number_reader(tmp_path: Path) -> None:
    """A .dl file, and a text file DuckDB's reader refuses (mixed line endings), are read
    by the Python number reader."""
    dl = tmp_path / "facts.dl"
    dl.write_text(f"root_table({INT64_MIN}, 1).\n")
    mixed = tmp_path / "root_table.facts"
    mixed.write_bytes(f"\n{INT64_MIN}\t1\r\n2\t{INT64_MIN}\r\n".encode())
    with pagedkv_sql.connect(":memory:") as db:
        db.load(dl)
        assert table_rows(db.sql("SELECT * FROM root_table").to_arrow_table()) == [(INT64_MIN, 1)]
        db.load(mixed)
        assert sorted(table_rows(db.sql("SELECT * FROM root_table").to_arrow_table())) == [
            (INT64_MIN, 1),
            (2, INT64_MIN),
        ]
        one_below = tmp_path / "below.dl"
        one_below.write_text(f"root_table({INT64_MIN - 1}, 1).\n")
        with pytest.raises(InputError):
            db.load(one_below)


@pytest.mark.parametrize("kind", ["dl", "fallback"])
def test_the_python_number_reader_takes_every_spelling_to_the_int64_bounds(
    tmp_path: Path, kind: str
) -> None:
    """The Python reader (a .dl file; a text file DuckDB's reader refuses) reads hex,
    binary and signs as the bulk reader does, up to both ends of the signed 64-bit range."""
    pairs = [
        ("0x7fffffffffffffff", "-0x8000000000000000"),
        ("9223372036854775807", "0X1f"),
        ("0b101", "-0B11"),
        ("+0x10", "-7"),
    ]
    expected = [(2**63 - 1, INT64_MIN), (2**63 - 1, 31), (5, -3), (16, -7)]

    def write(rows: list[tuple[str, str]]) -> Path:
        if kind == "dl":
            f = tmp_path / "facts.dl"
            f.write_text("".join(f"root_table({a}, {b}).\n" for a, b in rows))
        else:
            f = tmp_path / "root_table.facts"
            f.write_bytes(b"\n" + b"".join(f"{a}\t{b}\r\n".encode() for a, b in rows))
        return f

    with pagedkv_sql.connect(":memory:") as db:
        db.load(write(pairs))
        assert sorted(table_rows(db.sql("SELECT * FROM root_table").to_arrow_table())) == sorted(
            expected
        )
        for beyond in ("9223372036854775808", "0x8000000000000000", "-0x8000000000000001"):
            with pytest.raises(InputError):
                db.load(write([("1", beyond)]))
        assert sorted(table_rows(db.sql("SELECT * FROM root_table").to_arrow_table())) == sorted(
            expected
        )


def test_number_syntax(tmp_path: Path) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("0x10\t-0x10\n0b101\t+7\n007\t-9223372036854775808\n")
    with pagedkv_sql.connect(":memory:") as db:
        db.load(f)
        assert state(db)["root_table"] == [(5, 7), (7, -(2**63)), (16, -16)]


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
