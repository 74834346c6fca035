"""resolve_stream against the reference evaluation of the two rules, on random facts cut
into random batches in any order: its fast paths (the watermark that skips the join with
the rows given before, the prefix joined, the adjacent-duplicate drop, the rows given
kept compressed batch by batch with key ranges) must give exactly what resolve() gives
over the same tokens."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pagedkv_sql
from pagedkv_sql import stream

from .conftest import arrow_table
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
