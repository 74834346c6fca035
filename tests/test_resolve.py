"""sql/resolve.sql: the resolved addresses as a set, across both tiers."""

from __future__ import annotations

import pagedkv_sql

from .conftest import _insert, _view, arrow_table


def test_the_resolved_view_is_a_set_across_both_tiers(db: pagedkv_sql.Database) -> None:
    """A block resident and swapped at the same address gives its token one row."""
    db.load_arrow("root_table", arrow_table("root_table", [(1, 100)]))
    db.load_arrow("block_table_entry", arrow_table("block_table_entry", [(100, 0, 4096, 1)]))
    db.load_arrow("swapped_block", arrow_table("swapped_block", [(100, 0, 4096)]))
    db.load_arrow("virtual_token", arrow_table("virtual_token", [(1, 5, 0, 5)]))
    assert db.sql("SELECT * FROM resolved_kv_address").fetchall() == [(1, 5, 4101)]


INT64_MAX = 2**63 - 1


def test_a_cpu_address_near_the_top_wraps_as_in_souffle(db: pagedkv_sql.Database) -> None:
    """INT64_MAX - 5 + 5 is INT64_MAX exactly; INT64_MAX - 1 + 5 wraps to INT64_MIN + 3."""
    _insert(db, "root_table", [(1, 10)])
    _insert(db, "swapped_block", [(10, 0, INT64_MAX - 5), (10, 1, INT64_MAX - 1)])
    _insert(db, "virtual_token", [(1, 5, 0, 5), (1, 21, 1, 5), (1, 16, 1, 0)])
    assert _view(db, "resolved_kv_address") == [
        (1, 5, INT64_MAX),
        (1, 16, INT64_MAX - 1),
        (1, 21, -(2**63) + 3),
    ]


def test_resolve_takes_each_tokens_own_block_and_sorts_by_address_too(
    db: pagedkv_sql.Database,
) -> None:
    """One table of 8 blocks, each resident and swapped (4 tokens a block): a token
    resolves through its own block only (not every block of its table), and its two
    addresses come out in address order: the GPU one first in odd blocks, the CPU one in
    even blocks, so no order of ties (the rules' order, or its reverse) passes for both."""
    blocks, size = 8, 4
    gpu = [(7, k, (1 << 20) + 256 * k if k % 2 == 0 else 256 * k, 1) for k in range(blocks)]
    cpu = [(7, k, (1 << 16) + 256 * k) for k in range(blocks)]
    _insert(db, "root_table", [(3, 7)])
    _insert(db, "block_table_entry", gpu)
    _insert(db, "swapped_block", cpu)
    db.con.execute(
        f"INSERT INTO virtual_token SELECT 3, t, t // {size}, t % {size} FROM range(32) r(t)"
    )
    want = sorted(
        (3, t, base + t % size)
        for t in range(blocks * size)
        for base in (gpu[t // size][2], cpu[t // size][2])
    )
    got = db.resolve_table()
    assert list(zip(*(got.column(c).to_pylist() for c in got.column_names), strict=True)) == want


def test_the_resolved_view_is_a_set(db: pagedkv_sql.Database) -> None:
    """A token whose block is resident and swapped at the same address is one row of
    resolved_kv_address, as in Soufflé, not one a rule."""
    _insert(db, "root_table", [(3, 7)])
    _insert(db, "block_table_entry", [(7, 0, 4096, 1)])
    _insert(db, "swapped_block", [(7, 0, 4096)])
    _insert(db, "virtual_token", [(3, 0, 0, 5)])
    assert _view(db, "resolved_kv_address") == [(3, 0, 4101)]
