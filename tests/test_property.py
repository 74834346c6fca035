"""resolve() against a plain-Python evaluation of the two rules on random facts."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv_sql

from .conftest import arrow_table
from .reference import resolve as reference

small = st.integers(min_value=-3, max_value=3)
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
near_edge = st.sampled_from([2**63 - 1, 2**63 - 200, -(2**63), -(2**63) + 255, 0])
address = st.one_of(INT64, near_edge, st.integers(-4, 4).map(lambda x: x * 256))
aligned = st.one_of(
    st.integers(min_value=-(2**55), max_value=2**55 - 1).map(lambda x: x * 256),
    st.sampled_from([2**63 - 256, -(2**63), 0]),
)

facts = st.fixed_dictionaries(
    {
        "root_table": st.lists(st.tuples(small, small), max_size=6),
        "block_table_entry": st.lists(
            st.tuples(small, small, aligned, st.integers(0, 3)), max_size=8
        ),
        "virtual_token": st.lists(
            st.tuples(small, st.integers(-5, 40), small, st.integers(0, 255)), max_size=12
        ),
        "swapped_block": st.lists(st.tuples(small, small, address), max_size=6),
    }
).map(
    # sprinkle exact duplicates
    lambda f: {k: v + v[: len(v) // 2] for k, v in f.items()}
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(facts)
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
