"""Each diagnostic fires on data that has the defect and stays quiet on data that does not;
explain and stats on the seed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql

from .conftest import DATA, Cli

CLEAN: dict[str, list[tuple[int, ...]]] = {
    "root_table": [(1, 10), (2, 11)],
    "block_table_entry": [(10, 0, 0x1000, 2), (11, 0, 0x1000, 2), (10, 1, 0x1100, 1)],
    "virtual_token": [(1, 0, 0, 0), (1, 17, 1, 1), (2, 5, 0, 5), (2, 16, 1, 0)],
    "swapped_block": [(11, 1, 0x9000)],
}


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


def load(db: pagedkv_sql.Database, facts_dir: Callable[..., Path], facts: Any) -> None:
    db.load(facts_dir(facts), diagnostics=False)


def test_clean_data_has_no_findings(
    db: pagedkv_sql.Database, facts_dir: Callable[..., Path]
) -> None:
    load(db, facts_dir, CLEAN)
    assert findings(db) == {}


@pytest.mark.parametrize(("check", "facts", "row"), CASES)
def test_each_diagnostic_names_the_offender(
    db: pagedkv_sql.Database,
    facts_dir: Callable[..., Path],
    check: str,
    facts: Any,
    row: list[Any],
) -> None:
    load(db, facts_dir, facts)
    found = findings(db)
    assert row in found[check], found
    assert all(name.startswith("diag_") for name in found)


def test_block_size_setting_and_override(
    db: pagedkv_sql.Database, facts_dir: Callable[..., Path]
) -> None:
    load(db, facts_dir, CLEAN)
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


def test_explain_and_stats_on_the_seed(cli: Cli) -> None:
    cli("load", str(DATA))
    result: Any = cli("explain", "2", "16")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-1] == (
        "  => unresolved: block 1 of block table 101: neither resident (block_table_entry) "
        "nor swapped (swapped_block)"
    )
    result = cli("explain", "1", "31")
    assert result.exit_code == 0
    assert (
        result.stdout.splitlines()[-1] == "  => gpu tier: 536870912 + 15 = 536870927 (0x2000000f)"
    )
    result = cli("stats", "--format", "json")
    import json

    stats = json.loads(result.stdout)
    assert stats["missing_blocks"] == 1 and stats["swapped_blocks"] == 1
    assert stats["refcount_histogram"] == [
        {"refcount": 1, "physical_blocks": 3},
        {"refcount": 2, "physical_blocks": 1},
    ]


def test_sharing_and_fragmentation(
    db: pagedkv_sql.Database, facts_dir: Callable[..., Path]
) -> None:
    load(db, facts_dir, CLEAN)
    counts = db.stats().counts
    assert counts["blocks_saved_by_sharing"] == 1  # 10:0 and 11:0 share 0x1000
    assert counts["unused_token_slots_in_last_blocks"] == (32 - 18) + (32 - 17)
    assert counts["gpu_bytes"] == 2 * 256


def test_check_json_and_strict(cli: Cli) -> None:
    import json

    cli("load", str(DATA))
    result: Any = cli("check", "--format", "json")
    report = json.loads(result.stdout)
    assert (report["errors"], report["warnings"]) == (0, 2)
    assert cli("load", str(DATA), "--strict").exit_code == 1


def test_synth_is_consistent_and_anomalies_are_found(cli: Cli) -> None:
    result: Any = cli(
        "synth",
        "w",
        "--sequences",
        "50",
        "--mean-length",
        "100",
        "--swap-fraction",
        "0.1",
        "--seed",
        "3",
    )
    assert result.exit_code == 0, result.stderr
    assert cli("load", "w", "--strict").exit_code == 0
    result = cli(
        "synth",
        "a",
        "--sequences",
        "50",
        "--mean-length",
        "100",
        "--anomalies",
        "2",
        "-f",
        "parquet",
    )
    assert result.exit_code == 0
    cli("load", "a", "--no-diagnostics")
    report = __import__("json").loads(cli("check", "--format", "json").stdout)
    found = {c["name"]: c["count"] for c in report["checks"] if c["count"]}
    assert found["diag_orphan_block_table"] == 2
    assert found["diag_unresolved_token"] == 2
    assert found["diag_refcount_mismatch"] >= 1
