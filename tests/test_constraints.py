"""sql/constraints.sql: the spec's constraints and the diagnostics' views, on their boundaries."""

from __future__ import annotations

from pathlib import Path

import pytest

import pagedkv_sql
from pagedkv_sql.errors import ConstraintError

from .conftest import _insert, _view


def _findings(db: pagedkv_sql.Database) -> dict[str, int]:
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
    _insert(
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
    assert _view(db, "diag_refcount_mismatch") == expected
    report = db.check()
    (result,) = [r for r in report.results if r.name == "diag_refcount_mismatch"]
    assert result.count == 4


def test_sorted_unique_keys_are_proven_unique_and_refcounts_still_checked(
    db: pagedkv_sql.Database,
) -> None:
    """Keys in ascending order let check() count holders without grouping; holders saying
    2 and 3 for a base held twice still disagree, and an exact duplicate row (keys not
    strictly ascending) is not taken for a second holder."""
    _insert(db, "root_table", [(1, 1), (2, 2)])
    _insert(db, "block_table_entry", [(1, 0, 256, 2), (1, 1, 256, 3), (2, 0, 512, 1)])
    assert _findings(db) == {"diag_refcount_mismatch": 1}
    db.con.execute("DELETE FROM block_table_entry")
    _insert(db, "block_table_entry", [(1, 0, 256, 1), (1, 0, 256, 1), (1, 1, 512, 1)])
    assert _findings(db) == {}


def test_conflicting_locations_count_distinct_addresses(db: pagedkv_sql.Database) -> None:
    """Key (1, 0) at two GPU bases, one given twice; key (1, 1) at two CPU addresses; key
    (1, 2) resident and swapped; block 3 swapped only, beside resident blocks of its table."""
    _insert(db, "root_table", [(1, 1)])
    _insert(
        db, "block_table_entry", [(1, 0, 256, 1), (1, 0, 256, 1), (1, 0, 512, 1), (1, 2, 768, 1)]
    )
    _insert(
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
    assert _view(db, "diag_conflicting_location") == [
        (1, 0, [256, 512], None, "2 different GPU bases"),
        (1, 1, None, [4096, 8192], "2 different CPU addresses"),
        (1, 2, [768], [12288], "resident and swapped at once"),
    ]


def test_cpu_addresses_overlap_only_closer_than_256_bytes(db: pagedkv_sql.Database) -> None:
    """128 is aligned to 128 but not 256, so it is unaligned and 128 bytes from 256; 256
    and 512 are exactly 256 apart: no overlap."""
    _insert(db, "swapped_block", [(1, 0, 128), (1, 1, 256), (1, 2, 512)])
    assert _view(db, "diag_overlapping_blocks", "tier, lower_address, upper_address") == [
        ("cpu", 128, 256)
    ]
    assert _view(db, "diag_unaligned_cpu_address", "cpu_base_address") == [(128,)]


def test_token_decompositions_on_every_boundary(db: pagedkv_sql.Database) -> None:
    """Block index 2^31 (past 32 bits: the 128-bit branch) decomposes right; two wrong
    tokens of one sequence are two findings, not two decompositions of one token; a wrong
    row given twice is one finding; a right token beside a wrong one is not listed."""
    big = 2**31
    _insert(
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
    assert _view(db, "diag_token_decomposition") == [
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
        assert _view(db, "diag_token_decomposition", "token_pos") == [(17,)]


def test_unresolved_tokens_are_listed_once_with_why(db: pagedkv_sql.Database) -> None:
    """Sequence 1 (table 10) has block 0 resident and block 1 nowhere; sequence 2 has no
    root; a token given twice is listed once; sequence numbers differ from table ids."""
    _insert(db, "root_table", [(1, 10)])
    _insert(db, "block_table_entry", [(10, 0, 256, 1)])
    _insert(db, "swapped_block", [(10, 2, 4096)])
    _insert(
        db,
        "virtual_token",
        [(1, 0, 0, 0), (1, 16, 1, 0), (1, 16, 1, 0), (1, 32, 2, 0), (2, 0, 0, 0)],
    )
    assert _view(db, "diag_unresolved_token") == [
        (1, 16, 1, 0, "block 1 of block table 10 is neither resident nor swapped"),
        (2, 0, 0, 0, "no root_table row for seq_id 2"),
    ]


def test_an_orphan_table_counts_its_distinct_blocks(db: pagedkv_sql.Database) -> None:
    _insert(db, "root_table", [(1, 10)])
    _insert(
        db,
        "block_table_entry",
        [(10, 0, 256, 1), (20, 0, 512, 1), (20, 0, 512, 1), (20, 1, 768, 1)],
    )
    _insert(db, "swapped_block", [(20, 2, 4096), (20, 2, 4096), (10, 1, 8192)])
    assert _view(
        db, "diag_orphan_block_table", "block_table_id, resident_blocks, swapped_blocks"
    ) == [(20, 2, 1)]
    assert _view(db, "diag_orphan_swapped_block", "block_table_id, block_index") == [(20, 2)]
