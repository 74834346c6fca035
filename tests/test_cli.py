"""The CLI: exact output and exit codes, then the database state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql

from .conftest import DATA, SEED_OUTPUT, Cli, snapshot

LOAD_SUMMARY = """\
relation           rows  read  duplicates  mode      source
root_table            2     2           0  replaced  {d}/root_table.facts
block_table_entry     4     4           0  replaced  {d}/block_table_entry.facts
virtual_token         8     8           0  replaced  {d}/virtual_token.facts
swapped_block         1     1           0  replaced  {d}/swapped_block.facts
loaded into pagedkv.duckdb
warning: 2 diagnostic finding(s): diag_refcount_mismatch 1, diag_unresolved_token 1; \
see `pagedkv-sql check`
"""


def test_load_then_resolve(cli: Cli) -> None:
    result: Any = cli("load", str(DATA))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert result.stderr == LOAD_SUMMARY.format(d=DATA)
    result = cli("resolve")
    assert result.exit_code == 0
    assert result.stdout == SEED_OUTPUT
    assert (cli.cwd / "pagedkv.duckdb").exists()


def test_db_option_and_environment(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli("load", str(DATA), "--db", "a.duckdb").exit_code == 0
    monkeypatch.setenv("PAGEDKV_DB", "a.duckdb")
    assert cli("resolve").stdout == SEED_OUTPUT
    assert not (cli.cwd / "pagedkv.duckdb").exists()
    assert cli("resolve", "--db", ":memory:").stdout == ""


def test_resolve_formats(cli: Cli) -> None:
    cli("load", str(DATA))
    csv: Any = cli("resolve", "--format", "csv")
    assert csv.stdout.splitlines()[:2] == ["seq_id,token_pos,physical_address", "1,0,268435456"]
    tsv: Any = cli("resolve", "--format", "tsv")
    assert tsv.stdout == "seq_id\ttoken_pos\tphysical_address\n" + SEED_OUTPUT
    assert cli("resolve", "--format", "facts").stdout == SEED_OUTPUT
    first = '{"seq_id":1,"token_pos":0,"physical_address":268435456}'
    last = '{"seq_id":2,"token_pos":32,"physical_address":1073741824}'
    js: Any = cli("resolve", "-f", "json")
    assert js.stdout.startswith("[\n\t" + first + ",\n\t")
    assert js.stdout.endswith(",\n\t" + last + "\n]\n")
    assert len(json.loads(js.stdout)) == 7
    for name in ("jsonl", "ndjson"):
        lines: Any = cli("resolve", "-f", name)
        assert lines.stdout.splitlines()[0] == first
        assert lines.stdout.endswith(last + "\n")
    table: Any = cli("resolve", "-f", "table")
    assert "0x70000000" in table.stdout
    assert table.stdout.endswith("(7 rows)\n")
    out = cli.cwd / "out.facts"
    assert cli("resolve", "-o", str(out)).stdout == ""
    assert out.read_text() == SEED_OUTPUT


def test_resolve_without_a_database_is_a_clear_error(cli: Cli) -> None:
    result: Any = cli("resolve")
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: no database at pagedkv.duckdb\n"
        "Fix: create it with `pagedkv-sql load SOURCE`, or pass --db / set PAGEDKV_DB\n"
    )
    assert not (cli.cwd / "pagedkv.duckdb").exists()


def test_check_exit_codes(cli: Cli) -> None:
    cli("load", str(DATA))
    result: Any = cli("check")
    assert result.exit_code == 0
    assert result.stdout.endswith("0 error(s), 2 warning(s)\n")
    assert cli("check", "--strict").exit_code == 1


def _bad(tmp: Path, name: str, text: str) -> Path:
    d = tmp / "bad"
    d.mkdir(exist_ok=True)
    for f in DATA.glob("*.facts"):
        (d / f.name).write_text(f.read_text())
    (d / name).write_text(text)
    return d


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        (
            "block_table_entry.facts",
            "100\t0\t268435457\t2\n100\t1\t536870912\t-1\n",
            "Error: 2 row(s) of block_table_entry violate the spec's integrity constraints; "
            "nothing was loaded\n"
            "  block_table_entry(100, 0, 268435457, 2) at {d}/block_table_entry.facts:1: "
            "physical_block_base 268435457 is not 256-byte aligned (268435457 mod 256 = 1)\n"
            "  block_table_entry(100, 1, 536870912, -1) at {d}/block_table_entry.facts:2: "
            "refcount -1 is negative\n"
            "Fix: block bases must be multiples of 256, offsets in [0, 255], refcounts >= 0\n",
        ),
        (
            "virtual_token.facts",
            "1\t0\t0\t0\n1\t1\t0\t256\n",
            "Error: 1 row(s) of virtual_token violate the spec's integrity constraints; "
            "nothing was loaded\n"
            "  virtual_token(1, 1, 0, 256) at {d}/virtual_token.facts:2: "
            "offset_in_block 256 is outside [0, 255]\n"
            "Fix: block bases must be multiples of 256, offsets in [0, 255], refcounts >= 0\n",
        ),
        (
            "root_table.facts",
            "1\t1.5\n2\n",
            "Error: 2 malformed value(s) or line(s) in {d}/root_table.facts; nothing was loaded\n"
            "  {d}/root_table.facts:1:3: block_table_ptr: invalid number '1.5'; expected a "
            "signed 64-bit integer (decimal, 0x hex or 0b binary)\n"
            "  {d}/root_table.facts:2: 1 field(s), expected 2 (seq_id, block_table_ptr) "
            "separated by a tab\n"
            "Fix: fix the lines named above; numbers are decimal, 0x hex or 0b binary signed "
            "64-bit integers\n",
        ),
    ],
)
def test_refused_load_changes_nothing(
    cli: Cli, tmp_path: Path, name: str, text: str, message: str
) -> None:
    assert cli("load", str(DATA)).exit_code == 0
    before = snapshot(cli.cwd / "pagedkv.duckdb")
    bad = _bad(tmp_path, name, text)
    result: Any = cli("load", str(bad))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == message.format(d=bad)
    assert snapshot(cli.cwd / "pagedkv.duckdb") == before


def test_strict_load_refuses_warnings_and_keeps_state(cli: Cli) -> None:
    result: Any = cli("load", str(DATA), "--strict")
    assert result.exit_code == 1
    assert result.stderr.startswith(
        "Error: refused under --strict: 2 diagnostic finding(s) in 2 check(s); nothing was loaded\n"
    )
    assert "diag_unresolved_token" not in result.stderr or "token_pos" in result.stderr
    # the refused first load leaves no database behind (it would be an empty one)
    assert not (cli.cwd / "pagedkv.duckdb").exists()


def test_usage_errors_exit_2(cli: Cli) -> None:
    result: Any = cli("resolve", "--format", "xml")
    assert result.exit_code == 2
    result = cli("load", "-")
    assert result.exit_code == 2
    assert result.stderr == "Error: reading stdin ('-') needs --relation NAME\n"


def test_help_for_every_command(cli: Cli) -> None:
    from pagedkv_sql.cli import app

    for command in app.registered_commands:
        name = command.name or (command.callback.__name__ if command.callback else "")
        result: Any = cli(name, "--help")
        assert result.exit_code == 0
        assert "Usage:" in result.stdout


def test_progress_one_bar_a_stage_on_a_terminal_only(tmp_path: Path) -> None:
    """On a terminal: one labelled line a stage (read and check each relation,
    diagnostics, write), in the load's order, each redrawn in place and never going
    backwards, finished at 100%; piped or --quiet: no bar at all."""
    import os
    import pty
    import re
    import subprocess
    import sys

    from pagedkv_sql.synth import SynthConfig, synthesize, write

    write(synthesize(SynthConfig(sequences=1000, mean_length=1000)), tmp_path / "w")
    command = [sys.executable, "-m", "pagedkv_sql", "load", "w"]
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        command, cwd=tmp_path, stdin=secondary, stdout=secondary, stderr=secondary
    )
    os.close(secondary)
    seen = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    proc.wait()
    os.close(primary)
    assert proc.returncode == 0
    order = [f"read and check {r}" for r in pagedkv_sql.INPUT_RELATIONS]
    order += ["diagnostics", "write"]
    text = seen.decode().replace("\r\n", "\n")
    bars = text[: text.index("relation ")].split("\n")[:-1]  # the stages, then the report
    assert bars, text
    labels = []
    for line in bars:
        draws = [d for d in line.split("\r") if d]
        parsed = [re.fullmatch(r"(.+?) +\[([#.]{30})\] +(\d*)%? *(\d+\.\d)s", d) for d in draws]
        assert all(parsed), line
        label = parsed[0].group(1)  # type: ignore[union-attr]
        assert {p.group(1) for p in parsed} == {label}, line  # type: ignore[union-attr]
        percents = [int(p.group(3)) for p in parsed if p.group(3)]  # type: ignore[union-attr]
        assert percents == sorted(percents), line  # monotone
        assert parsed[-1].group(2) == "#" * 30, line  # type: ignore[union-attr]
        labels.append(label)
    # the load's order, once each (a stage over before the 0.25 s poll draws no line)
    assert labels == [x for x in order if x in labels], labels
    piped = subprocess.run(command, cwd=tmp_path, capture_output=True, check=True)
    assert b"[" not in piped.stderr.split(b"relation ")[0]
    assert piped.stderr.startswith(b"relation ")
