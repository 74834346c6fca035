"""sources/arrow.py: Parquet and Arrow IPC files and every kind of Arrow object in, the
same state from each, and a violation located by its row."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import pagedkv_sql
from pagedkv_sql import InputError, sources
from pagedkv_sql.errors import ConstraintError

from .helpers import DATA, ArrowStream, arrow_table, loaded_roots, state

TOKENS = pa.table(
    {
        "seq_id": pa.array([1, 1, 2], pa.int32()),
        "token_pos": pa.array([0, 32, 0], pa.int64()),
        "block_index": pa.array([0, 2, 0], pa.uint16()),
        "offset_in_block": pa.array([0, 0, 0], pa.int8()),
    }
)


def kinds() -> dict[str, Any]:
    out: dict[str, Any] = {
        "table": lambda: TOKENS,
        "record_batch": lambda: TOKENS.to_batches()[0],
        "reader": lambda: pa.RecordBatchReader.from_batches(TOKENS.schema, TOKENS.to_batches()),
        "dataset": lambda: ds.dataset(TOKENS),
        "duckdb_relation": lambda: duckdb.connect().sql(
            "SELECT * FROM (VALUES (1, 0, 0, 0), (1, 32, 2, 0), (2, 0, 0, 0)) "
            "t(seq_id, token_pos, block_index, offset_in_block)"
        ),
    }
    try:
        import polars as pl

        out["polars"] = lambda: pl.from_arrow(TOKENS)
    except ImportError:  # pragma: no cover
        pass
    try:
        import nanoarrow as na

        out["nanoarrow"] = lambda: na.ArrayStream(TOKENS)
    except ImportError:  # pragma: no cover
        pass
    return out


@pytest.mark.parametrize("kind", sorted(kinds()))
def test_every_arrow_kind_loads_the_same_state(kind: str) -> None:
    with pagedkv_sql.connect(":memory:") as db:
        db.load(DATA)
        db.load_arrow("virtual_token", kinds()[kind](), diagnostics=False)
        got = db.resolve_table().to_pylist()
        assert [tuple(r.values()) for r in got] == [
            (1, 0, 268435456),
            (1, 32, 1879048192),
            (2, 0, 805306368),
        ]


@pytest.mark.parametrize("kind", sorted(kinds()))
def test_a_spec_violation_in_any_arrow_kind_is_named_row_by_row(kind: str) -> None:
    """A stream read once (a reader, a DuckDB relation, a C stream) is refused like a table:
    a ConstraintError naming each offending row, not "the stream failed"; nothing loaded."""
    bad = pa.table(
        {
            "seq_id": [1, 1, 2],
            "token_pos": [0, 32, 0],
            "block_index": [0, 2, 0],
            "offset_in_block": [0, 256, -1],
        }
    )
    make = {
        "table": lambda: bad,
        "record_batch": lambda: bad.to_batches()[0],
        "reader": lambda: bad.to_reader(),
        "dataset": lambda: ds.dataset(bad),
        "duckdb_relation": lambda: duckdb.connect().from_arrow(bad),
        "polars": lambda: __import__("polars").from_arrow(bad),
        "nanoarrow": lambda: __import__("nanoarrow").ArrayStream(bad),
    }
    with pagedkv_sql.connect(":memory:") as db:
        db.load(DATA)
        before = db.sql("SELECT count(*) FROM virtual_token").fetchall()
        with pytest.raises(pagedkv_sql.ConstraintError, match="2 row") as e:
            db.load_arrow("virtual_token", make[kind](), diagnostics=False)
        rows = sorted(
            (v.values["token_pos"], v.values["offset_in_block"]) for v in e.value.violations
        )
        assert rows == [(0, -1), (32, 256)]
        assert db.sql("SELECT count(*) FROM virtual_token").fetchall() == before


@pytest.mark.parametrize(
    ("column", "message"),
    [
        (pa.array([1.5], pa.float64()), "column block_table_ptr has type double, not an integer"),
        (pa.array(["1"], pa.string()), "column block_table_ptr has type string, not an integer"),
        (pa.nulls(1), "column block_table_ptr has type null (every value is missing)"),
    ],
)
def test_typed_columns_must_be_integers(tmp_path: Path, column: pa.Array, message: str) -> None:
    f = tmp_path / "root_table.parquet"
    pq.write_table(pa.table({"seq_id": pa.array([1], pa.int8()), "block_table_ptr": column}), f)
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError, match=re.escape(message)):
        db.load(f)


def test_integers_of_any_width_load_when_they_fit(tmp_path: Path) -> None:
    f = tmp_path / "root_table.parquet"
    table = pa.table(
        {
            "seq_id": pa.array([1, 2], pa.uint8()),
            "block_table_ptr": pa.array([3, 2**63 - 1], pa.uint64()),
        }
    )
    pq.write_table(table, f)
    with pagedkv_sql.connect(":memory:") as db:
        db.load(f)
        assert state(db)["root_table"] == [(1, 3), (2, 2**63 - 1)]
        big = pa.table(
            {"seq_id": pa.array([1], pa.int16()), "block_table_ptr": pa.array([2**63], pa.uint64())}
        )
        with pytest.raises(InputError) as info:
            db.load_arrow("root_table", big)
        assert str(info.value.problems[0]) == (
            "<arrow root_table>: column block_table_ptr holds 9223372036854775808, "
            "beyond the signed 64-bit range"
        )
        nullable = pa.table(
            {"seq_id": pa.array([5, None], pa.int64()), "block_table_ptr": pa.array([1, 2])}
        )
        with pytest.raises(InputError) as info:
            db.load_arrow("root_table", nullable)
        assert str(info.value.problems[0]) == "<arrow root_table>: column seq_id holds a null"
        assert state(db)["root_table"] == [(1, 3), (2, 2**63 - 1)]


def test_a_failing_producer_is_reported(db: pagedkv_sql.Database) -> None:
    schema = pa.schema([("seq_id", pa.int64()), ("block_table_ptr", pa.int64())])

    def batches() -> Any:
        yield pa.record_batch([pa.array([1]), pa.array([2])], schema=schema)
        raise RuntimeError("producer broke")

    reader = pa.RecordBatchReader.from_batches(schema, batches())
    with pytest.raises(InputError) as e:
        db.load_arrow("root_table", reader)
    assert "producer broke" in e.value.message
    assert db.sql("SELECT count(*) AS n FROM root_table").to_arrow_table().to_pylist() == [{"n": 0}]


@pytest.mark.parametrize("kind", ["file", "stream"])
@pytest.mark.parametrize("ext", [".arrow", ".feather", ".arrows"])
def test_arrow_files_and_streams_load_under_every_arrow_extension(
    tmp_path: Path, kind: str, ext: str
) -> None:
    table = arrow_table("root_table", [(1, 100), (2, 200)])
    f = tmp_path / f"root_table{ext}"
    with (pa.ipc.new_file if kind == "file" else pa.ipc.new_stream)(f, table.schema) as w:
        w.write_table(table)
    assert loaded_roots(f) == [(1, 100), (2, 200)]


@pytest.mark.parametrize("fmt", ["arrow-table", "parquet"])
def test_a_violation_in_arrow_data_is_located_by_its_row_number(tmp_path: Path, fmt: str) -> None:
    table = arrow_table("block_table_entry", [(1, 0, 256, 1), (1, 1, 300, 1), (1, 2, 512, -1)])
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(ConstraintError) as e:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            label = str(tmp_path / "block_table_entry.parquet")
            pq.write_table(table, label)
            db.load(label)
        else:
            label = "<arrow block_table_entry>"
            db.load_arrow("block_table_entry", table)
    assert [(v.check, v.locations) for v in e.value.violations] == [
        ("spec_unaligned_base", (f"{label} row 2",)),
        ("spec_negative_refcount", (f"{label} row 3",)),
    ]


def test_an_object_is_taken_for_a_dataset_only_with_schema_batches_and_scanner() -> None:
    class ScannerOnly:
        def scanner(self) -> None: ...

    with pytest.raises(pagedkv_sql.UsageError, match=r"^cannot load a ScannerOnly as root_table"):
        sources.arrow_source("root_table", ScannerOnly(), "<x>")


def test_a_violation_in_an_arrow_table_is_located_by_its_row() -> None:
    bte = arrow_table("block_table_entry", [(1, 0, 256, 1), (1, 1, 257, 1)])
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(ConstraintError) as e:
        db.load_arrow("block_table_entry", bte, label="<bte>")
    assert [v.locations for v in e.value.violations] == [("<bte> row 2",)]


def test_a_stream_refused_is_described_from_the_error_not_read_twice() -> None:
    """An Arrow C stream is read once: a refusal names the bad value from the load's own
    error, never from a second read of a stream that is gone."""
    table = pa.table(
        {"seq_id": pa.array([1, None], pa.int64()), "block_table_ptr": pa.array([100, 200])}
    )
    with pagedkv_sql.connect(":memory:") as db:
        with pytest.raises(InputError) as e:
            db.load_arrow("root_table", ArrowStream(table))
        assert [p.message for p in e.value.problems] == ["column seq_id holds a null"]
        table = table.set_column(0, "seq_id", pa.array([1, 2], pa.int64()))
        db.load_arrow("root_table", ArrowStream(table))
        assert db.sql("SELECT * FROM root_table ORDER BY ALL").fetchall() == [(1, 100), (2, 200)]


def test_a_polars_lazyframe_is_refused_clearly_and_without_polars_warning(
    db: pagedkv_sql.Database,
) -> None:
    """A LazyFrame is a query: refused, saying to collect() it, and no PerformanceWarning
    from touching its schema on the way (filterwarnings = error would raise it here)."""
    import warnings

    pl = pytest.importorskip("polars")
    lazy = pl.LazyFrame({"seq_id": [1], "block_table_ptr": [100]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(pagedkv_sql.UsageError, match=r"^cannot load a LazyFrame as") as e:
            db.load_arrow("root_table", lazy)
    assert e.value.hint == "collect() it first: it is a query, not its rows"
    assert db.load_arrow("root_table", lazy.collect()).relations[0].rows_total == 1
