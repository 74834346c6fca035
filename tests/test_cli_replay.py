"""The replay commands of the CLI (replay, kv-events) and what they print."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .conftest import Cli


def _dynamo_events(tmp_path: Path) -> Path:
    """A Dynamo JSON Lines stream with three findings: a gap, an unknown removal, a hash
    used after AllBlocksCleared."""
    import json

    def ev(n: int, data: Any) -> str:
        event = {"worker_id": 7, "event": {"event_id": n, "data": data, "dp_rank": 0}}
        return json.dumps({"timestamp": n, "event": event})

    stored = {"parent_hash": None, "blocks": [{"block_hash": 1, "tokens_hash": 5}]}
    later = {"parent_hash": 1, "blocks": [{"block_hash": 3, "tokens_hash": 7}]}
    lines = [
        ev(0, {"stored": stored}),
        ev(2, {"removed": {"block_hashes": [2]}}),
        ev(3, "cleared"),
        ev(4, {"stored": later}),
    ]
    path = tmp_path / "dynamo.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_kv_events_limit_shows_that_many_findings_and_zero_all(cli: Cli, tmp_path: Path) -> None:
    path = str(_dynamo_events(tmp_path))
    every: Any = cli("kv-events", path)
    assert every.exit_code == 1
    lines = every.stdout.splitlines()
    assert lines[0] == "4 event(s): 2 stored, 1 removed, 1 cleared"
    assert [line.split(": ")[1] for line in lines[1:-1]] == [
        "sequence_gap",
        "unknown_removal",
        "after_clear",
    ]
    assert lines[-1] == "3 finding(s)"
    assert cli("kv-events", path, "--limit", "0").stdout == every.stdout  # type: ignore[attr-defined]
    one: Any = cli("kv-events", path, "--limit", "1")
    assert one.stdout.splitlines()[1:] == [
        lines[1],
        "... and 2 more (--limit 0: all)",
        "3 finding(s)",
    ]


def test_replay_never_writes_its_events_over_its_log(cli: Cli) -> None:
    assert cli("synth", "--steps", "5", "log.jsonl").exit_code == 0  # type: ignore[attr-defined]
    before = (cli.cwd / "log.jsonl").read_bytes()
    result: Any = cli("replay", "log.jsonl", "--events", "log.jsonl")
    assert result.exit_code == 2
    assert "refusing to write log.jsonl: it is an input of this command" in result.stderr
    assert (cli.cwd / "log.jsonl").read_bytes() == before


def test_kv_events_json_is_indented_by_two(cli: Cli, tmp_path: Path) -> None:
    import json

    result: Any = cli("kv-events", str(_dynamo_events(tmp_path)), "--format", "json")
    document = json.loads(result.stdout)
    assert result.stdout == json.dumps(document, indent=2, default=str) + "\n"


def test_replay_limit_shows_that_many_findings_and_zero_all(cli: Cli) -> None:
    planted = ["--fault", "double_free@3", "--fault", "unaligned_cpu_address@6"]
    made: Any = cli("synth", "--steps", "12", *planted, "--fault", "evict_held@9", "f.jsonl")
    assert made.exit_code == 0, made.stderr
    one: Any = cli("replay", "f.jsonl", "--keep-going", "--limit", "1")
    assert one.exit_code == 1
    lines = one.stdout.splitlines()
    assert lines[2].split()[:2] == ["3", "double_free"]
    assert lines[3].startswith("... and ") and lines[3].endswith(" more (--limit 0 shows all)")
    every: Any = cli("replay", "f.jsonl", "--keep-going", "--limit", "0")
    assert "more (--limit 0 shows all)" not in every.stdout
    steps = [line.split()[0] for line in every.stdout.splitlines()[2:-1]]
    assert steps[0] == "3" and {"6", "9"} <= set(steps)
