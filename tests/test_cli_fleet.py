"""`pagedkv-sql fleet check DIR`: the summary first, then the findings; `-f json`; exit 0
clean, 1 with findings, 2 for a directory it cannot read (an Error and a Fix line, the file
and line named, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from . import fleet_fixtures as ff
from .helpers import Cli


def write(cli: Cli, scenario: ff.Fleet) -> Path:
    return scenario.write(cli.cwd / "fleet")


def test_a_clean_fleet_exits_0_with_its_summary(cli: Cli) -> None:
    result: Any = cli("fleet", "check", str(write(cli, ff.clean())))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1].split()[:3] == ["router", "kind", "false_res"]
    assert lines[2].startswith("dynamo (routed)  dynamo_radix_tree")
    assert lines[-1] == "no findings"


def test_findings_exit_1_in_the_house_shape_with_cause_and_fault(cli: Cli) -> None:
    result: Any = cli("fleet", "check", str(write(cli, ff.router_lost_removal())))
    assert result.exit_code == 1, result.output
    assert "1 finding(s): 1 router" in result.output
    assert "t=0.05s: false_residency: router dynamo's index claims block hash 13" in result.output
    assert "  false_residency (fleet): replica r0; router dynamo; hash 13; fault router" in (
        result.output
    )
    assert "  cause: sequence_gap" in result.output


def test_json_carries_each_findings_idea_check_replica_router_hash_cause_fault(cli: Cli) -> None:
    result: Any = cli("fleet", "check", str(write(cli, ff.duplicate_copy())), "-f", "json")
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert [s["router"] for s in doc["summary"]] == ["dynamo"]
    (f,) = doc["findings"]
    assert {
        k: f[k] for k in ("invariant", "check", "replica", "router", "hash", "cause", "fault")
    } == {
        "invariant": "missed_residency",
        "check": "missed_residency",
        "replica": "r1",
        "router": None,
        "hash": "21",
        "cause": "duplicate_copy_removed",
        "fault": "engine",
    }
    clean: Any = cli("fleet", "check", str(write(cli, ff.clean())), "-f", "json")
    assert clean.exit_code == 0 and json.loads(clean.output)["findings"] == []


def test_lag_and_db_keep_the_tables(cli: Cli) -> None:
    path = write(cli, ff.duplicate_copy())
    assert cli("fleet", "check", str(path), "--lag", "0.05").exit_code == 0  # type: ignore[attr-defined]
    result: Any = cli("fleet", "check", str(path), "--db", "f.duckdb")
    assert result.exit_code == 1
    kept: Any = cli("sql", "SELECT count(*) AS n FROM fleet_truth", "--db", "f.duckdb")
    assert kept.exit_code == 0 and kept.output.splitlines()[1] == "8"


def _break(path: Path, file: str, line: int, text: str) -> None:
    target = path / file
    lines = target.read_text().splitlines()
    lines[line - 1] = text
    target.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("file", "line", "text", "said"),
    [
        ("replica=r0/events.jsonl", 2, "{not json", "replica=r0/events.jsonl, line 2: not JSON"),
        (
            "replica=r0/events.jsonl",
            2,
            '{"ts": 0.05, "events": []}',
            "line 2: a batch needs its sequence number",
        ),
        (
            "replica=r0/events.jsonl",
            1,
            '{"seq": 0, "ts": 0, "events": [["BlockStored", ["x"]]]}',
            "replica=r0/events.jsonl",
        ),
        (
            "router=dynamo/index.jsonl",
            1,
            '{"dump": []}',
            "index.jsonl, line 1: an index dump needs its time",
        ),
        (
            "router=dynamo/index.jsonl",
            1,
            '{"t": 0, "dump": [{"worker_id": 9, "event": {}}]}',
            "worker_id 9 is no replica",
        ),
        ("decisions.jsonl", 1, '{"request": "q1"}', "decisions.jsonl, line 1: 'router' is missing"),
        (
            "replica=r1/steps.jsonl",
            2,
            '{"step": 1, "ops": [{"op": "cache", "blocks": [1]}]}',
            "steps.jsonl, line 2: cache needs 'hashes', one a block",
        ),
        (
            "replica=r1/steps.jsonl",
            1,
            '{"block_size": 16}',
            "steps.jsonl, line 1: the step log's header",
        ),
    ],
)
def test_a_bad_line_is_named_with_its_file_and_exits_2(
    cli: Cli, file: str, line: int, text: str, said: str
) -> None:
    path = write(cli, ff.clean())
    _break(path, file, line, text)
    result: Any = cli("fleet", "check", str(path))
    assert result.exit_code == 2, result.output
    assert "Error: " in result.output and said in result.output
    assert "Fix: " in result.output and "Traceback" not in result.output


def test_a_directory_without_fleet_json_exits_2(cli: Cli) -> None:
    path = write(cli, ff.clean())
    (path / "fleet.json").unlink()
    result: Any = cli("fleet", "check", str(path))
    assert result.exit_code == 2
    assert "fleet.json: missing" in result.output and "Fix: " in result.output
    missing: Any = cli("fleet", "check", str(cli.cwd / "nowhere"))
    assert missing.exit_code == 2 and "no such directory" in missing.output


def test_a_single_dynamo_dump_is_the_index_at_the_end(cli: Cli) -> None:
    """A router's index as one GET /dump document (no time): read at the end of the run."""
    path = write(cli, ff.clean())
    index = path / "router=dynamo" / "index.jsonl"
    last = json.loads(index.read_text().splitlines()[-1])
    index.unlink()
    (path / "router=dynamo" / "index.json").write_text(json.dumps({"events": last["dump"]}))
    result: Any = cli("fleet", "check", str(path), "-f", "json")
    doc = json.loads(result.output)
    # before the one dump the index held nothing: each stored block learned late
    assert result.exit_code == 1 and {f["cause"] for f in doc["findings"]} <= {None, "sequence_gap"}
    assert {f["check"] for f in doc["findings"]} == {"missed_residency"}
