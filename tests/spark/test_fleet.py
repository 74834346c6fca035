"""`spark fleet check` against DuckDB's `fleet check` (the Spark tier's differential test):
every hand-built fleet of tests/fleet_fixtures.py (clean, and one a cause) gives the same
rows on both, in every derived relation of sql/fleet.sql, every check and the summary, and
the same findings; the CLI's exit codes."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import pagedkv_sql
from pagedkv_sql import fleet
from pagedkv_sql.cli import app

from .. import fleet_fixtures as ff

pytestmark = pytest.mark.spark

RELATIONS = (
    "fleet_truth",
    "fleet_claimed_steps",
    "fleet_claimed",
    "fleet_belief",
    "fleet_compare",
    "fleet_mismatch",
    "fleet_gap",
    "fleet_restart",
    "fleet_fold",
    "fleet_residency",
    "fleet_decision_truth",
    "fleet_decision_check",
)
CHECKS = (
    "fleet_check_false_residency",
    "fleet_check_missed_residency",
    "fleet_check_prefix_false_hit",
    "fleet_check_misroute",
    "fleet_summary",
)


def _restart(clear: bool, ignored: bool = False) -> ff.Fleet:
    scenario = ff.clean()
    scenario.restart(7, "r0", clear=clear)
    scenario.routers["dynamo"].ignore_clear = ignored
    return scenario


def _merged() -> ff.Fleet:
    scenario = ff.clean()
    scenario.replicas["r1"].worker_id = 0
    scenario.replicas["r1"].dp_rank = 1
    scenario.merge_ranks = True
    return scenario


def _chained() -> ff.Fleet:
    scenario = ff.clean()
    scenario.routers["dynamo"].tree = True
    scenario.store(3, "r1", 31)
    scenario.store(4, "r1", 32, parent=31)
    scenario.store(4, "r1", 41)
    scenario.store(5, "r1", 33, parent=32)
    scenario.store(5, "r1", 51)
    scenario.routers["dynamo"].skip.add(("r1", 3))
    return scenario


def _hybrid(indexed_as_prefix: bool) -> ff.Fleet:
    scenario = ff.Fleet(routers=(ff.Router("dynamo", groups=None if indexed_as_prefix else (0,)),))
    scenario.groups = [
        {"group": 0, "kind": "full_attention", "block_size": ff.BLOCK},
        {"group": 1, "kind": "sliding_window", "block_size": ff.BLOCK, "sliding_window": 32},
    ]
    scenario.store(1, "r0", 11, 12)
    scenario.store(1, "r0", 11, 12, group=1)
    scenario.evict(4, "r0", 11, group=1)
    if not indexed_as_prefix:  # a false hit whose hashes are unknown: an unindexed group
        scenario.decide(5, "q1", "r0", [11, 12], predicted={"r0": 2}, cached_blocks=0)
        scenario.decisions[-1].pop("hashes")
    return scenario


def _folded() -> ff.Fleet:
    scenario = ff.clean()
    for r in scenario.replicas.values():
        for ops in r.steps.values():
            for op in ops:
                if "hashes" in op:
                    op["hashes"] = [ff.hex16(int(h, 16) ^ (1 << 40)) for h in op["hashes"]]
    return scenario


def _sampled() -> ff.Fleet:
    scenario = ff.router_lost_removal()
    scenario.index_every = 4
    return scenario


def _line_dropped() -> ff.Fleet:
    scenario = ff.clean()
    scenario.routers["dynamo"].skip.add(("r0", 5))
    scenario.replicas["r0"].dropped_lines.add(1)
    return scenario


SCENARIOS: dict[str, Callable[[], ff.Fleet]] = {
    "clean": ff.clean,
    "router_lost_removal": ff.router_lost_removal,
    "duplicate_copy": ff.duplicate_copy,
    "over_predicted": ff.over_predicted,
    "misrouted": ff.misrouted,
    "line_dropped": _line_dropped,
    "restart_without_clear": lambda: _restart(clear=False),
    "clear_ignored": lambda: _restart(clear=True, ignored=True),
    "merged_dp_ranks": _merged,
    "chained_onto_a_lost_parent": _chained,
    "sliding_window_as_prefix": lambda: _hybrid(True),
    "unindexed_group": lambda: _hybrid(False),
    "hash_fold_mismatch": _folded,
    "index_every_4": _sampled,
}


def _value(v: Any) -> Any:
    # a sum of doubles may round differently in another order: equal to 12 digits
    return float(f"{v:.12g}") if isinstance(v, float) and math.isfinite(v) else v


def _rows(columns: list[str], rows: list[tuple[Any, ...]]) -> tuple[list[str], Counter[Any]]:
    return columns, Counter(tuple(_value(v) for v in r) for r in rows)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_spark_gives_duckdbs_rows_on_every_fixture(spark: Any, tmp_path: Path, name: str) -> None:
    from pagedkv_sql.fleet.tables import sql
    from pagedkv_sql.spark import fleet as spark_fleet

    spark.conf.set("spark.sql.shuffle.partitions", "1")  # tiny inputs: one task a stage
    directory = SCENARIOS[name]().write(tmp_path / "fleet")
    statements = sql()
    with pagedkv_sql.connect(":memory:") as db:
        expected = fleet.check(db, directory)
        duck = {}
        for relation in (*RELATIONS, *CHECKS):
            query = statements.get(relation, f"SELECT * FROM {relation}")
            result = db.sql(query)
            duck[relation] = _rows(result.columns, result.fetchall())
    got = spark_fleet.check(spark, directory, parquet=tmp_path / "parquet")
    for relation in (*RELATIONS, *CHECKS):
        columns = duck[relation][0]
        if relation in statements:
            frame = spark.sql(spark_fleet.spark_query(statements[relation]))
        else:
            frame = spark.table(relation).select(*columns)
        assert _rows(frame.columns, [tuple(r) for r in frame.collect()]) == duck[relation], relation
    assert got.findings == expected.findings
    assert [{k: _value(v) for k, v in s.items()} for s in got.summary] == [
        {k: _value(v) for k, v in s.items()} for s in expected.summary
    ]
    assert (got.counts, got.misroute_checked) == (expected.counts, expected.misroute_checked)
    if name != "clean":  # every fixture but the clean one is found: the test can fail
        assert got.findings


def test_spark_fleet_check_exits_0_clean_and_1_with_findings(spark: Any, tmp_path: Path) -> None:
    runner = CliRunner()
    clean = runner.invoke(app, ["spark", "fleet", "check", str(ff.clean().write(tmp_path / "a"))])
    assert clean.exit_code == 0, clean.output
    lost = ff.router_lost_removal().write(tmp_path / "b")
    found = runner.invoke(app, ["spark", "fleet", "check", str(lost), "-f", "json"])
    assert found.exit_code == 1, found.output
    document = json.loads(found.stdout)
    assert [(f["invariant"], f["cause"]) for f in document["findings"]] == [
        ("false_residency", "sequence_gap")
    ]
    missing = runner.invoke(app, ["spark", "fleet", "check", str(tmp_path / "none")])
    assert missing.exit_code == 2
