"""sql/constraints.sql: the spec's constraints and the diagnostics' views, each on its
boundaries: a view fires on data that has the defect and stays quiet on data that does not."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql.errors import ConstraintError

from .helpers import CLEAN, arrow_table, insert, load_arrow_facts, load_facts, table_rows, view_rows


def test_offset_equal_to_the_block_size_is_a_wrong_decomposition(
    db: pagedkv_sql.Database,
) -> None:
    """block_index 0, offset 16 gives back token_pos 16 by arithmetic, but an offset of
    16 does not fit in a block of 16 tokens; 15 does."""
    load_arrow_facts(db, {"virtual_token": [(1, 16, 0, 16), (1, 15, 0, 15)]})
    found = db.sql("SELECT seq_id, token_pos FROM diag_token_decomposition").to_arrow_table()
    assert table_rows(found) == [(1, 16)]


def test_a_refcount_of_zero_is_allowed(db: pagedkv_sql.Database) -> None:
    """The spec refuses only negative refcounts; 0 (a block on its way to the free list)
    loads, from Arrow and from plain SQL."""
    load_arrow_facts(db, {"block_table_entry": [(1, 0, 256, 0)]})
    db.con.execute("INSERT INTO block_table_entry VALUES (1, 1, 512, 0)")
    assert db.check().errors == 0


def _finding_counts(db: pagedkv_sql.Database) -> dict[str, int]:
    return {r.name: r.count for r in db.check().results if r.count}


def test_a_refused_load_names_each_spec_violation_on_its_boundary(tmp_path: Path) -> None:
    """A base of 384 is 128- but not 256-aligned; refcount 0 and offsets 0 and 255 are
    fine, refcount -1 and offset 256 are not; a row given twice is one violation."""
    f = tmp_path / "block_table_entry.facts"
    f.write_text("1\t0\t256\t0\n1\t1\t384\t1\n1\t2\t512\t-1\n1\t2\t512\t-1\n")
    g = tmp_path / "virtual_token.facts"
    g.write_text("1\t0\t0\t0\n1\t255\t0\t255\n1\t256\t1\t256\n")
    with pagedkv_sql.connect(":memory:") as db:
        with pytest.raises(ConstraintError) as e:
            db.load(f)
        assert e.value.total == 2
        assert [
            (v.check, tuple(v.values.values()), v.reason, v.locations) for v in e.value.violations
        ] == [
            (
                "spec_unaligned_base",
                (1, 1, 384, 1),
                "physical_block_base 384 is not 256-byte aligned (384 mod 256 = 128)",
                (f"{f}:2",),
            ),
            (
                "spec_negative_refcount",
                (1, 2, 512, -1),
                "refcount -1 is negative",
                (f"{f}:3", f"{f}:4"),
            ),
        ]
        with pytest.raises(ConstraintError) as e:
            db.load(g)
        assert [(v.check, tuple(v.values.values())) for v in e.value.violations] == [
            ("spec_offset_out_of_block", (1, 256, 1, 256))
        ]
        f.write_text("1\t0\t256\t0\n")
        g.write_text("1\t0\t0\t0\n1\t255\t15\t255\n")
        db.load(f, g)
        assert db.con.execute("SELECT count(*) FROM virtual_token").fetchone() == (2,)


def test_refcounts_are_held_against_their_holders(db: pagedkv_sql.Database) -> None:
    """Base 256: one holder, refcount 0. Base 512: two holders that disagree (2 and 3, the
    lower equal to the holders). Base 768: three holders saying 2. Base 1024: refcount 2 in
    a row given twice by one holder. Base 1280: two holders saying 2 (right)."""
    insert(
        db,
        "block_table_entry",
        [
            (1, 0, 256, 0),
            (1, 1, 512, 2),
            (2, 0, 512, 3),
            (1, 2, 768, 2),
            (2, 1, 768, 2),
            (3, 0, 768, 2),
            (4, 0, 1024, 2),
            (4, 0, 1024, 2),
            (5, 0, 1280, 2),
            (5, 1, 1280, 2),
        ],
    )
    expected = [
        (256, 1, [0], "1:0", "refcount 0 but 1 holder(s)"),
        (512, 2, [2, 3], "1:1 2:0", "holders disagree on the refcount"),
        (768, 3, [2], "1:2 2:1 3:0", "refcount 2 but 3 holder(s)"),
        (1024, 1, [2], "4:0", "refcount 2 but 1 holder(s)"),
    ]
    assert view_rows(db, "diag_refcount_mismatch") == expected
    report = db.check()
    (result,) = [r for r in report.results if r.name == "diag_refcount_mismatch"]
    assert result.count == 4


def test_sorted_unique_keys_are_proven_unique_and_refcounts_still_checked(
    db: pagedkv_sql.Database,
) -> None:
    """Keys in ascending order let check() count holders without grouping; holders saying
    2 and 3 for a base held twice still disagree, and an exact duplicate row (keys not
    strictly ascending) is not taken for a second holder."""
    insert(db, "root_table", [(1, 1), (2, 2)])
    insert(db, "block_table_entry", [(1, 0, 256, 2), (1, 1, 256, 3), (2, 0, 512, 1)])
    assert _finding_counts(db) == {"diag_refcount_mismatch": 1}
    db.con.execute("DELETE FROM block_table_entry")
    insert(db, "block_table_entry", [(1, 0, 256, 1), (1, 0, 256, 1), (1, 1, 512, 1)])
    assert _finding_counts(db) == {}


def test_conflicting_locations_count_distinct_addresses(db: pagedkv_sql.Database) -> None:
    """Key (1, 0) at two GPU bases, one given twice; key (1, 1) at two CPU addresses; key
    (1, 2) resident and swapped; block 3 swapped only, beside resident blocks of its table."""
    insert(db, "root_table", [(1, 1)])
    insert(
        db, "block_table_entry", [(1, 0, 256, 1), (1, 0, 256, 1), (1, 0, 512, 1), (1, 2, 768, 1)]
    )
    insert(
        db,
        "swapped_block",
        [
            (
                1,
                1,
                4096,
            ),
            (1, 1, 8192),
            (1, 2, 12288),
            (1, 3, 16384),
        ],
    )
    assert view_rows(db, "diag_conflicting_location") == [
        (1, 0, [256, 512], None, "2 different GPU bases"),
        (1, 1, None, [4096, 8192], "2 different CPU addresses"),
        (1, 2, [768], [12288], "resident and swapped at once"),
    ]


def test_cpu_addresses_overlap_only_closer_than_256_bytes(db: pagedkv_sql.Database) -> None:
    """128 is aligned to 128 but not 256, so it is unaligned and 128 bytes from 256; 256
    and 512 are exactly 256 apart: no overlap."""
    insert(db, "swapped_block", [(1, 0, 128), (1, 1, 256), (1, 2, 512)])
    assert view_rows(db, "diag_overlapping_blocks", "tier, lower_address, upper_address") == [
        ("cpu", 128, 256)
    ]
    assert view_rows(db, "diag_unaligned_cpu_address", "cpu_base_address") == [(128,)]


def test_token_decompositions_on_every_boundary(db: pagedkv_sql.Database) -> None:
    """Block index 2^31 (past 32 bits: the 128-bit branch) decomposes right; two wrong
    tokens of one sequence are two findings, not two decompositions of one token; a wrong
    row given twice is one finding; a right token beside a wrong one is not listed."""
    big = 2**31
    insert(
        db,
        "virtual_token",
        [
            (1, big * 16 + 3, big, 3),
            (1, 2**40 * 16 + 4, 2**40, 3),
            (2, 0, 0, 0),
            (2, 5, 0, 4),
            (2, 7, 0, 6),
            (2, 7, 0, 6),
            (2, 17, 1, 1),
            (3, 16, 0, 16),
            (3, 15, 0, 15),
        ],
    )
    assert view_rows(db, "diag_token_decomposition") == [
        (
            1,
            2**44 + 4,
            2**40,
            3,
            f"block_index * 16 + offset_in_block = {2**44 + 3}, not token_pos {2**44 + 4}",
        ),
        (2, 5, 0, 4, "block_index * 16 + offset_in_block = 4, not token_pos 5"),
        (2, 7, 0, 6, "block_index * 16 + offset_in_block = 6, not token_pos 7"),
        (3, 16, 0, 16, "offset_in_block 16 >= block size 16"),
    ]


def test_decompositions_follow_the_stored_block_size(tmp_path: Path) -> None:
    f = tmp_path / "virtual_token.facts"
    f.write_text("1\t16\t0\t16\n1\t17\t1\t1\n")
    with pagedkv_sql.connect(":memory:") as db:
        db.load(f, block_size=32)
        assert view_rows(db, "diag_token_decomposition", "token_pos") == [(17,)]


def test_unresolved_tokens_are_listed_once_with_why(db: pagedkv_sql.Database) -> None:
    """Sequence 1 (table 10) has block 0 resident and block 1 nowhere; sequence 2 has no
    root; a token given twice is listed once; sequence numbers differ from table ids."""
    insert(db, "root_table", [(1, 10)])
    insert(db, "block_table_entry", [(10, 0, 256, 1)])
    insert(db, "swapped_block", [(10, 2, 4096)])
    insert(
        db,
        "virtual_token",
        [(1, 0, 0, 0), (1, 16, 1, 0), (1, 16, 1, 0), (1, 32, 2, 0), (2, 0, 0, 0)],
    )
    assert view_rows(db, "diag_unresolved_token") == [
        (1, 16, 1, 0, "block 1 of block table 10 is neither resident nor swapped"),
        (2, 0, 0, 0, "no root_table row for seq_id 2"),
    ]


def test_an_orphan_table_counts_its_distinct_blocks(db: pagedkv_sql.Database) -> None:
    insert(db, "root_table", [(1, 10)])
    insert(
        db,
        "block_table_entry",
        [(10, 0, 256, 1), (20, 0, 512, 1), (20, 0, 512, 1), (20, 1, 768, 1)],
    )
    insert(db, "swapped_block", [(20, 2, 4096), (20, 2, 4096), (10, 1, 8192)])
    assert view_rows(
        db, "diag_orphan_block_table", "block_table_id, resident_blocks, swapped_blocks"
    ) == [(20, 2, 1)]
    assert view_rows(db, "diag_orphan_swapped_block", "block_table_id, block_index") == [(20, 2)]


def with_(**changes: list[tuple[int, ...]]) -> dict[str, list[tuple[int, ...]]]:
    return {r: CLEAN[r] + changes.get(r, []) for r in CLEAN}


CASES = [
    (
        "diag_refcount_mismatch",
        with_(block_table_entry=[(12, 0, 0x2000, 3)]),
        [0x2000, 1, [3], "12:0", "refcount 3 but 1 holder(s)"],
    ),
    (
        "diag_refcount_mismatch",
        with_(block_table_entry=[(12, 0, 0x1000, 3)]),
        [0x1000, 3, [2, 3], "10:0 11:0 12:0", "holders disagree on the refcount"],
    ),
    (
        "diag_conflicting_location",
        with_(swapped_block=[(10, 1, 0x8000)]),
        [10, 1, [0x1100], [0x8000], "resident and swapped at once"],
    ),
    (
        "diag_conflicting_location",
        with_(swapped_block=[(11, 1, 0x8000)]),
        [11, 1, None, [0x8000, 0x9000], "2 different CPU addresses"],
    ),
    (
        "diag_conflicting_root",
        with_(root_table=[(1, 11)]),
        [1, [10, 11], "2 block tables for one sequence"],
    ),
    (
        "diag_token_decomposition",
        with_(virtual_token=[(1, 40, 1, 3)]),
        [1, 40, 1, 3, "block_index * 16 + offset_in_block = 19, not token_pos 40"],
    ),
    (
        "diag_token_decomposition",
        with_(virtual_token=[(2, 21, 0, 21)]),
        [2, 21, 0, 21, "offset_in_block 21 >= block size 16"],
    ),
    (
        "diag_unresolved_token",
        with_(virtual_token=[(3, 0, 0, 0)]),
        [3, 0, 0, 0, "no root_table row for seq_id 3"],
    ),
    (
        "diag_unresolved_token",
        with_(virtual_token=[(2, 32, 2, 0)]),
        [2, 32, 2, 0, "block 2 of block table 11 is neither resident nor swapped"],
    ),
    (
        "diag_overlapping_blocks",
        with_(swapped_block=[(10, 9, 0x9010)]),
        [
            "cpu",
            0x9000,
            0x9010,
            "blocks at 36864 and 36880 overlap (16 bytes apart, block size 256)",
        ],
    ),
    (
        "diag_unaligned_cpu_address",
        with_(swapped_block=[(10, 9, 0x9010)]),
        [10, 9, 0x9010, "cpu_base_address 36880 is not 256-byte aligned"],
    ),
    (
        "diag_orphan_block_table",
        with_(block_table_entry=[(99, 0, 0x5000, 1)], swapped_block=[(99, 1, 0x6000)]),
        [99, 1, 1, "no root_table row points to block table 99"],
    ),
    (
        "diag_orphan_swapped_block",
        with_(swapped_block=[(99, 1, 0x6000)]),
        [99, 1, 0x6000, "swapped block of orphan block table 99"],
    ),
]


def findings(db: pagedkv_sql.Database) -> dict[str, list[list[Any]]]:
    return {
        r.name: [list(x.values()) for x in r.rows.to_pylist()]
        for r in db.check(limit=None).results
        if r.count
    }


def test_clean_data_has_no_findings(
    db: pagedkv_sql.Database, facts_dir: Callable[..., Path]
) -> None:
    load_facts(db, facts_dir, CLEAN)
    assert findings(db) == {}


@pytest.mark.parametrize(("check", "facts", "row"), CASES)
def test_each_diagnostic_names_the_offender(
    db: pagedkv_sql.Database,
    facts_dir: Callable[..., Path],
    check: str,
    facts: Any,
    row: list[Any],
) -> None:
    load_facts(db, facts_dir, facts)
    found = findings(db)
    assert row in found[check], found
    assert all(name.startswith("diag_") for name in found)


def test_block_size_setting_and_override(
    db: pagedkv_sql.Database, facts_dir: Callable[..., Path]
) -> None:
    load_facts(db, facts_dir, CLEAN)
    assert findings(db) == {}
    assert {r.name: r.count for r in db.check(block_size=8).results if r.count} == {
        "diag_token_decomposition": 2
    }
    db.load(
        facts_dir({"root_table": CLEAN["root_table"]}) / "root_table.facts",
        block_size=8,
        diagnostics=False,
    )
    assert db.setting("block_size") == 8
    assert findings(db)["diag_token_decomposition"][0][-1] == (
        "block_index * 8 + offset_in_block = 9, not token_pos 17"
    )


def _findings(db: pagedkv_sql.Database, name: str) -> list[dict[str, Any]]:
    result = next(r for r in db.check().results if r.name == name)
    return result.rows.drop_columns(["reason"]).to_pylist()


def test_diag_refcount_mismatch_counts_a_slot_listed_twice_as_one_holder(
    db: pagedkv_sql.Database,
) -> None:
    """Slot (100, 0) lists base 256 twice, with refcounts 1 and 2: one holder."""
    db.load_arrow("root_table", arrow_table("root_table", [(1, 100)]))
    db.load_arrow(
        "block_table_entry", arrow_table("block_table_entry", [(100, 0, 256, 1), (100, 0, 256, 2)])
    )
    assert _findings(db, "diag_refcount_mismatch") == [
        {"physical_block_base": 256, "holders": 1, "refcounts": [1, 2], "held_by": "100:0"}
    ]


def test_diag_conflicting_location_finds_a_swapped_block_at_two_cpu_addresses(
    db: pagedkv_sql.Database,
) -> None:
    db.load_arrow("swapped_block", arrow_table("swapped_block", [(101, 0, 4096), (101, 0, 8192)]))
    r = next(r for r in db.check().results if r.name == "diag_conflicting_location")
    assert [row["reason"] for row in r.rows.to_pylist()] == ["2 different CPU addresses"]


def test_diag_token_decomposition_names_only_the_wrong_token_of_a_sequence(
    db: pagedkv_sql.Database,
) -> None:
    db.load_arrow(
        "virtual_token",
        arrow_table("virtual_token", [(1, 0, 0, 0), (1, 1, 0, 1), (1, 17, 0, 17)]),
    )
    assert _findings(db, "diag_token_decomposition") == [
        {"seq_id": 1, "token_pos": 17, "block_index": 0, "offset_in_block": 17}
    ]


def test_the_token_decomposition_view_reads_the_stored_block_size(tmp_path: Path) -> None:
    """Token 16 at (0, 16) is right for block size 32: the view (what the DuckDB shell
    queries) takes the stored setting, not 16."""
    f = tmp_path / "virtual_token.facts"
    f.write_text("1\t16\t0\t16\n")
    with pagedkv_sql.connect(":memory:") as db:
        db.load(f, block_size=32)
        assert db.sql("SELECT count(*) FROM diag_token_decomposition").fetchall() == [(0,)]


def test_diag_overlapping_blocks_on_the_cpu_tier(db: pagedkv_sql.Database) -> None:
    """Addresses 256 bytes apart do not overlap, 128 apart do; a tier whose every address
    is a multiple of 128 but not all of 256 is still searched."""
    db.load_arrow(
        "swapped_block", arrow_table("swapped_block", [(100, 0, 100), (100, 1, 356), (100, 2, 612)])
    )
    assert _findings(db, "diag_overlapping_blocks") == []
    db.load_arrow("swapped_block", arrow_table("swapped_block", [(100, 0, 128), (100, 1, 256)]))
    assert _findings(db, "diag_overlapping_blocks") == [
        {"tier": "cpu", "lower_address": 128, "upper_address": 256}
    ]


def test_diag_orphan_block_table_counts_each_block_once(db: pagedkv_sql.Database) -> None:
    db.load_arrow(
        "block_table_entry", arrow_table("block_table_entry", [(500, 0, 256, 1), (500, 0, 512, 1)])
    )
    db.load_arrow("swapped_block", arrow_table("swapped_block", [(500, 1, 4096), (500, 1, 8192)]))
    assert _findings(db, "diag_orphan_block_table") == [
        {"block_table_id": 500, "resident_blocks": 1, "swapped_blocks": 1}
    ]


def test_a_negative_refcount_listed_twice_is_one_offending_row() -> None:
    rows = arrow_table("block_table_entry", [(100, 0, 256, -1), (100, 0, 256, -1)])
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(pagedkv_sql.ConstraintError) as e:
        db.load_arrow("block_table_entry", rows)
    assert e.value.total == 1 and len(e.value.violations) == 1


def test_a_token_inserted_twice_in_the_shell_is_one_finding(db: pagedkv_sql.Database) -> None:
    """The relations are sets: a row a DuckDB shell user inserted twice is one token, with
    one decomposition, not two."""
    db.con.execute("INSERT INTO virtual_token VALUES (1, 17, 0, 17), (1, 17, 0, 17)")
    r = next(r for r in db.check().results if r.name == "diag_token_decomposition")
    assert [row["reason"] for row in r.rows.to_pylist()] == ["offset_in_block 17 >= block size 16"]


def test_a_sequence_with_two_block_tables_is_a_conflicting_root(db: pagedkv_sql.Database) -> None:
    insert(db, "root_table", [(1, 10), (1, 20), (2, 30), (3, 3)])
    assert view_rows(db, "diag_conflicting_root") == [
        (1, [10, 20], "2 block tables for one sequence")
    ]
