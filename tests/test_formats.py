"""Every command that prints rows takes resolve's -f/-o, and json is one document
everywhere: diff's json is no JSON Lines, replay and diff take -o, violations' row is an
object and not a JSON string, parquet is refused on a terminal."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from pagedkv_sql.relations import arrow_schema

from .helpers import DATA, SEED_OUTPUT, Cli


@pytest.mark.parametrize("fmt", ["arrow", "arrows", "parquet"])
def test_cli_binary_formats(cli: Cli, fmt: str) -> None:
    cli("load", str(DATA))
    result: Any = cli("resolve", "--format", fmt)
    assert result.exit_code == 0
    data = io.BytesIO(result.stdout_bytes)
    if fmt == "arrow":
        table = ipc.open_file(data).read_all()
    elif fmt == "arrows":
        table = ipc.open_stream(data).read_all()
    else:
        table = pq.read_table(data)
    assert table.schema == arrow_schema("resolved_kv_address")
    assert table.num_rows == 7


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


@pytest.fixture
def replayed(cli: Cli) -> Cli:
    assert (
        cli("synth", "run.jsonl", "--steps", "40", "--fault", "fresh_while_held@30").exit_code == 0
    )
    assert cli("replay", "run.jsonl", "--keep-going").exit_code == 1
    return cli


def test_diff_json_is_one_document_and_jsonl_a_row_a_line(replayed: Cli) -> None:
    cli = replayed
    result: Any = cli("diff", "--from", "10", "--to", "11", "-f", "json")
    document = json.loads(result.stdout)
    assert (document["from_step"], document["to_step"]) == (10, 11)
    assert document["changes"] and {"change"} <= set(document["changes"][0])
    lines: Any = cli("diff", "--from", "10", "--to", "11", "-f", "jsonl")
    assert [json.loads(x) for x in lines.stdout.splitlines()] == document["changes"]


def test_diff_and_replay_write_files_in_any_rows_format(replayed: Cli) -> None:
    cli = replayed
    assert cli("diff", "--from", "10", "--to", "11", "-o", "d.parquet").exit_code == 0
    changes = pq.read_table(cli.cwd / "d.parquet")
    assert changes.num_rows > 0 and "change" in changes.column_names
    result: Any = cli("replay", "--keep-going", "-o", "f.csv")
    assert result.exit_code == 1 and result.stdout == ""
    header, *rows = (cli.cwd / "f.csv").read_text().splitlines()
    assert header.startswith("invariant,check,event,step,op,request")
    assert rows and all(",30," in r for r in rows[:1])
    assert cli("replay", "-o", "r.json").exit_code == 1
    assert json.loads((cli.cwd / "r.json").read_text())["findings"][0]["step"] == 30


def test_violations_json_rows_are_objects_not_strings(cli: Cli) -> None:
    cli("load", str(DATA), "-q")
    result: Any = cli("violations", "-f", "json")
    rows = json.loads(result.stdout)
    assert rows[0]["row"] == {
        "physical_block_base": 268435456,
        "holders": 1,
        "refcounts": [2],
        "held_by": "100:0",
    }
    lines: Any = cli("violations", "-f", "jsonl")
    assert [json.loads(x) for x in lines.stdout.splitlines()] == rows
    csv: Any = cli("violations", "-f", "csv")  # text formats keep the row as its JSON text
    assert '"{""physical_block_base"": 268435456' in csv.stdout


def _on_a_terminal(args: list[str], cwd: Path) -> tuple[int, bytes, str]:
    """Run the CLI with stdout a pseudo-terminal: its exit code, what reached the terminal,
    and stderr."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pagedkv_sql", *args],
            cwd=cwd,
            stdout=follower,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
        os.close(follower)
        follower = -1
        seen = b""
        try:
            while chunk := os.read(leader, 65536):
                seen += chunk
        except OSError:  # the terminal closed
            pass
        return proc.returncode, seen, proc.stderr
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)


@pytest.mark.parametrize(
    "command",
    [["resolve", "-f", "parquet"], ["violations", "-f", "arrow"], ["stats", "-f", "arrows"]],
)
def test_binary_formats_are_refused_on_a_terminal(cli: Cli, command: list[str]) -> None:
    cli("load", str(DATA), "-q")
    code, seen, stderr = _on_a_terminal(command, cli.cwd)
    assert (code, seen) == (2, b"")
    assert "stdout is a terminal; nothing was written" in stderr
    assert "Fix: write it to a file (-o out." in stderr
    # a pipe is what the user meant: the bytes flow
    piped = subprocess.run(
        [sys.executable, "-m", "pagedkv_sql", *command], cwd=cli.cwd, capture_output=True
    )
    assert piped.returncode == 0 and piped.stdout[:4] in (b"PAR1", b"ARRO", b"\xff\xff\xff\xff")


def test_sql_runs_a_query_in_the_tools_formats(cli: Cli) -> None:
    cli("load", str(DATA), "-q")
    result: Any = cli(
        "sql", "SELECT seq_id, count(*) AS n FROM virtual_token GROUP BY 1 ORDER BY 1", "-f", "csv"
    )
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == "seq_id,n"
    table: Any = cli("sql", "SELECT 1 AS one")
    assert table.stdout == "one\n  1\n(1 row)\n"
    assert cli("sql", "SELECT 42 AS x", "-o", "x.parquet").exit_code == 0
    assert pq.read_table(cli.cwd / "x.parquet").to_pylist() == [{"x": 42}]


def test_sql_is_read_only_unless_write_and_its_errors_are_ours(cli: Cli) -> None:
    cli("load", str(DATA), "-q")
    refused: Any = cli("sql", "DELETE FROM virtual_token")
    assert refused.exit_code == 1
    assert refused.stderr.startswith("Error: sql: ")
    assert "read-only" in refused.stderr and "Fix: pass --write" in refused.stderr
    assert cli("sql", "SELECT count(*) AS n FROM virtual_token", "-f", "jsonl").stdout != (
        '{"n":0}\n'
    )
    assert cli("sql", "--write", "CREATE TABLE mine AS SELECT 1 AS a").exit_code == 0
    mine: Any = cli("sql", "SELECT a FROM mine", "-f", "tsv")
    assert mine.stdout == "a\n1\n"
    bad: Any = cli("sql", "SELEC 1")
    assert bad.exit_code == 1
    assert bad.stderr.startswith("Error: sql: Parser Error") and "Traceback" not in bad.stderr
