"""Boundary cases that no other test reaches: each one kills a one-line bug that passed the
whole suite (docs/mutation.md, "The six bugs that started it")."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql.errors import ConstraintError, InputError

from .conftest import arrow_table

INT64_MIN = -(2**63)

# One block resident and swapped at the same address: every token of it resolves to the
# same physical address through both rules, so the bag of the two rules holds each output
# row twice, side by side once sorted.
BOTH_TIERS: dict[str, list[tuple[int, ...]]] = {
    "root_table": [(1, 10)],
    "block_table_entry": [(10, 0, 0x1000, 1)],
    "swapped_block": [(10, 0, 0x1000)],
    "virtual_token": [(1, pos, 0, pos) for pos in range(5)],
}
BOTH_TIERS_OUTPUT = [(1, pos, 0x1000 + pos) for pos in range(5)]


def rows(table: pa.Table | pa.RecordBatch) -> list[tuple[int, ...]]:
    return [tuple(r.values()) for r in table.to_pylist()]


def load(db: pagedkv_sql.Database, facts: dict[str, list[tuple[int, ...]]]) -> None:
    for relation, data in facts.items():
        db.load_arrow(relation, arrow_table(relation, data), diagnostics=False)


def test_schema_refuses_a_base_aligned_to_128_but_not_256(db: pagedkv_sql.Database) -> None:
    """The CHECK clause holds in the DuckDB shell too, where no load validates first."""
    db.con.execute("INSERT INTO block_table_entry VALUES (1, 0, 512, 1)")
    with pytest.raises(duckdb.ConstraintException):
        db.con.execute("INSERT INTO block_table_entry VALUES (1, 1, 384, 1)")
    assert db.con.execute("SELECT physical_block_base FROM block_table_entry").fetchall() == [
        (512,)
    ]


def test_offset_equal_to_the_block_size_is_a_wrong_decomposition(
    db: pagedkv_sql.Database,
) -> None:
    """block_index 0, offset 16 gives back token_pos 16 by arithmetic, but an offset of
    16 does not fit in a block of 16 tokens; 15 does."""
    load(db, {"virtual_token": [(1, 16, 0, 16), (1, 15, 0, 15)]})
    found = db.sql("SELECT seq_id, token_pos FROM diag_token_decomposition").to_arrow_table()
    assert rows(found) == [(1, 16)]


def test_the_smallest_int64_loads_through_the_python_number_reader(tmp_path: Path) -> None:
    """A .dl file, and a text file DuckDB's reader refuses (mixed line endings), are read
    by the Python number reader."""
    dl = tmp_path / "facts.dl"
    dl.write_text(f"root_table({INT64_MIN}, 1).\n")
    mixed = tmp_path / "root_table.facts"
    mixed.write_bytes(f"\n{INT64_MIN}\t1\r\n2\t{INT64_MIN}\r\n".encode())
    with pagedkv_sql.connect(":memory:") as db:
        db.load(dl)
        assert rows(db.sql("SELECT * FROM root_table").to_arrow_table()) == [(INT64_MIN, 1)]
        db.load(mixed)
        assert sorted(rows(db.sql("SELECT * FROM root_table").to_arrow_table())) == [
            (INT64_MIN, 1),
            (2, INT64_MIN),
        ]
        one_below = tmp_path / "below.dl"
        one_below.write_text(f"root_table({INT64_MIN - 1}, 1).\n")
        with pytest.raises(InputError):
            db.load(one_below)


@pytest.mark.parametrize("kind", ["dl", "fallback"])
def test_the_python_number_reader_takes_every_spelling_to_the_int64_bounds(
    tmp_path: Path, kind: str
) -> None:
    """The Python reader (a .dl file; a text file DuckDB's reader refuses) reads hex,
    binary and signs as the bulk reader does, up to both ends of the signed 64-bit range."""
    pairs = [
        ("0x7fffffffffffffff", "-0x8000000000000000"),
        ("9223372036854775807", "0X1f"),
        ("0b101", "-0B11"),
        ("+0x10", "-7"),
    ]
    expected = [(2**63 - 1, INT64_MIN), (2**63 - 1, 31), (5, -3), (16, -7)]

    def write(rows: list[tuple[str, str]]) -> Path:
        if kind == "dl":
            f = tmp_path / "facts.dl"
            f.write_text("".join(f"root_table({a}, {b}).\n" for a, b in rows))
        else:
            f = tmp_path / "root_table.facts"
            f.write_bytes(b"\n" + b"".join(f"{a}\t{b}\r\n".encode() for a, b in rows))
        return f

    with pagedkv_sql.connect(":memory:") as db:
        db.load(write(pairs))
        assert sorted(rows(db.sql("SELECT * FROM root_table").to_arrow_table())) == sorted(expected)
        for beyond in ("9223372036854775808", "0x8000000000000000", "-0x8000000000000001"):
            with pytest.raises(InputError):
                db.load(write([("1", beyond)]))
        assert sorted(rows(db.sql("SELECT * FROM root_table").to_arrow_table())) == sorted(expected)


@pytest.mark.parametrize("batch_size", [1, 2, 3, 4])
def test_resolve_drops_a_duplicate_split_across_batches(
    db: pagedkv_sql.Database, batch_size: int
) -> None:
    load(db, BOTH_TIERS)
    batches = list(db.resolve(batch_size=batch_size))
    assert any(b.num_rows for b in batches[1:])  # the output really spans batches
    assert [r for b in batches for r in rows(b)] == BOTH_TIERS_OUTPUT


@pytest.mark.parametrize("content", [b"1\t100\t\n", b"1\t100\n2\t200\t\n", b"1\t0x64\t\n"])
def test_a_trailing_empty_field_is_refused(tmp_path: Path, content: bytes) -> None:
    """A trailing tab makes a third, empty field: too many for root_table, whichever
    reader (typed for plain decimals, text otherwise) the bulk load takes."""
    f = tmp_path / "root_table.facts"
    f.write_bytes(content)
    with pagedkv_sql.connect(":memory:") as db:
        with pytest.raises(InputError) as info:
            db.load(f)
        assert info.value.problems
        assert rows(db.sql("SELECT * FROM root_table").to_arrow_table()) == []


@pytest.mark.parametrize("distinct", [True, False])
def test_stream_collapses_an_address_found_on_both_tiers(
    db: pagedkv_sql.Database, distinct: bool
) -> None:
    load(db, {r: v for r, v in BOTH_TIERS.items() if r != "virtual_token"})
    tokens = arrow_table("virtual_token", BOTH_TIERS["virtual_token"])
    out = [r for b in db.resolve_stream([tokens], distinct=distinct) for r in rows(b)]
    assert out == BOTH_TIERS_OUTPUT


@pytest.mark.parametrize("kind", ["table", "reader", "polars", "list of batches"])
def test_stream_takes_any_arrow_stream_object(db: pagedkv_sql.Database, kind: str) -> None:
    """One Table, one reader, any object with ``__arrow_c_stream__`` (a polars DataFrame
    here) or an iterable of batches: each is one stream of token batches."""
    import polars as pl

    load(db, {r: v for r, v in BOTH_TIERS.items() if r != "virtual_token"})
    table = arrow_table("virtual_token", BOTH_TIERS["virtual_token"])
    tokens = {
        "table": table,
        "reader": pa.RecordBatchReader.from_batches(table.schema, table.to_batches()),
        "polars": pl.from_arrow(table),
        "list of batches": table.to_batches(max_chunksize=2),
    }[kind]
    assert [r for b in db.resolve_stream(tokens) for r in rows(b)] == BOTH_TIERS_OUTPUT


def test_request_ids_sit_right_after_seq_id(db: pagedkv_sql.Database) -> None:
    """When a capability names the requests (the view pagedkv_request_label), results
    carry a request_id column right after seq_id: in resolve's stream and in checks."""
    from .conftest import DATA

    db.load(DATA)
    db.con.execute(
        "CREATE VIEW pagedkv_request_label AS SELECT * FROM "
        "(VALUES (1::BIGINT, 'req-a'), (2::BIGINT, 'req-b')) AS t(seq_id, request_id)"
    )
    labelled = db.label_requests(db.resolve()).read_all()
    assert labelled.column_names == ["seq_id", "request_id", "token_pos", "physical_address"]
    assert set(labelled.column("request_id").to_pylist()) == {"req-a", "req-b"}
    found = {r.name: r.rows for r in db.check().results if r.count}
    names = found["diag_unresolved_token"].column_names
    assert names[: names.index("seq_id") + 2][-2:] == ["seq_id", "request_id"]


def test_a_check_result_as_violations_keeps_the_row_apart_from_the_reason(
    db: pagedkv_sql.Database,
) -> None:
    from .conftest import DATA

    db.load(DATA)
    result = next(r for r in db.check().results if r.name == "diag_unresolved_token")
    (violation,) = result.violations
    assert set(violation.values) == {"seq_id", "token_pos", "block_index", "offset_in_block"}
    assert violation.reason == result.rows.column("reason")[0].as_py()
    assert violation.relation == "unresolved_token"  # a diagnostic: named by its check
    with pytest.raises(ConstraintError) as info:  # a spec check names the relation
        load(db, {"block_table_entry": [(1, 0, 256, -1)]})
    assert [v.relation for v in info.value.violations] == ["block_table_entry"]


def test_stream_refuses_a_batch_duckdb_cannot_read_as_bigint(db: pagedkv_sql.Database) -> None:
    tokens = arrow_table("virtual_token", [(1, 0, 0, 0)]).set_column(
        0, "seq_id", pa.array([2**63], pa.uint64())
    )
    with pytest.raises(InputError):
        list(db.resolve_stream([tokens]))


def test_stream_names_the_bad_batch_and_caps_the_rows_it_lists(db: pagedkv_sql.Database) -> None:
    """A refused batch is named by its number (from 1); its offending tokens are all
    counted, and the first 100 listed."""
    good = arrow_table("virtual_token", [(1, 0, 0, 0)])
    bad = arrow_table("virtual_token", [(1, pos, 0, 256) for pos in range(150)])
    with pytest.raises(ConstraintError) as info:
        list(db.resolve_stream([good, bad]))
    assert "batch 2" in str(info.value) and "batch 1" not in str(info.value)
    assert info.value.total == 150
    assert len(info.value.violations) == 100


def test_a_refcount_of_zero_is_allowed(db: pagedkv_sql.Database) -> None:
    """The spec refuses only negative refcounts; 0 (a block on its way to the free list)
    loads, from Arrow and from plain SQL."""
    load(db, {"block_table_entry": [(1, 0, 256, 0)]})
    db.con.execute("INSERT INTO block_table_entry VALUES (1, 1, 512, 0)")
    assert db.check().errors == 0


def test_a_cpu_address_may_end_exactly_at_int64_max(db: pagedkv_sql.Database) -> None:
    """base + offset = 2**63 - 1 fits: it must not take the wrap-around branch."""
    top = 2**63 - 1
    load(
        db,
        {
            "root_table": [(1, 10)],
            "swapped_block": [(10, 0, top - 5), (10, 1, top - 4)],
            "virtual_token": [(1, 0, 0, 5), (1, 16, 1, 5)],
        },
    )
    assert rows(db.resolve_table()) == [(1, 0, top), (1, 16, -(2**63))]


def test_stream_gives_a_second_address_of_a_token_seen_before(db: pagedkv_sql.Database) -> None:
    """distinct drops only whole rows already given: the same token resolving to another
    address in a later batch (another decomposition) is a new row."""
    load(
        db, {"root_table": [(1, 10)], "block_table_entry": [(10, 0, 0x1000, 1), (10, 1, 0x2000, 1)]}
    )
    first = arrow_table("virtual_token", [(1, 0, 0, 0)])
    second = arrow_table("virtual_token", [(1, 0, 1, 0), (1, 0, 0, 0)])
    out = [r for b in db.resolve_stream([first, second]) for r in rows(b)]
    assert out == [(1, 0, 0x1000), (1, 0, 0x2000)]
