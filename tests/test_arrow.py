"""Arrow in (every kind of Arrow object), streaming out, and tokens resolved as they flow."""

from __future__ import annotations

import io
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv_sql
from pagedkv_sql.relations import arrow_schema

from .conftest import DATA, SEED_OUTPUT, Cli
from .reference import resolve as reference

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


def test_outputs_have_the_fixed_schema() -> None:
    with pagedkv_sql.connect(":memory:") as db:
        db.load(DATA)
        assert db.resolve().schema == arrow_schema("resolved_kv_address")
        assert db.reader("block_table_entry").schema == arrow_schema("block_table_entry")
        assert all(not f.nullable and f.type == pa.int64() for f in db.resolve().schema)
        assert db.reader("diag_unresolved_token").read_all().num_rows == 1
        assert db.violations().num_rows == 2


def test_resolve_arrow_in_one_call() -> None:
    with pagedkv_sql.connect(":memory:") as db:
        db.load(DATA)
        inputs = {r: db.reader(r).read_all() for r in pagedkv_sql.INPUT_RELATIONS}
    out = pagedkv_sql.resolve_arrow(**inputs)
    assert "".join("\t".join(map(str, r.values())) + "\n" for r in out.to_pylist()) == SEED_OUTPUT


small = st.integers(-2, 2)
facts = st.fixed_dictionaries(
    {
        "root_table": st.lists(st.tuples(small, small), max_size=4),
        "block_table_entry": st.lists(
            st.tuples(small, small, st.integers(-4, 4).map(lambda x: x * 256), st.just(1)),
            max_size=6,
        ),
        "virtual_token": st.lists(
            st.tuples(small, st.integers(0, 9), small, st.integers(0, 255)), max_size=15
        ),
        "swapped_block": st.lists(st.tuples(small, small, st.integers(-600, 600)), max_size=4),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(f=facts, sizes=st.lists(st.integers(0, 5), min_size=1, max_size=6))
def test_streamed_and_stored_resolution_agree(f: dict[str, Any], sizes: list[int]) -> None:
    expected = reference(
        f["root_table"], f["block_table_entry"], f["virtual_token"], f["swapped_block"]
    )
    tokens = f["virtual_token"] + f["virtual_token"][:2]  # duplicates across batches
    batches, start = [], 0
    schema = arrow_schema("virtual_token")
    for size in [*sizes, len(tokens)]:
        chunk = tokens[start : start + size]
        start += size
        batches.append(
            pa.RecordBatch.from_pylist(
                [dict(zip(schema.names, t, strict=True)) for t in chunk], schema=schema
            )
        )
    with pagedkv_sql.connect(":memory:") as db:
        for relation in ("root_table", "block_table_entry", "swapped_block"):
            rows = f[relation]
            s = arrow_schema(relation)
            db.load_arrow(
                relation,
                pa.Table.from_pylist([dict(zip(s.names, r, strict=True)) for r in rows], schema=s),
                diagnostics=False,
            )
        out = list(db.resolve_stream(batches))
        assert len(out) >= len(batches)
        streamed = sorted(tuple(r.values()) for b in out for r in b.to_pylist())
        assert streamed == expected
        assert db.sql("SELECT count(*) AS n FROM virtual_token").to_arrow_table().to_pylist() == [
            {"n": 0}
        ]
        loose = sorted(
            tuple(r.values())
            for b in db.resolve_stream(batches, distinct=False)
            for r in b.to_pylist()
        )
        assert sorted(set(loose)) == expected


def test_stream_refuses_a_bad_batch() -> None:
    with pagedkv_sql.connect(":memory:") as db:
        db.load(DATA)
        bad = pa.table(
            {"seq_id": [1], "token_pos": [0], "block_index": [0], "offset_in_block": [300]}
        )
        with pytest.raises(pagedkv_sql.ConstraintError, match="1 token"):
            list(db.resolve_stream([bad]))


@pytest.mark.parametrize("fmt", ["arrow", "arrows", "parquet"])
def test_cli_binary_formats(cli: Cli, fmt: str) -> None:
    cli("load", str(DATA))
    result: Any = cli("resolve", "--format", fmt)
    assert result.exit_code == 0
    data = io.BytesIO(result.stdout_bytes)
    if fmt == "arrow":
        table = ipc.open_file(data).read_all()
    elif fmt == "arrows":
        table = ipc.open_stream(data).read_all()
    else:
        table = pq.read_table(data)
    assert table.schema == arrow_schema("resolved_kv_address")
    assert table.num_rows == 7


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
