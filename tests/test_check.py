"""check.py: the checks beyond the spec (diagnostics), their limits, labels and reports."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql.check import CheckReport

from .conftest import DATA, Cli, arrow_table


def test_request_labels_name_the_requests_of_the_ids_asked(db: pagedkv_sql.Database) -> None:
    """With a label view (an engine import makes one), each seq_id asked for gets its
    request id; no ids, no labels; without the view, none either."""
    from pagedkv_sql.check import LABEL_VIEW, request_labels

    assert request_labels(db.con, [1, 2]) == {}
    db.con.execute(
        f"CREATE VIEW {LABEL_VIEW} AS SELECT * FROM (VALUES (1::BIGINT, 'chat-a'), "
        "(2::BIGINT, 'chat-b'), (3::BIGINT, 'chat-c')) t(seq_id, request_id)"
    )
    assert request_labels(db.con, [2, 1, 2]) == {1: "chat-a", 2: "chat-b"}
    assert request_labels(db.con, []) == {}


def test_check_uses_the_stored_block_size_unless_given_one(db: pagedkv_sql.Database) -> None:
    """Token 16 at (block 0, offset 16) is wrong for the stored block size 16 and right
    for 32: the block size check() is given wins, the stored one is the default."""
    db.load_arrow("virtual_token", arrow_table("virtual_token", [(1, 16, 0, 16)]))

    def found(report: CheckReport) -> int:
        return next(r.count for r in report.results if r.name == "diag_token_decomposition")

    assert found(db.check()) == 1
    assert found(db.check(block_size=32)) == 0
    assert found(db.check(block_size=16)) == 1


def test_check_says_row_for_one_finding_and_rows_for_two(cli: Cli, tmp_path: Path) -> None:
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    one: Any = cli("check")
    assert "diag_unresolved_token (warning, 1 row):" in one.stdout
    extra = tmp_path / "more.facts"
    extra.write_text("1\t88\t5\t8\n")
    assert cli("load", str(extra), "--relation", "virtual_token", "--append").exit_code == 0  # type: ignore[attr-defined]
    two: Any = cli("check")
    assert "diag_unresolved_token (warning, 2 rows):" in two.stdout


def _probe_checks(db: pagedkv_sql.Database) -> dict[str, int]:
    return {r.name: r.count for r in db.check().results if r.name.startswith("diag_probe_")}


def test_a_capabilitys_check_runs_only_while_one_of_its_tables_has_rows(
    db: pagedkv_sql.Database,
) -> None:
    """A capability NAME keeps its facts in tables NAME_* and adds checks diag_NAME_*
    (an engine import: engine_*, diag_engine_*). Its checks run while any of its tables
    has a row, and not when all are empty; a table named just NAME is not one of them."""
    db.con.execute("CREATE TABLE probe_facts (seq_id BIGINT)")
    db.con.execute("CREATE TABLE probe_more (seq_id BIGINT)")
    db.con.execute("CREATE TABLE probe (seq_id BIGINT)")
    db.con.execute("INSERT INTO probe VALUES (7)")
    db.con.execute(
        "CREATE VIEW diag_probe_always AS SELECT 1::BIGINT AS seq_id, 'always' AS reason"
    )
    assert _probe_checks(db) == {}  # probe_facts and probe_more are empty
    for table in ("probe_facts", "probe_more"):  # either one's row is enough
        db.con.execute(f"INSERT INTO {table} VALUES (1)")
        assert _probe_checks(db) == {"diag_probe_always": 1}, table
        db.con.execute(f"DELETE FROM {table}")
    assert _probe_checks(db) == {}
    # a check of a capability without tables of its own always runs
    db.con.execute("CREATE VIEW diag_lone_always AS SELECT 'always' AS reason")
    assert "diag_lone_always" in {r.name for r in db.check().results}


def test_every_spec_check_names_the_relation_it_checks() -> None:
    """A spec check is run on the staged rows of its relation at load; one that named no
    relation would never run there."""
    from pagedkv_sql.check import all_checks

    checks = all_checks.__wrapped__()  # not the cached list: read constraints.sql now
    spec = {c.name: c.relation for c in checks if c.severity == "error"}
    assert spec == {
        "spec_unaligned_base": "block_table_entry",
        "spec_offset_out_of_block": "virtual_token",
        "spec_negative_refcount": "block_table_entry",
    }
    assert all(c.relation is None for c in checks if c.severity == "warning")


def test_check_limit_zero_counts_every_finding_and_lists_none(db: pagedkv_sql.Database) -> None:
    db.load(DATA)
    report = db.check(limit=0)
    assert (report.errors, report.warnings) == (0, 2)
    assert all(r.rows.num_rows == 0 for r in report.results)
    assert {r.name for r in report.results if r.count} == {
        "diag_refcount_mismatch",
        "diag_unresolved_token",
    }


def test_check_limit_caps_the_rows_not_the_count(db: pagedkv_sql.Database) -> None:
    """Three tokens in no block: a limit of 2 lists two, no limit lists all three."""
    db.load_arrow("virtual_token", arrow_table("virtual_token", [(9, i, 0, i) for i in range(3)]))

    def lost(report: CheckReport) -> tuple[int, int]:
        r = next(r for r in report.results if r.name == "diag_unresolved_token")
        return r.count, r.rows.num_rows

    assert lost(db.check(limit=2)) == (3, 2)
    assert lost(db.check(limit=None)) == (3, 3)
    assert lost(db.check()) == (3, 3)


def test_strict_refusal_lists_a_hundred_findings_of_a_check_and_counts_all() -> None:
    """Under --strict the diagnostics refuse the load; the error names the first hundred
    rows of each check (the rest are counted)."""
    tokens = arrow_table("virtual_token", [(9, i, i // 16, i % 16) for i in range(101)])
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(pagedkv_sql.ConstraintError) as e:
        db.load_arrow("virtual_token", tokens, strict=True)
    assert e.value.total == 101
    assert len(e.value.violations) == 100


def test_a_block_key_held_twice_is_found_whatever_the_scan_order(
    db: pagedkv_sql.Database,
) -> None:
    """Block (100, 0) at two GPU bases: keys that are not unique are never passed off as
    proven unique (which would skip the grouping that finds them); unique keys in
    ascending order still find a block both resident and swapped."""
    db.load_arrow(
        "block_table_entry",
        arrow_table("block_table_entry", [(100, 0, 256, 1), (100, 0, 512, 1), (100, 1, 768, 1)]),
    )

    def conflicts() -> list[str]:
        r = next(r for r in db.check().results if r.name == "diag_conflicting_location")
        return [row["reason"] for row in r.rows.to_pylist()]

    assert conflicts() == ["2 different GPU bases"]
    db.load_arrow("block_table_entry", arrow_table("block_table_entry", [(100, 0, 256, 1)]))
    db.load_arrow("swapped_block", arrow_table("swapped_block", [(100, 0, 4096)]))
    assert conflicts() == ["resident and swapped at once"]


# run alone and first for a mutant of check.py, load.py or sqlfiles.py at import
# (tools/mutate.toml [import_tests]): a frozen=True dropped from their values fails here
def test_what_load_and_check_return_are_immutable_values(db: pagedkv_sql.Database) -> None:
    """A load's report, a check's report and their parts."""
    loaded = db.load(DATA)
    checked = db.check()
    assert checked.errors == 0 and loaded.relations[0].rows_read > 0
    parts = [
        (loaded, "warnings"),
        (loaded.relations[0], "rows_read"),
        (checked, "results"),
        (checked.results[0], "count"),
        (checked.results[0].check, "severity"),
    ]
    for value, name in parts:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, None)
