"""The Spark translation of sql/ without Spark: macro expansion and the partition lift,
written back as DuckDB SQL and held against the views themselves, one case a partition
value (the Spark tier, tests/spark, runs the Spark SQL for real)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import duckdb
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedkv_sql.check import all_checks
from pagedkv_sql.relations import INPUT_RELATIONS
from pagedkv_sql.spark.translate import TranslationError, spark_views, translate

from .conftest import arrow_table, snapshot
from .spark.conftest import duckdb_answers, rows_of
from .test_plans import facts

Facts = dict[str, list[tuple[int, ...]]]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(facts, min_size=1, max_size=6), st.sampled_from([16, 4]))
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


def test_export_parquet_writes_the_spark_layout(
    cli: Callable[..., object], seed_dir: Path, tmp_path: Path
) -> None:
    db = str(tmp_path / "a.duckdb")
    assert cli("load", str(seed_dir), "--db", db).exit_code == 0  # type: ignore[attr-defined]
    out = tmp_path / "fleet"
    for value in ("1", "2"):
        result = cli("export", "parquet", str(out), "--db", db, "--partition", f"replica={value}")
        assert result.exit_code == 0, result.output  # type: ignore[attr-defined]
    stored = snapshot(db)
    for relation in INPUT_RELATIONS:
        for value in ("1", "2"):
            table = pq.read_table(out / relation / f"replica={value}" / "data.parquet")
            assert table.schema.names == list(INPUT_RELATIONS[relation])
            assert sorted(tuple(r.values()) for r in table.to_pylist()) == stored[relation]
    settings_table = pq.read_table(out / "pagedkv_settings" / "replica=1" / "data.parquet")
    assert ("block_size", 16) in [tuple(r.values()) for r in settings_table.to_pylist()]
    # nothing is replaced unless asked
    again = cli("export", "parquet", str(out), "--db", db, "--partition", "replica=1")
    assert again.exit_code == 2  # type: ignore[attr-defined]
    assert "already holds data" in again.output  # type: ignore[attr-defined]
    assert "--overwrite" in again.output  # type: ignore[attr-defined]
    bad = cli("export", "parquet", str(out), "--db", db, "--partition", "replica=a/b")
    assert bad.exit_code == 2 and "partition value 'a/b'" in bad.output  # type: ignore[attr-defined]


def test_spark_commands_without_the_extra_say_how_to_install_it(
    cli: Callable[..., object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    session = importlib.import_module("pagedkv_sql.spark.session")
    monkeypatch.setattr(session, "_importable", lambda module: module != "pyspark")
    result = cli("spark", "resolve", "-i", str(tmp_path), "-o", str(tmp_path / "out"))
    assert result.exit_code == 1  # type: ignore[attr-defined]
    assert "Error: pyspark not installed" in result.output  # type: ignore[attr-defined]
    assert "pip install 'pagedkv-sql[spark]'" in result.output  # type: ignore[attr-defined]


def test_the_core_never_imports_the_spark_package() -> None:
    import subprocess
    import sys

    code = (
        "import sys, pagedkv_sql, pagedkv_sql.database, pagedkv_sql.check; "
        "print(sorted(m for m in sys.modules if m.startswith(('pagedkv_sql.spark', 'pyspark', "
        "'sqlglot'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# issue 24 (one way to plug in): export_parquet takes the Database (through its cursor),
# in memory as a notebook opens it or read-only as the CLI does
def test_export_parquet_takes_the_database_in_memory_or_read_only(
    seed_dir: Path, tmp_path: Path
) -> None:
    import pagedkv_sql
    from pagedkv_sql.spark.layout import export_parquet

    with pagedkv_sql.connect(":memory:") as db:
        db.load(str(seed_dir))
        by_db = export_parquet(db, tmp_path / "a", ("replica", "1"))
    with pagedkv_sql.connect(tmp_path / "kv.duckdb") as db:
        db.load(str(seed_dir))
    with pagedkv_sql.connect(tmp_path / "kv.duckdb", read_only=True) as db:
        by_file = export_parquet(db, tmp_path / "b", ("replica", "1"))
    assert [p.relative_to(tmp_path / "a") for p in by_db] == [
        p.relative_to(tmp_path / "b") for p in by_file
    ]
    for a, b in zip(by_db, by_file, strict=True):
        assert pq.read_table(a).equals(pq.read_table(b))
