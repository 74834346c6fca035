"""The number syntax every input format shares, and how numbers are spelled back for
people (``hex_address``, ``megabytes``).

A number is a signed 64-bit integer written as decimal (``-12``, ``+7``, ``007``), ``0x``
hex or ``0b`` binary, each with an optional sign (``-0x10``); nothing else: not ``1.5``,
``1e3``, ``1_000``, an empty field or one with spaces. DuckDB's own VARCHAR to BIGINT cast
accepts (and rounds) several of those, so SQL uses ``strict_bigint_sql`` instead.
"""

from __future__ import annotations

import re

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

DECIMAL = r"[+-]?[0-9]+"
PREFIXED = r"[+-]?(0[xX][0-9a-fA-F]+|0[bB][01]+)"
_NUMBER = re.compile(rf"(?:{DECIMAL}|{PREFIXED})", re.ASCII)
EXPECTED = "expected a signed 64-bit integer (decimal, 0x hex or 0b binary)"


def hex_address(v: int) -> str:
    """An address in hex, a negative one with its sign first: ``0x100``, ``-0x10``."""
    return f"-0x{-v:x}" if v < 0 else f"0x{v:x}"


def megabytes(n: int) -> str:
    """The size of a file written, as the CLI and the report say it: ``1.5 MB`` (MiB)."""
    return f"{n / 2**20:.1f} MB"


class NumberSyntaxError(ValueError):
    pass


SHOWN = 40  # characters of a field quoted in an error; a 10 MB field is not echoed


def shown(text: str) -> str:
    """A field as an error quotes it: whole when short, else its start and its length."""
    if len(text) <= SHOWN:
        return repr(text)
    return f"{text[: SHOWN - 8]!r}... ({len(text):,} characters)"


def parse_number(text: str) -> int:
    """Parse one number strictly, or raise NumberSyntaxError saying why."""
    if not _NUMBER.fullmatch(text):
        if text == "":
            raise NumberSyntaxError(f"empty field; {EXPECTED}")
        raise NumberSyntaxError(f"invalid number {shown(text)}; {EXPECTED}")
    sign = -1 if text[0] == "-" else 1
    digits = text.lstrip("+-")
    base = {"0x": 16, "0X": 16, "0b": 2, "0B": 2}.get(digits[:2], 10)
    if base != 10:
        digits = digits[2:]
    # no int64 needs more than 64 significant digits in any base; Python refuses to
    # convert decimals of more than 4,300 digits at all
    digits = digits.lstrip("0") or "0"
    value = None if len(digits) > 64 else sign * int(digits, base)
    if value is None or not INT64_MIN <= value <= INT64_MAX:
        raise NumberSyntaxError(
            f"number {text if len(text) <= SHOWN else shown(text)} is out of the signed "
            f"64-bit range [{INT64_MIN}, {INT64_MAX}]"
        )
    return value


def strict_bigint_sql(column: str, label: str) -> str:
    """A SQL expression that casts VARCHAR ``column`` to BIGINT under the rules above and
    raises (through ``error()``) on anything else, NULL included.

    Canonical decimals, the bulk of any real file, take the first branch: one cast and one
    string comparison. The rest pay for a regular expression.
    """
    c = f'"{column}"'
    # the magnitude through UBIGINT: DuckDB 1.5 casts 0x/0b text to UBIGINT, not HUGEINT
    unsigned = f"ltrim({c}, '+-')"
    return (
        f"CASE WHEN TRY_CAST({c} AS BIGINT)::VARCHAR = {c} THEN TRY_CAST({c} AS BIGINT) "
        f"WHEN regexp_full_match({c}, '{DECIMAL}|{PREFIXED}') THEN "
        f"CAST((CASE WHEN starts_with({c}, '-') THEN -1 ELSE 1 END) * "
        f"CAST(CAST({unsigned} AS UBIGINT) AS HUGEINT) AS BIGINT) "
        f"ELSE error('pagedkv: bad number in {label}') END"
    )
