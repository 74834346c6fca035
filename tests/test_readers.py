"""readers.py: the record-batch streams a Database hands out, sorted and without exact
duplicates."""

from __future__ import annotations

import pyarrow as pa
import pytest

import pagedkv_sql

from .helpers import BOTH_TIERS, BOTH_TIERS_OUTPUT, load_arrow_facts, table_rows


@pytest.mark.parametrize("batch_size", [1, 2, 3, 4])
def test_resolve_drops_a_duplicate_split_across_batches(
    db: pagedkv_sql.Database, batch_size: int
) -> None:
    load_arrow_facts(db, BOTH_TIERS)
    batches = list(db.resolve(batch_size=batch_size))
    assert any(b.num_rows for b in batches[1:])  # the output really spans batches
    assert [r for b in batches for r in table_rows(b)] == BOTH_TIERS_OUTPUT


def _batches(*rows: list[tuple[int, int, int]]) -> list[pa.RecordBatch]:
    from pagedkv_sql.relations import OUTPUT_SCHEMA

    return [
        pa.RecordBatch.from_pylist(
            [dict(zip(OUTPUT_SCHEMA.names, r, strict=True)) for r in batch], schema=OUTPUT_SCHEMA
        )
        for batch in rows
    ]


def test_sorted_output_drops_exact_duplicates_and_only_those() -> None:
    """Rows equal in the first column but not the others are kept; a duplicate is found in
    one batch and across batches, past empty and one-row batches."""
    from pagedkv_sql.readers import distinct_sorted as _distinct_sorted

    ended: list[bool] = []
    batches = _batches(
        [(1, 0, 5), (1, 0, 5), (1, 1, 5), (1, 1, 6)],
        [],
        [(1, 1, 6)],
        [(1, 1, 6), (2, 0, 5), (3, 0, 5)],
    )
    out = list(_distinct_sorted(batches, lambda: ended.append(True)))
    assert [tuple(r.values()) for b in out for r in b.to_pylist()] == [
        (1, 0, 5),
        (1, 1, 5),
        (1, 1, 6),
        (2, 0, 5),
        (3, 0, 5),
    ]
    assert ended == [True]
    assert len(list(_distinct_sorted(_batches([(1, 0, 5)], [(1, 0, 5)])))) == 2
