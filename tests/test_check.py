"""check.py: the checks beyond the spec (diagnostics), their limits, labels and reports."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql import UsageError
from pagedkv_sql.check import CheckReport
from pagedkv_sql.errors import ConstraintError

from .helpers import DATA, Cli, arrow_table, load_arrow_facts, loaded, unresolved


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


def test_a_check_result_as_violations_keeps_the_row_apart_from_the_reason(
    db: pagedkv_sql.Database,
) -> None:
    from .helpers import DATA

    db.load(DATA)
    result = next(r for r in db.check().results if r.name == "diag_unresolved_token")
    (violation,) = result.violations
    assert set(violation.values) == {"seq_id", "token_pos", "block_index", "offset_in_block"}
    assert violation.reason == result.rows.column("reason")[0].as_py()
    assert violation.relation == "unresolved_token"  # a diagnostic: named by its check
    with pytest.raises(ConstraintError) as info:  # a spec check names the relation
        load_arrow_facts(db, {"block_table_entry": [(1, 0, 256, -1)]})
    assert [v.relation for v in info.value.violations] == ["block_table_entry"]


def test_check_reports_the_two_seed_findings(db: pagedkv_sql.Database) -> None:
    db.load(DATA)
    report = db.check()
    assert report.errors == 0
    assert {r.name: r.count for r in report.results if r.count} == {
        "diag_refcount_mismatch": 1,
        "diag_unresolved_token": 1,
    }
    assert report.ok() and not report.ok(strict=True)


def test_check_keeps_a_hundred_rows_of_each_by_default_the_limit_given_or_all() -> None:
    tokens = arrow_table("virtual_token", unresolved(130)["virtual_token"])
    with pagedkv_sql.connect(":memory:") as db:
        db.load_arrow("virtual_token", tokens)
        for options, kept in [
            ({}, 100),
            ({"limit": 0}, 0),
            ({"limit": 127}, 127),
            ({"limit": None}, 130),
            ({"limit": 2**62}, 130),
            ({"limit": 2**63 - 1}, 130),
            ({"limit": 2**63}, 130),  # beyond DuckDB's BIGINT LIMIT: no LIMIT at all
            ({"limit": 2**64}, 130),
        ]:
            found = {r.name: r for r in db.check(**options).results}["diag_unresolved_token"]
            assert (found.count, found.rows.num_rows) == (130, kept), options
        with pytest.raises(pagedkv_sql.UsageError, match="limit must be 0 or more"):
            db.check(limit=-1)


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


def test_check_limit_bounds(cli: Cli) -> None:
    loaded(cli)
    result: Any = cli("check", "--limit", "9223372036854775808")
    assert result.exit_code == 0, result.stderr
    assert "diag_unresolved_token" in result.stdout
    result = cli("check", "--limit", "-1")
    assert result.exit_code == 2
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb", read_only=True) as db:
        with pytest.raises(UsageError, match=r"limit must be 0 or more rows .*not -1"):
            db.check(limit=-1)
        assert db.check(limit=2**64).warnings == 2


def test_check_report_repr_is_short(db: pagedkv_sql.Database) -> None:
    db.load(DATA)
    report = db.check(limit=None)
    assert repr(report) == (
        "CheckReport(errors=0, warnings=2, diag_refcount_mismatch=1, diag_unresolved_token=1)"
    )
    assert repr(report.results[0]).startswith(
        "CheckResult('spec_unaligned_base', 'error', count=0)"
    )


def test_a_report_lists_errors_first_then_causes_before_consequences(db: Any) -> None:
    """The spec's constraints first, then the diagnostics by the catalogue's rank: a leak
    (an orphan block table) before the refcounts it breaks, before the unresolved tokens."""
    from pagedkv_sql import invariants

    results = db.check().results
    names = [r.name for r in results]
    errors = [n for n in names if n.startswith("spec_")]
    assert names[: len(errors)] == errors
    ranks = [invariants.BY_NAME[r.invariant].rank for r in results[len(errors) :]]
    assert ranks == sorted(ranks)
    assert names.index("diag_orphan_block_table") < names.index("diag_refcount_mismatch")
    assert names.index("diag_refcount_mismatch") < names.index("diag_unresolved_token")
    assert {r.invariant for r in db.check().results} >= {"leak", "ref_count", "unresolved_token"}
