"""The fast plans of sql/constraints.sql return exactly what the plain definitions in
tests/plain_checks.sql return, on random facts with every defect the checks look for, and
on tables given exact duplicate rows from SQL (as an INSERT in the DuckDB shell would)."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv_sql
from pagedkv_sql.check import run_checks

from .conftest import arrow_table

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


small = st.integers(min_value=0, max_value=3)
facts = st.fixed_dictionaries(
    {
        "root_table": st.lists(st.tuples(small, st.integers(10, 13)), max_size=6),
        "block_table_entry": st.lists(
            st.tuples(st.integers(10, 14), small, st.integers(0, 5).map(lambda x: x * 256), small),
            max_size=10,
        ),
        "virtual_token": st.lists(
            st.tuples(small, st.integers(0, 40), small, st.integers(0, 20)), max_size=16
        ),
        "swapped_block": st.lists(
            st.tuples(st.integers(10, 14), small, st.integers(0, 40).map(lambda x: x * 64)),
            max_size=6,
        ),
    }
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(facts, st.sampled_from([16, 4]), st.integers(0, 3))
def test_fast_plans_match_the_plain_definitions(
    f: dict[str, list[tuple[int, ...]]], block_size: int, shell_duplicates: int
) -> None:
    with pagedkv_sql.connect(":memory:") as db:
        for relation, rows in f.items():
            db.load_arrow(relation, arrow_table(relation, rows), diagnostics=False)
            db.sql(f"INSERT INTO {relation} SELECT * FROM {relation} LIMIT {shell_duplicates}")
            db.con.execute(
                f"CREATE TEMP VIEW plain_{relation} AS SELECT DISTINCT * FROM {relation}"
            )
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
