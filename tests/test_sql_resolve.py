"""sql/resolve.sql: the spec's rules on DuckDB: the golden seed, the resolved addresses as
a set across both tiers, the 64-bit wrap."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pagedkv_sql

from .helpers import (
    DATA,
    SEED_OUTPUT,
    arrow_table,
    insert,
    load_arrow_facts,
    table_rows,
    tsv,
    view_rows,
)
from .reference import resolve as reference


def test_a_cpu_address_may_end_exactly_at_int64_max(db: pagedkv_sql.Database) -> None:
    """base + offset = 2**63 - 1 fits: it must not take the wrap-around branch."""
    top = 2**63 - 1
    load_arrow_facts(
        db,
        {
            "root_table": [(1, 10)],
            "swapped_block": [(10, 0, top - 5), (10, 1, top - 4)],
            "virtual_token": [(1, 0, 0, 5), (1, 16, 1, 5)],
        },
    )
    assert table_rows(db.resolve_table()) == [(1, 0, top), (1, 16, -(2**63))]


def test_seed_resolves_to_the_golden_output(db: pagedkv_sql.Database) -> None:
    db.load(DATA)
    assert tsv(db.resolve_table()) == SEED_OUTPUT


def test_exact_duplicates_collapse_and_are_counted(
    db: pagedkv_sql.Database, facts_dir: Callable[..., Path]
) -> None:
    d = facts_dir(
        {
            "root_table": [(1, 100), (1, 100)],
            "block_table_entry": [(100, 0, 256, 1), (100, 0, 256, 1), (100, 0, 512, 1)],
            "virtual_token": [(1, 3, 0, 3), (1, 3, 0, 3)],
        }
    )
    report = db.load(d)
    by_relation = {r.relation: r for r in report.relations}
    assert by_relation["root_table"].duplicates_dropped == 1
    assert by_relation["block_table_entry"].duplicates_dropped == 1
    assert by_relation["block_table_entry"].rows_total == 2
    assert by_relation["swapped_block"].mode == "kept"
    assert db.resolve_table().to_pylist() == [
        {"seq_id": 1, "token_pos": 3, "physical_address": 259},
        {"seq_id": 1, "token_pos": 3, "physical_address": 515},
    ]


def test_resident_and_swapped_at_the_same_address_is_one_row(
    db: pagedkv_sql.Database, facts_dir: Callable[..., Path]
) -> None:
    d = facts_dir(
        {
            "root_table": [(1, 7), (1, 8)],
            "block_table_entry": [(7, 0, 1024, 1), (8, 0, 1024, 5)],
            "virtual_token": [(1, 2, 0, 2)],
            "swapped_block": [(7, 0, 1024)],
        }
    )
    db.load(d)
    assert db.resolve_table().to_pylist() == [
        {"seq_id": 1, "token_pos": 2, "physical_address": 1026}
    ]
    shell_view = db.sql("SELECT * FROM resolved_kv_address").to_arrow_table().to_pylist()
    assert shell_view == [{"seq_id": 1, "token_pos": 2, "physical_address": 1026}]


def test_cpu_address_near_2_63_wraps_like_a_64_bit_build(
    db: pagedkv_sql.Database, facts_dir: Callable[..., Path]
) -> None:
    top = 2**63 - 1
    d = facts_dir(
        {
            "root_table": [(1, 1)],
            "virtual_token": [(1, 0, 0, 5)],
            "swapped_block": [(1, 0, top)],
        }
    )
    db.load(d)
    expected = reference([(1, 1)], [], [(1, 0, 0, 5)], [(1, 0, top)])
    assert expected == [(1, 0, -(2**63) + 4)]
    assert [tuple(r.values()) for r in db.resolve_table().to_pylist()] == expected
    assert db.sql("SELECT * FROM resolved_kv_address").to_arrow_table().to_pylist()[0][
        "physical_address"
    ] == (-(2**63) + 4)
    assert db.explain(1, 0).addresses == [-(2**63) + 4]


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
    insert(db, "root_table", [(1, 10)])
    insert(db, "swapped_block", [(10, 0, INT64_MAX - 5), (10, 1, INT64_MAX - 1)])
    insert(db, "virtual_token", [(1, 5, 0, 5), (1, 21, 1, 5), (1, 16, 1, 0)])
    assert view_rows(db, "resolved_kv_address") == [
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
    insert(db, "root_table", [(3, 7)])
    insert(db, "block_table_entry", gpu)
    insert(db, "swapped_block", cpu)
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
    insert(db, "root_table", [(3, 7)])
    insert(db, "block_table_entry", [(7, 0, 4096, 1)])
    insert(db, "swapped_block", [(7, 0, 4096)])
    insert(db, "virtual_token", [(3, 0, 0, 5)])
    assert view_rows(db, "resolved_kv_address") == [(3, 0, 4101)]
