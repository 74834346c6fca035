"""cli/spark.py in the main tier: `export parquet` writes the layout the Spark tier reads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from pagedkv_sql.relations import INPUT_RELATIONS

from .helpers import snapshot


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


def test_db_before_or_after_the_name_is_refused_saying_spark_reads_parquet(
    cli: Callable[..., object],
) -> None:
    for args in (
        ["spark", "resolve", "-i", "in", "-o", "out", "--db", "x.duckdb"],
        ["--db", "x.duckdb", "spark", "check", "-i", "in"],
    ):
        result = cli(*args)
        assert result.exit_code == 2  # type: ignore[attr-defined]
        command = " ".join(args[args.index("spark") : args.index("spark") + 2])
        assert result.stderr.splitlines() == [  # type: ignore[attr-defined]
            f"Error: {command} uses no database (--db x.duckdb)",
            "Fix: drop --db: Spark reads Parquet (--input); to take a database there, export "
            "it first: `pagedkv-sql export parquet --db DB DIR`, then `--input DIR`",
        ]
    assert list(Path(cli.cwd).iterdir()) == []
