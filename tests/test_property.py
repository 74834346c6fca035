"""resolve() against a plain-Python evaluation of the two rules on random facts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv_sql
from pagedkv_sql import ConstraintError, InputError

from .helpers import DATA, arrow_table, resolve_facts
from .reference import resolve as reference


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(resolve_facts)
def test_resolve_matches_the_reference(f: dict[str, list[tuple[int, ...]]]) -> None:
    expected = reference(
        f["root_table"], f["block_table_entry"], f["virtual_token"], f["swapped_block"]
    )
    with pagedkv_sql.connect(":memory:") as db:
        for relation, rows in f.items():
            db.load_arrow(relation, arrow_table(relation, rows), diagnostics=False)
        got = [tuple(r.values()) for r in db.resolve().read_all().to_pylist()]
        assert got == expected
        view = db.sql("SELECT * FROM resolved_kv_address ORDER BY ALL").to_arrow_table().to_pylist()
        assert [tuple(r.values()) for r in view] == expected
        for relation, rows in f.items():
            stored = db.sql(f"SELECT * FROM {relation} ORDER BY ALL").to_arrow_table().to_pylist()
            assert [tuple(r.values()) for r in stored] == sorted(set(rows))


NUMBER = re.compile(r"[+-]?([0-9]+|0[xX][0-9a-fA-F]+|0[bB][01]+)")
VALID = "1\t0\t0\t0\n1\t15\t0\t15\n2\t16\t1\t0\n1\t32\t2\t255\n"


def reference_parse(data: bytes) -> list[tuple[int, ...]] | None:
    """An independent reading of a virtual_token.facts file: None means 'must be refused'."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    rows = set()
    for line in re.split(r"\r\n|\r|\n", text):
        if line == "":
            continue
        fields = line.split("\t")
        if len(fields) != 4 or not all(NUMBER.fullmatch(f) for f in fields):
            return None
        values = []
        for f in fields:
            sign = -1 if f.startswith("-") else 1
            body = f.lstrip("+-")
            base = 16 if body[:2].lower() == "0x" else 2 if body[:2].lower() == "0b" else 10
            values.append(sign * int(body[2:] if base != 10 else body, base))
        if not all(-(2**63) <= v < 2**63 for v in values):
            return None
        if not 0 <= values[3] < 256:
            return None
        rows.add(tuple(values))
    return sorted(rows)


odd_numbers = st.sampled_from(
    [
        "1.5",
        "1e3",
        "",
        " 1",
        "0x",
        "0b2",
        "-0x10",
        "+7",
        "007",
        "9223372036854775808",
        "-9223372036854775808",
        "0xFF",
        "NaN",
        "\uff11",
        "1_0",
        "\x00",
        '"1"',
        "256",
        "-1",
        # spelled with plain bytes only, so the file takes DuckDB's typed reader
        "+-1",
        "--1",
        "1-2",
        "-",
        "+",
        "-0",
        "00",
        "-9223372036854775809",
        "99999999999999999999",
    ]
)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    lines = [line.split("\t") for line in VALID.splitlines()]
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(["number", "swap", "arity", "drop"]))
        if kind == "number" and lines[i]:
            lines[i][draw(st.integers(0, len(lines[i]) - 1))] = draw(odd_numbers)
        elif kind == "swap" and len(lines[i]) > 1:
            lines[i][0], lines[i][-1] = lines[i][-1], lines[i][0]
        elif kind == "arity":
            lines[i] = lines[i][:-1] if draw(st.booleans()) else [*lines[i], "7"]
        elif kind == "drop":
            lines[i] = []
    ending = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    data = ending.join("\t".join(f) for f in lines).encode() + ending.encode()
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    if draw(st.booleans()):
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=3)) + data[at:]
    return data


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=mutated())
def test_fuzzed_fact_files(tmp_path: Path, data: bytes) -> None:
    f = tmp_path / "virtual_token.facts"
    f.write_bytes(data)
    expected = reference_parse(data)
    with pagedkv_sql.connect(":memory:") as db:
        db.load(DATA, diagnostics=False)
        before = db.sql("SELECT * FROM virtual_token ORDER BY ALL").to_arrow_table().to_pylist()
        if expected is None:
            with pytest.raises((InputError, ConstraintError)):
                db.load(f, diagnostics=False)
            assert (
                db.sql("SELECT * FROM virtual_token ORDER BY ALL").to_arrow_table().to_pylist()
                == before
            )
        else:
            db.load(f, diagnostics=False)
            got = db.sql("SELECT * FROM virtual_token ORDER BY ALL").to_arrow_table().to_pylist()
            assert [tuple(r.values()) for r in got] == expected
