"""spark/layout.py: the Parquet layout `export parquet` writes, from a database or its
connection."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq


# one way to plug in: export_parquet takes the Database (through its cursor),
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
