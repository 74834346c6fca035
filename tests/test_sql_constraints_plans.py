"""The fast plans of sql/constraints.sql return exactly what the plain definitions in
tests/plain_checks.sql return, on random facts with every defect the checks look for, and
on tables given exact duplicate rows from SQL (as an INSERT in the DuckDB shell would)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv_sql
from pagedkv_sql.check import run_checks

from .helpers import arrow_table, check_facts

PLAIN = Path(__file__).with_name("plain_checks.sql").read_text()


def plain_checks() -> dict[str, str]:
    parts = re.split(r"^-- name: (\w+)\n", PLAIN, flags=re.M)
    return {
        name: body.strip().rstrip(";") for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def test_every_diagnostic_has_a_plain_definition() -> None:
    from pagedkv_sql.check import all_checks

    diagnostics = {c.name for c in all_checks() if c.severity == "warning"}
    assert set(plain_checks()) == diagnostics


def arranged(f: dict[str, list[tuple[int, ...]]], arrangement: str) -> dict[str, list]:
    """The facts as drawn, sorted, or sorted with one row per key of the block relations
    (the order and uniqueness the check runner's key proof looks for)."""
    if arrangement == "as drawn":
        return f
    out = {relation: sorted(rows) for relation, rows in f.items()}
    if arrangement == "sorted, unique keys":
        for relation in ("block_table_entry", "swapped_block"):
            first: dict[tuple[int, ...], tuple[int, ...]] = {}
            for row in out[relation]:
                first.setdefault(row[:2], row)
            out[relation] = sorted(first.values())
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    check_facts,
    st.sampled_from([16, 4]),
    st.integers(0, 3),
    st.sampled_from(["as drawn", "sorted", "sorted, unique keys"]),
)
def test_fast_plans_match_the_plain_definitions(
    f: dict[str, list[tuple[int, ...]]], block_size: int, shell_duplicates: int, arrangement: str
) -> None:
    with pagedkv_sql.connect(":memory:") as db:
        db.sql(f"UPDATE pagedkv_settings SET value = {block_size} WHERE name = 'block_size'")
        for relation, rows in arranged(f, arrangement).items():
            db.load_arrow(relation, arrow_table(relation, rows), diagnostics=False)
            db.sql(f"INSERT INTO {relation} SELECT * FROM {relation} LIMIT {shell_duplicates}")
            db.con.execute(
                f"CREATE TEMP VIEW plain_{relation} AS SELECT DISTINCT * FROM {relation}"
            )
        if arrangement == "sorted, unique keys" and shell_duplicates == 0:
            for relation in ("block_table_entry", "swapped_block"):  # the fast plans run
                proof = f"SELECT * FROM pagedkv_block_keys_ascending('{relation}')"
                assert db.con.sql(proof).fetchall() == [(True,)]
        found = {r.name: r for r in run_checks(db.con, block_size=block_size, limit=None)}
        for name, sql in plain_checks().items():
            query = sql.replace("$block_size", str(block_size))
            expected = (
                db.con.sql(f"SELECT DISTINCT * FROM ({query}) ORDER BY ALL")
                .to_arrow_table()
                .to_pylist()
            )
            assert found[name].rows.to_pylist() == expected, name
            assert found[name].count == len(expected), name
            # the view itself (the DuckDB shell's, and Spark's translation of it)
            view = db.con.sql(f"SELECT * FROM {name} ORDER BY ALL").to_arrow_table()
            assert view.to_pylist() == expected, name


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(check_facts)
def test_the_plans_for_proven_unique_keys_match_the_plain_definitions(
    f: dict[str, list[tuple[int, ...]]],
) -> None:
    """The runner proves the block relations' keys unique (sorted, one row a key) and
    takes the plans that skip grouping by key: still the plain answers."""
    names = ("diag_refcount_mismatch", "diag_conflicting_location")
    with pagedkv_sql.connect(":memory:") as db:
        for relation, rows in arranged(f, "sorted, unique keys").items():
            db.load_arrow(relation, arrow_table(relation, rows), diagnostics=False)
            db.con.execute(f"CREATE TEMP VIEW plain_{relation} AS SELECT * FROM {relation}")
        for relation in ("block_table_entry", "swapped_block"):
            proof = f"SELECT * FROM pagedkv_block_keys_ascending('{relation}')"
            assert db.con.sql(proof).fetchall() == [(True,)]
        found = {r.name: r for r in run_checks(db.con, limit=None)}
        for name in names:
            query = f"SELECT DISTINCT * FROM ({plain_checks()[name]}) ORDER BY ALL"
            expected = db.con.sql(query).to_arrow_table().to_pylist()
            assert found[name].rows.to_pylist() == expected, name


@pytest.mark.parametrize(
    ("rows", "ascending"),
    [
        ([], True),
        ([(1, 0, 0, 1)], True),
        ([(1, 0, 0, 1), (1, 1, 256, 1), (2, 0, 512, 1)], True),
        ([(1, 0, 0, 1), (1, 0, 256, 1)], False),  # a key twice
        ([(1, 0, 0, 1), (1, 1, 256, 1), (1, 1, 256, 1)], False),  # a row twice
        ([(1, 1, 256, 1), (1, 0, 0, 1)], False),  # unique but not ascending: no proof
        ([(2, 0, 0, 1), (1, 5, 256, 1)], False),
    ],
)
def test_the_key_proof_holds_only_for_strictly_ascending_keys(
    rows: list[tuple[int, ...]], ascending: bool
) -> None:
    with pagedkv_sql.connect(":memory:") as db:
        for row in rows:
            db.con.execute("INSERT INTO block_table_entry VALUES (?, ?, ?, ?)", row)
        proof = "SELECT * FROM pagedkv_block_keys_ascending('block_table_entry')"
        assert db.con.sql(proof).fetchall() == [(ascending,)]
