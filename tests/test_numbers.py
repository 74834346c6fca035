"""numbers.py: parsing the numbers of the input formats, and how a field is quoted in a message."""

from __future__ import annotations

import pytest

from pagedkv_sql.numbers import NumberSyntaxError, parse_number, shown

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
