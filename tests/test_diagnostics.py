"""Each diagnostic fires on data that has the defect and stays quiet on data that does not;
explain and stats on the seed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

import pagedkv_sql

from .conftest import DATA, Cli, arrow_table

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


# -- findings are counted and sampled in bounded memory, whatever their number (issue 28) ----


@pytest.mark.parametrize("tokens", [200_000, 2_000_000])
def test_millions_of_findings_are_counted_under_a_small_memory_limit(
    tmp_path: Path, tokens: int
) -> None:
    """Every token unresolved (no block tables): one finding a token. Under an 80 MB limit
    and no spilling at all, check counts them all and keeps the first 100 in order (one
    aggregate: materializing every finding to sort it runs out of memory at 2M)."""
    import numpy as np

    path = tmp_path / "t.duckdb"
    pos = np.arange(tokens, dtype=np.int64) % 1000
    table = pa.table(
        {
            "seq_id": np.arange(tokens, dtype=np.int64) // 1000,
            "token_pos": pos,
            "block_index": pos // 16,
            "offset_in_block": pos % 16,
        }
    )
    with pagedkv_sql.connect(path) as db:
        db.load_arrow("virtual_token", table, diagnostics=False)
    config = {"memory_limit": "80MB", "max_temp_directory_size": "0B", "threads": 1}
    with pagedkv_sql.connect(path, read_only=True, config=config) as db:
        found = {r.check.name: r for r in db.check().results if r.count}
    assert list(found) == ["diag_unresolved_token"]
    result = found["diag_unresolved_token"]
    assert result.count == tokens
    first = [(v.values["seq_id"], v.values["token_pos"]) for v in result.violations]
    assert first == [(0, p) for p in range(100)]


def test_the_sample_is_the_first_rows_in_order_by_all_order() -> None:
    """The one-pass sample (count and ``min(row, n)``) gives exactly what sorting every
    row and taking the first n gives: duplicates, NULLs in any column, lists."""
    import random

    from pagedkv_sql.check import _TOTAL, _counted_sample

    con = duckdb.connect()
    con.execute("SELECT setseed(0.28)")
    rng = random.Random(28)
    for _ in range(25):
        n, k = rng.randint(0, 3000), rng.choice([1, 7, 100, 5000])
        con.execute(
            "CREATE OR REPLACE TABLE t AS SELECT "
            "CASE WHEN random() < 0.2 THEN NULL ELSE (random() * 5)::INT END AS a, "
            "CASE WHEN random() < 0.3 THEN NULL ELSE (random() * 3)::INT END AS b, "
            "CASE WHEN random() < 0.5 THEN NULL "
            "ELSE ['p', 'q'][1 + (random() * 1.9)::INT] END AS c, "
            f"[1, (random() * 2)::INT] AS l FROM range({n})"
        )
        expected = con.execute(f"SELECT * FROM t ORDER BY ALL LIMIT {k}").fetchall()
        got = con.execute(_counted_sample("t", k)).fetchall()
        assert [r[:-1] for r in got] == expected
        assert {r[-1] for r in got} <= {n}
        assert con.execute(_counted_sample("t", k)).description[-1][0] == _TOTAL
    con.close()


def test_unresolved_tokens_are_one_finding_each_proven_unique_or_not() -> None:
    """The runner drops the DISTINCT only when a streaming pass proved the token keys
    unique: tokens in key order (proven), out of order (not proven), and exact duplicate
    rows written behind the loader's back (not proven, made distinct)."""
    with pagedkv_sql.connect() as db:
        db.con.execute("INSERT INTO virtual_token VALUES (1, 0, 0, 0), (1, 1, 0, 1), (2, 0, 0, 0)")
        ordered = {r.check.name: r.count for r in db.check().results}["diag_unresolved_token"]
        db.con.execute("INSERT INTO virtual_token VALUES (1, 1, 0, 1), (1, 0, 0, 0)")
        doubled = {r.check.name: r for r in db.check().results}["diag_unresolved_token"]
        proof = db.con.execute(
            "SELECT * FROM pagedkv_block_keys_ascending('pagedkv_token_keys')"
        ).fetchall()
    assert ordered == 3 and doubled.count == 3 and proof == [(False,)]
    keys = [(v.values["seq_id"], v.values["token_pos"]) for v in doubled.violations]
    assert keys == [(1, 0), (1, 1), (2, 0)]
