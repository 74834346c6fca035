"""inspect.py and sql/inspect.sql: explain and stats."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import pagedkv_sql

from .helpers import CLEAN, DATA, arrow_table, insert, load_facts


def test_stats_counts_a_token_with_two_decompositions_once(db: pagedkv_sql.Database) -> None:
    """A token listed twice (two decompositions, a diagnostic) is still one token."""
    db.load_arrow("virtual_token", arrow_table("virtual_token", [(1, 0, 0, 0), (1, 0, 1, 0)]))
    assert db.stats().counts["tokens"] == 1


def test_explain_and_stats_give_immutable_values(db: pagedkv_sql.Database) -> None:
    """What explain() and stats() return can be kept and compared: nothing in it can be
    changed under the caller, and a resolution can go in a set."""
    db.load(DATA)
    e = db.explain(1, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.broken = "somewhere"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.hops[0].block_index = 1  # type: ignore[misc]
    r = e.resolutions[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.base = 0  # type: ignore[misc]
    assert {r, dataclasses.replace(r)} == {r}
    s = db.stats()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.counts = {}  # type: ignore[misc]


def test_stats_count_missing_swapped_and_resident_blocks_apart(db: pagedkv_sql.Database) -> None:
    db.load(DATA)
    counts = db.stats().counts
    assert (counts["resident_blocks"], counts["swapped_blocks"], counts["missing_blocks"]) == (
        4,
        1,
        1,
    )


def _stats_cache(db: pagedkv_sql.Database) -> None:
    """Sequence 1 (table 10): 64 tokens, blocks 0-2 resident (block 2 with a CPU copy),
    block 3 swapped. Sequence 2 (table 20): 20 tokens, block 0 shares base 256 with
    sequence 1, block 1 nowhere."""
    insert(db, "root_table", [(1, 10), (2, 20)])
    insert(db, "virtual_token", [(1, p, p // 16, p % 16) for p in range(64)])
    insert(db, "virtual_token", [(2, p, p // 16, p % 16) for p in range(20)])
    insert(
        db,
        "block_table_entry",
        [(10, 0, 256, 2), (10, 1, 512, 1), (10, 2, 768, 1), (20, 0, 256, 2)],
    )
    insert(db, "swapped_block", [(10, 2, 4096), (10, 3, 8192)])


def test_stats_of_a_cache_with_every_kind_of_block(db: pagedkv_sql.Database) -> None:
    _stats_cache(db)
    stats = db.stats()
    assert stats.counts == {
        "sequences": 2,
        "tokens": 84,
        "logical_blocks": 6,
        "resident_blocks": 4,
        "swapped_blocks": 1,
        "missing_blocks": 1,
        "resident_blocks_with_cpu_copy": 1,
        "physical_gpu_blocks": 3,
        "physical_cpu_blocks": 2,
        "blocks_saved_by_sharing": 1,
        "unused_token_slots_in_last_blocks": 12,  # 64 fills its last block; 20 leaves 12
        "block_size_tokens": 16,
        "gpu_bytes": 768,
        "cpu_bytes": 512,
    }
    assert stats.refcount_histogram == [(1, 2), (2, 1)]


def test_explain_gives_each_address_as_base_plus_offset(db: pagedkv_sql.Database) -> None:
    _stats_cache(db)
    found = db.explain(1, 37)
    assert [(r.tier, r.base, r.physical_address) for r in found.resolutions] == [
        ("gpu", 768, 773),
        ("cpu", 4096, 4101),
    ]
    assert found.roots == [10] and found.decompositions == [(2, 5)] and found.broken is None


def test_explanations_are_immutable_and_resolutions_hashable(db: pagedkv_sql.Database) -> None:
    _stats_cache(db)
    found = db.explain(1, 37)
    assert len({*found.resolutions, *found.resolutions}) == 2
    for value, name in [
        (found, "broken"),
        (found.hops[0], "block_index"),
        (found.resolutions[0], "base"),
        (db.stats(), "counts"),
    ]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, None)


@pytest.mark.parametrize("args", [("a", 0), (0, None), (0, 1.0), (True, 0)])
def test_explain_refuses_what_is_no_token(db: pagedkv_sql.Database, args: Any) -> None:
    """Database.explain("a", None) is a UsageError, not an Explanation."""
    with pytest.raises(pagedkv_sql.UsageError, match="must be an integer"):
        db.explain(*args)


@pytest.mark.parametrize("args", [(2**70, 0), (0, 2**63), (-(2**63) - 1, 0)])
def test_explain_refuses_a_number_no_row_can_hold(db: pagedkv_sql.Database, args: Any) -> None:
    """explain(2**70, 0) is a UsageError, not an empty Explanation (the CLI refuses
    the same number as out of the signed 64-bit range)."""
    with pytest.raises(pagedkv_sql.UsageError, match="out of the signed 64-bit range"):
        db.explain(*args)
    assert db.explain(-(2**63), 2**63 - 1).seq_id == -(2**63)  # the ends themselves are fine


def test_sharing_and_fragmentation(
    db: pagedkv_sql.Database, facts_dir: Callable[..., Path]
) -> None:
    load_facts(db, facts_dir, CLEAN)
    counts = db.stats().counts
    assert counts["blocks_saved_by_sharing"] == 1  # 10:0 and 11:0 share 0x1000
    assert counts["unused_token_slots_in_last_blocks"] == (32 - 18) + (32 - 17)
    assert counts["gpu_bytes"] == 2 * 256


def test_stats_near_int64_limits_and_defined_figures(tmp_path: Path) -> None:
    top = 2**63 - 1
    with pagedkv_sql.connect(tmp_path / "s.duckdb") as db:
        db.load(DATA)
        s = db.stats().counts
        assert (
            s["logical_blocks"]
            == s["resident_blocks"] + s["swapped_blocks"] + (s["missing_blocks"])
        )
        assert (s["logical_blocks"], s["resident_blocks"], s["swapped_blocks"]) == (6, 4, 1)
        assert s["missing_blocks"] == 1
        # one logical block with three GPU bases shares nothing
        db.load_arrow(
            "block_table_entry",
            pa.table(
                {
                    "block_table_id": [9, 9, 9],
                    "block_index": [0, 0, 0],
                    "physical_block_base": [256, 512, 768],
                    "refcount": [1, 1, 1],
                }
            ),
            diagnostics=False,
        )
        assert db.stats().counts["blocks_saved_by_sharing"] == 0
        db.load_arrow(
            "virtual_token",
            pa.table(
                {
                    "seq_id": [1, 1],
                    "token_pos": [top, -5],
                    "block_index": [top // 16, 0],
                    "offset_in_block": [15, 0],
                }
            ),
            diagnostics=False,
        )
        s = db.stats(256).counts
        assert s["unused_token_slots_in_last_blocks"] == 0  # 2^63 is a multiple of 256
