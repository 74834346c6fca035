"""resolve_stream against the reference evaluation of the two rules, on random facts cut
into random batches in any order: its fast paths (the watermark that skips the join with
the rows given before, the prefix joined, the adjacent-duplicate drop, the rows given
kept compressed batch by batch with key ranges) must give exactly what resolve() gives
over the same tokens."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv_sql
from pagedkv_sql import stream
from pagedkv_sql.errors import ConstraintError, InputError
from pagedkv_sql.relations import arrow_schema

from .helpers import (
    BOTH_TIERS,
    BOTH_TIERS_OUTPUT,
    DATA,
    ArrowStream,
    arrow_table,
    load_arrow_facts,
    streamed,
    table_rows,
)
from .reference import resolve as reference

tiny = st.integers(min_value=0, max_value=2)  # few keys: tokens meet blocks and each other
aligned = st.integers(0, 6).map(lambda x: x * 256)

facts = st.fixed_dictionaries(
    {
        "root_table": st.lists(st.tuples(tiny, tiny), min_size=1, max_size=5),
        "block_table_entry": st.lists(
            st.tuples(tiny, tiny, aligned, st.integers(0, 2)), min_size=1, max_size=10
        ),
        "swapped_block": st.lists(st.tuples(tiny, tiny, aligned), max_size=5),
        "virtual_token": st.lists(
            st.tuples(tiny, st.integers(0, 4), tiny, st.integers(0, 3)), max_size=30
        ),
    }
)


def rows(batches: list[pa.RecordBatch]) -> list[tuple[int, ...]]:
    return [tuple(r.values()) for b in batches for r in b.to_pylist()]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(facts, st.data())
def test_stream_matches_the_reference(
    f: dict[str, list[tuple[int, ...]]], data: st.DataObject
) -> None:
    tokens = f["virtual_token"]
    order = data.draw(st.sampled_from(["as drawn", "sorted", "reversed", "sorted twice"]))
    if order != "as drawn":
        tokens = sorted(tokens, reverse=order == "reversed")
    if order == "sorted twice":  # the second pass gives every row again
        tokens = tokens + tokens
    cuts = sorted(data.draw(st.lists(st.integers(0, len(tokens)), max_size=5)))
    pieces = [tokens[a:b] for a, b in zip([0, *cuts], [*cuts, len(tokens)], strict=True)]
    expected = reference(f["root_table"], f["block_table_entry"], tokens, f["swapped_block"])
    with pagedkv_sql.connect(":memory:") as db:
        for relation in ("root_table", "block_table_entry", "swapped_block"):
            db.load_arrow(relation, arrow_table(relation, f[relation]), diagnostics=False)
        batches = [arrow_table("virtual_token", p) for p in pieces]
        out = list(db.resolve_stream(batches))
        got = rows(out)
        assert sorted(got) == expected  # every row, none twice
        for b in out:  # each batch's rows sorted
            assert rows([b]) == sorted(rows([b]))
        loose = rows(list(db.resolve_stream(batches, distinct=False)))
        assert sorted(set(loose)) == expected
        for piece in pieces:  # without distinct: each batch on its own, as a set
            alone = reference(f["root_table"], f["block_table_entry"], piece, f["swapped_block"])
            assert len(alone) == len(set(alone))
        assert len(loose) <= sum(
            len(reference(f["root_table"], f["block_table_entry"], p, f["swapped_block"]))
            for p in pieces
        )


def test_rows_given_many_batches_before_are_found(db: pagedkv_sql.Database) -> None:
    """A batch that goes back to tokens given many batches before (kept compressed, each
    batch with its key range): its repeated rows are dropped, its new ones kept."""
    db.load_arrow("root_table", arrow_table("root_table", [(s, s) for s in range(5)]))
    db.load_arrow(
        "block_table_entry",
        arrow_table("block_table_entry", [(s, 0, 256 * (s + 1), 1) for s in range(5)]),
        diagnostics=False,
    )
    batches = [arrow_table("virtual_token", [(s, 0, 0, 0), (s, 1, 0, 1)]) for s in range(5)]
    back = arrow_table("virtual_token", [(0, 1, 0, 1), (0, 2, 0, 2), (3, 0, 0, 0), (4, 9, 0, 9)])
    before = rows(list(db.resolve_stream(batches)))
    out = rows(list(db.resolve_stream([*batches, back])))
    assert out == [*before, (0, 2, 258), (4, 9, 1289)]


def test_a_sorted_stream_is_never_joined(
    db: pagedkv_sql.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches in key order (an engine's tokens by sequence) never reach the join with
    the rows given before: the watermark proves them new."""
    calls: list[int] = []
    unseen = stream._Seen._unseen
    monkeypatch.setattr(
        stream._Seen, "_unseen", lambda self, out, n: calls.append(n) or unseen(self, out, n)
    )
    db.load_arrow("root_table", arrow_table("root_table", [(s, s) for s in range(4)]))
    db.load_arrow(
        "block_table_entry",
        arrow_table("block_table_entry", [(s, 0, 256, 1) for s in range(4)]),
        diagnostics=False,
    )
    batches = [arrow_table("virtual_token", [(s, p, 0, p) for p in range(3)]) for s in range(4)]
    assert len(rows(list(db.resolve_stream(batches)))) == 12
    assert calls == []
    list(db.resolve_stream([batches[1], batches[0], batches[1]]))
    assert calls == [3, 3]  # batch 0 lies below the watermark (and is new); batch 1 repeats


def _stream_db(db: pagedkv_sql.Database) -> None:
    """Sequence 1, table 10: block 0 at 256."""
    db.load_arrow("root_table", arrow_table("root_table", [(1, 10)]))
    db.load_arrow("block_table_entry", arrow_table("block_table_entry", [(10, 0, 256, 1)]))


def test_a_batch_starting_at_the_watermark_drops_the_row_given_there(
    db: pagedkv_sql.Database,
) -> None:
    """Batch 2 starts with the very token batch 1 ended with (key == watermark)."""
    _stream_db(db)
    out = streamed(db, [[(1, 3, 0, 3), (1, 5, 0, 5)], [(1, 5, 0, 5), (1, 6, 0, 6)]])
    assert out == [[(1, 3, 259), (1, 5, 261)], [(1, 6, 262)]]


def test_a_batch_ending_where_an_earlier_one_began_is_joined_with_it(
    db: pagedkv_sql.Database,
) -> None:
    """Batch 2 covers keys 5-6, below batch 1's; batch 3's last key is batch 2's first:
    the key ranges touch, so batch 3 is checked against batch 2."""
    _stream_db(db)
    out = streamed(
        db,
        [
            [(1, 10, 0, 10), (1, 12, 0, 12)],
            [(1, 5, 0, 5), (1, 6, 0, 6)],
            [(1, 4, 0, 4), (1, 5, 0, 5)],
        ],
    )
    assert out == [[(1, 10, 266), (1, 12, 268)], [(1, 5, 261), (1, 6, 262)], [(1, 4, 260)]]


def test_a_token_given_again_at_another_address_is_new(db: pagedkv_sql.Database) -> None:
    """Rows repeat only when the whole row does: the same token decomposed otherwise
    resolves to another address, which is a new row."""
    _stream_db(db)
    out = streamed(db, [[(1, 5, 0, 5), (1, 9, 0, 9)], [(1, 5, 0, 6), (1, 9, 0, 9)]])
    assert out == [[(1, 5, 261), (1, 9, 265)], [(1, 5, 262)]]


def test_every_batch_yields_at_least_one_batch_even_empty(db: pagedkv_sql.Database) -> None:
    _stream_db(db)
    out = streamed(db, [[(1, 0, 0, 0)], [(2, 0, 0, 0)], [(1, 0, 0, 0)], [(1, 1, 0, 1)]])
    assert out == [[(1, 0, 256)], [], [], [(1, 1, 257)]]


def test_duplicates_within_a_batch_collapse_at_any_position(db: pagedkv_sql.Database) -> None:
    """Exact duplicates anywhere in a sorted batch (first two rows, last two, all)."""
    _stream_db(db)
    out = streamed(
        db,
        [
            [(1, 0, 0, 0), (1, 0, 0, 0), (1, 1, 0, 1)],
            [(1, 2, 0, 2), (1, 3, 0, 3), (1, 3, 0, 3)],
            [(1, 4, 0, 4), (1, 4, 0, 4)],
            [(1, 5, 0, 5)],
        ],
    )
    assert out == [
        [(1, 0, 256), (1, 1, 257)],
        [(1, 2, 258), (1, 3, 259)],
        [(1, 4, 260)],
        [(1, 5, 261)],
    ]
    assert stream.distinct_sorted(pa.table({"a": [1, 1], "b": [2, 3]})).num_rows == 2


def test_a_bad_batch_is_named_by_its_number_with_a_hundred_rows_shown(
    db: pagedkv_sql.Database,
) -> None:
    _stream_db(db)
    bad = [(1, p, 0, 256 + p) for p in range(150)]
    with pytest.raises(ConstraintError) as e:
        streamed(db, [[(1, 0, 0, 0)], bad])
    assert str(e.value).startswith("<token batch 2>: 150 token(s) violate")
    assert e.value.total == 150 and len(e.value.violations) == 100
    assert e.value.violations[0].locations == ("<token batch 2>",)
    with pytest.raises(InputError) as f:
        list(db.resolve_stream([pa.table({"seq_id": [1]})]))
    assert str(f.value).startswith("<token batch 1>: ")


def test_a_stream_takes_a_table_a_reader_and_a_c_stream(db: pagedkv_sql.Database) -> None:
    _stream_db(db)
    table = arrow_table("virtual_token", [(1, 0, 0, 0), (1, 1, 0, 1)])
    reader = pa.RecordBatchReader.from_batches(table.schema, table.to_batches())
    for given in (table, reader, ArrowStream(table), table.to_batches()):  # noqa: F402
        got = [tuple(r.values()) for b in db.resolve_stream(given) for r in b.to_pylist()]
        assert got == [(1, 0, 256), (1, 1, 257)]


def test_only_the_rows_up_to_the_watermark_are_joined(
    db: pagedkv_sql.Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 2 holds keys 2-7 after batch 1's 0-4: its first three rows (keys 2-4) may
    repeat rows given before and are joined; keys 5-7 are above the watermark, new."""
    prefixes: list[int] = []
    unseen = stream._Seen._unseen
    monkeypatch.setattr(
        stream._Seen, "_unseen", lambda self, out, n: prefixes.append(n) or unseen(self, out, n)
    )
    _stream_db(db)
    out = streamed(db, [[(1, p, 0, p) for p in range(5)], [(1, p, 0, p) for p in range(2, 8)]])
    assert prefixes == [3]
    assert out[1] == [(1, 5, 261), (1, 6, 262), (1, 7, 263)]


small = st.integers(-2, 2)
arrow_facts = st.fixed_dictionaries(
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
@given(f=arrow_facts, sizes=st.lists(st.integers(0, 5), min_size=1, max_size=6))
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


@pytest.mark.parametrize("distinct", [True, False])
def test_stream_collapses_an_address_found_on_both_tiers(
    db: pagedkv_sql.Database, distinct: bool
) -> None:
    load_arrow_facts(db, {r: v for r, v in BOTH_TIERS.items() if r != "virtual_token"})
    tokens = arrow_table("virtual_token", BOTH_TIERS["virtual_token"])
    out = [r for b in db.resolve_stream([tokens], distinct=distinct) for r in table_rows(b)]
    assert out == BOTH_TIERS_OUTPUT


@pytest.mark.parametrize("kind", ["table", "reader", "polars", "list of batches"])
def test_stream_takes_any_arrow_stream_object(db: pagedkv_sql.Database, kind: str) -> None:
    """One Table, one reader, any object with ``__arrow_c_stream__`` (a polars DataFrame
    here) or an iterable of batches: each is one stream of token batches."""
    import polars as pl

    load_arrow_facts(db, {r: v for r, v in BOTH_TIERS.items() if r != "virtual_token"})
    table = arrow_table("virtual_token", BOTH_TIERS["virtual_token"])
    tokens = {
        "table": table,
        "reader": pa.RecordBatchReader.from_batches(table.schema, table.to_batches()),
        "polars": pl.from_arrow(table),
        "list of batches": table.to_batches(max_chunksize=2),
    }[kind]
    assert [r for b in db.resolve_stream(tokens) for r in table_rows(b)] == BOTH_TIERS_OUTPUT


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


def test_stream_gives_a_second_address_of_a_token_seen_before(db: pagedkv_sql.Database) -> None:
    """distinct drops only whole rows already given: the same token resolving to another
    address in a later batch (another decomposition) is a new row."""
    load_arrow_facts(
        db, {"root_table": [(1, 10)], "block_table_entry": [(10, 0, 0x1000, 1), (10, 1, 0x2000, 1)]}
    )
    first = arrow_table("virtual_token", [(1, 0, 0, 0)])
    second = arrow_table("virtual_token", [(1, 0, 1, 0), (1, 0, 0, 0)])
    out = [r for b in db.resolve_stream([first, second]) for r in table_rows(b)]
    assert out == [(1, 0, 0x1000), (1, 0, 0x2000)]


def test_rows_left_after_the_join_with_a_bigger_batch_come_out_sorted(
    db: pagedkv_sql.Database,
) -> None:
    """A small batch below the watermark joined with a big earlier one: DuckDB may build
    its hash table on the small side and give the rows left in any order; they are
    sorted again."""
    db.load_arrow("root_table", arrow_table("root_table", [(1, 10)]))
    db.load_arrow(
        "block_table_entry",
        arrow_table("block_table_entry", [(10, b, 256 * (b + 1), 1) for b in range(400)]),
    )
    big = [(1, p, p // 16, p % 16) for p in range(0, 6400, 2)]
    small = [(1, p, p // 16, p % 16) for p in range(200)]
    out = streamed(db, [big, small])
    assert out[1] == [(1, p, 256 * (p // 16 + 1) + p % 16) for p in range(1, 200, 2)]
