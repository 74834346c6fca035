"""The replay commands of the CLI (replay, diff) and what they print."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .helpers import Cli
from .steplogs import BASE, HEADER, alloc, append


def test_replay_never_writes_its_events_over_its_log(cli: Cli) -> None:
    assert cli("synth", "--steps", "5", "log.arrow").exit_code == 0  # type: ignore[attr-defined]
    before = (cli.cwd / "log.arrow").read_bytes()
    result: Any = cli("replay", "log.arrow", "--events", "log.arrow")
    assert result.exit_code == 2
    assert "refusing to write log.arrow: it is an input of this command" in result.stderr
    assert (cli.cwd / "log.arrow").read_bytes() == before


def test_replay_events_are_written_as_their_name_says_or_refused_before_the_run(
    cli: Cli,
) -> None:
    """--events ev.parquet.gz: Parquet, gzipped; --events ev.jsonl (no event table is JSON
    Lines) is refused before the log is stored, never written as Arrow under that name."""
    assert cli("synth-log", "log.jsonl.gz", "--steps", "5").exit_code == 0  # type: ignore[attr-defined]
    assert (cli.cwd / "log.jsonl.gz").read_bytes()[:2] == b"\x1f\x8b"
    refused: Any = cli("replay", "log.jsonl.gz", "--events", "ev.jsonl")
    assert refused.exit_code == 2
    assert refused.stderr.startswith("Error: ev.jsonl: an event table is written as .parquet")
    assert not (cli.cwd / "pagedkv.duckdb").exists() and not (cli.cwd / "ev.jsonl").exists()
    assert cli("replay", "log.jsonl.gz", "--events", "ev.parquet.gz").exit_code == 0  # type: ignore[attr-defined]
    assert (cli.cwd / "ev.parquet.gz").read_bytes()[:2] == b"\x1f\x8b"
    again: Any = cli("replay", "ev.parquet.gz", "--db", "again.duckdb")
    assert again.exit_code == 0 and "replayed 5 step(s)" in again.stdout


def test_replay_limit_shows_that_many_findings_and_zero_all(cli: Cli) -> None:
    planted = ["--fault", "double_free@3", "--fault", "unaligned_cpu_address@6"]
    made: Any = cli("synth", "--steps", "12", *planted, "--fault", "evict_held@9", "f.jsonl")
    assert made.exit_code == 0, made.stderr
    one: Any = cli("replay", "f.jsonl", "--keep-going", "--limit", "1")
    assert one.exit_code == 1
    lines = one.stdout.splitlines()
    assert lines[2].split()[:3] == ["step", "3", "double_free"]
    assert lines[3].startswith("... and ") and lines[3].endswith(" more (--limit 0 shows all)")
    every: Any = cli("replay", "f.jsonl", "--keep-going", "--limit", "0")
    assert "more (--limit 0 shows all)" not in every.stdout
    steps = [line.split()[1] for line in every.stdout.splitlines()[2:-1]]
    assert steps[0] == "3" and {"6", "9"} <= set(steps)


def test_cli_replay_first_and_all(cli: Cli, tmp_path: Path) -> None:
    steps = [
        *BASE,
        {"step": 3, "ops": [alloc("c", 2)]},
        {"step": 4, "finished": ["c"], "ops": [append("c", 1)]},
    ]
    log = tmp_path / "run.jsonl"
    log.write_text("\n".join([json.dumps(HEADER)] + [json.dumps(s) for s in steps]) + "\n")
    result: Any = cli("replay", str(log))
    assert result.exit_code == 1
    assert result.stdout == (
        "replayed 5 step(s), 17 event(s), 3 request(s)\n"
        "step 3: use_after_free: block 2 handed to request c (allocate) while request(s) a "
        "hold it\n"
        "  fresh_while_held (replay): requests c, a; block 2; event 13; op allocate; "
        "block_index 0; expected no holder; found 1 holder(s)\n"
    )
    result = cli("replay", "--keep-going", "--format", "json")
    assert result.exit_code == 1
    found = json.loads(result.stdout)
    assert [(f["invariant"], f["check"], f["step"]) for f in found["findings"]] == [
        ("use_after_free", "fresh_while_held", 3),
        ("stale_token", "stale_token", 3),
        ("freed_request_referenced", "freed_request_referenced", 4),
    ]
    stale = found["findings"][1]
    assert stale["cause"] == "use_after_free at step 3 (request c; block 2)", stale
    # --at: exit status counts findings up to that step
    result = cli("replay", "--at", "2")
    assert result.exit_code == 0, result.stdout
    assert "state at step 2 written" in result.stderr
    assert cli("resolve").stdout.count("\n") == 12
    assert cli("diff", "--from", "2", "--to", "3").exit_code == 0
    assert cli("replay", "--at", "99").exit_code == 2
    assert cli("diff", str(log), "--from", "0", "--to", "1").stdout.endswith(
        "from step 0 to step 1: entry added 2, refcount 2, request arrived 1, tokens 1\n"
    )


def test_replay_without_a_log_is_a_clear_error(cli: Cli) -> None:
    result: Any = cli("replay")
    assert result.exit_code == 2
    assert "no step log in this database" in result.stderr
