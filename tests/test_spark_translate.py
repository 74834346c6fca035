"""The Spark translation of sql/ without Spark: macro expansion and the partition lift,
written back as DuckDB SQL and held against the views themselves, one case a partition
value (the Spark tier, tests/spark, runs the Spark SQL for real)."""

from __future__ import annotations

import re

import duckdb
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedkv_sql.check import all_checks
from pagedkv_sql.relations import INPUT_RELATIONS
from pagedkv_sql.spark.translate import TranslationError, spark_views, translate

from .helpers import arrow_table, check_facts
from .spark.helpers import duckdb_answers, rows_of

Facts = dict[str, list[tuple[int, ...]]]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(check_facts, min_size=1, max_size=6), st.sampled_from([16, 4]))
def test_the_lifted_views_give_each_partition_its_own_answer(
    cases: list[Facts], block_size: int
) -> None:
    con = duckdb.connect()
    for relation, columns in INPUT_RELATIONS.items():
        cols = ", ".join(f"{c} BIGINT" for c in columns)
        con.execute(f"CREATE TABLE {relation} (replica VARCHAR, {cols})")
        for i, case in enumerate(cases):
            staged = arrow_table(relation, case[relation])  # noqa: F841 (scanned by name)
            con.execute(f"INSERT INTO {relation} SELECT '{i}', * FROM staged")
            # exact duplicates, as a file or a shell INSERT may hold them
            con.execute(f"INSERT INTO {relation} SELECT '{i}', * FROM staged LIMIT 2")
    con.execute("CREATE TABLE pagedkv_settings (name VARCHAR, value BIGINT)")
    con.execute(f"INSERT INTO pagedkv_settings VALUES ('block_size', {block_size})")
    for view in spark_views("replica", dialect="duckdb"):
        con.execute(f"CREATE VIEW {view.name} AS {view.sql}")
    lifted = {}
    for check in [*all_checks()]:
        table = con.sql(f"SELECT * FROM {check.name}").to_arrow_table()
        lifted[check.name] = table
    resolved = con.sql("SELECT * FROM resolved_kv_address").to_arrow_table()
    for i, case in enumerate(cases):
        for name, rows in duckdb_answers(case, block_size).items():
            table = resolved if name == "resolved_kv_address" else lifted[name]
            mine = table.filter(pc.equal(table["replica"], str(i))).drop_columns("replica")
            assert rows_of(mine) == rows, (name, i)


def test_every_view_translates_to_spark_without_duckdb_only_constructs() -> None:
    for partition_by in (None, "replica"):
        views = spark_views(partition_by)
        assert {v.name for v in views} >= {c.name for c in all_checks()}
        for view in views:
            text = view.sql.upper()
            for duckdb_only in ("INT128", "HUGEINT", "QUERY_TABLE", "::"):
                assert duckdb_only not in text, (view.name, duckdb_only)
            assert not re.search(r"PAGEDKV_\w+\(", text), view.name  # a macro call


def test_the_lift_refuses_what_it_does_not_know() -> None:
    with pytest.raises(TranslationError, match="join without USING or ON"):
        translate("SELECT * FROM root_table CROSS JOIN virtual_token", partition_by="replica")
    with pytest.raises(TranslationError, match="unknown relation"):
        translate("SELECT * FROM somewhere_else", partition_by="replica")
    assert "replica" not in translate("SELECT seq_id FROM root_table")
