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

from pagedkv_sql import compression
from pagedkv_sql.relations import arrow_schema

from .helpers import DATA, SEED_OUTPUT, Cli, snapshot


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


# every command with -o and a format, with what it needs stored first
WRITERS = [
    ["resolve"],
    ["violations"],
    ["check"],
    ["explain", "1", "0"],
    ["stats"],
    ["sql", "SELECT * FROM root_table ORDER BY ALL"],
    ["replay", "--keep-going"],
    ["diff", "--from", "10", "--to", "11"],
]


def _exit(command: list[str]) -> tuple[int, ...]:
    return (0, 1) if command[0] in ("check", "replay") else (0,)


@pytest.fixture
def written(replayed: Cli) -> Cli:
    """The seed's facts and a replayed step log: something for every writer to write."""
    assert replayed("load", str(DATA), "-q").exit_code == 0
    return replayed


@pytest.mark.parametrize(
    ("command", "suffix", "kind"),
    [(c, ".gz", "gzip") for c in WRITERS] + [(c, ".zst", "zstd") for c in WRITERS[:5:4]],
    ids=lambda v: v[0] if isinstance(v, list) else v,
)
def test_every_output_is_compressed_as_its_name_says(
    written: Cli, command: list[str], suffix: str, kind: str
) -> None:
    """`-o r.csv.gz` is gzip CSV, as DuckDB's COPY TO writes it: the same bytes as `-o
    r.csv`, compressed."""
    cli = written
    plain: Any = cli(*command, "-o", "plain.csv")
    packed: Any = cli(*command, "-o", f"packed.csv{suffix}")
    assert plain.exit_code in _exit(command) and packed.exit_code == plain.exit_code
    raw = (cli.cwd / f"packed.csv{suffix}").read_bytes()
    assert compression.sniff(raw) == kind
    assert compression.reader(io.BytesIO(raw), "x").read() == (cli.cwd / "plain.csv").read_bytes()


@pytest.mark.parametrize(
    ("command", "name"),
    [(c, "s.xlsx") for c in WRITERS] + [(WRITERS[0], "s.xlsx.gz"), (WRITERS[4], "s.2024")],
    ids=lambda v: v[0] if isinstance(v, list) else v,
)
def test_an_extension_no_format_has_is_refused_and_nothing_is_written(
    written: Cli, command: list[str], name: str
) -> None:
    cli = written
    before = snapshot(cli.cwd / "pagedkv.duckdb")
    result: Any = cli(*command, "-o", name)
    assert result.exit_code == 2, result.stderr
    suffix = "." + name.split(".")[1]
    assert result.stderr.startswith(
        f"Error: --output {name}: '{suffix}' names no format this command writes; "
        "nothing was written\nFix: pass --format ("
    )
    assert not (cli.cwd / name).exists()
    assert snapshot(cli.cwd / "pagedkv.duckdb") == before
    # --format names it: any name is taken, and its .gz still compresses
    given: Any = cli(*command, "-o", name, "-f", "csv")
    assert given.exit_code in _exit(command)
    assert (compression.sniff((cli.cwd / name).read_bytes()) == "gzip") == name.endswith(".gz")


def test_a_refused_output_of_replay_stores_no_log(cli: Cli) -> None:
    """replay writes its report last: the extension is refused before the log is stored."""
    assert cli("synth-log", "run.jsonl", "--steps", "20").exit_code == 0
    result: Any = cli("replay", "run.jsonl", "-o", "report.xlsx")
    assert result.exit_code == 2
    assert not (cli.cwd / "pagedkv.duckdb").exists()


def test_a_report_format_named_by_a_rows_extension_is_refused(cli: Cli) -> None:
    """.facts names a format, but not one a report is written in."""
    cli("load", str(DATA), "-q")
    result: Any = cli("stats", "-o", "s.facts")
    assert result.exit_code == 2
    assert "'.facts' names no format this command writes" in result.stderr
    assert "pass --format (text, json, jsonl, ndjson, csv, tsv, arrow" in result.stderr


@pytest.mark.parametrize(
    "command", [["resolve"], ["sql", "SELECT 1 AS one"], ["stats"], ["check"]], ids=str
)
def test_table_and_text_are_one_format_and_txt_picks_it(cli: Cli, command: list[str]) -> None:
    cli("load", str(DATA), "-q")
    shown = {name: cli(*command, "-f", name) for name in ("table", "text")}
    assert all(r.exit_code == 0 for r in shown.values())  # type: ignore[attr-defined]
    table, text = (r.stdout for r in shown.values())  # type: ignore[attr-defined]
    assert table == text and table.splitlines()[0].split()[0] in (
        "seq_id",
        "one",
        "metric",
        "invariant",
    )
    assert cli(*command, "-o", "people.txt").exit_code == 0
    assert (cli.cwd / "people.txt").read_text() == table


def test_an_output_that_cannot_be_written_is_refused_before_the_work(cli: Cli) -> None:
    """A directory, or a file in a missing directory: refused with the format, before
    replay stores its log (never the log stored and then 'cannot write')."""
    assert cli("synth-log", "run.jsonl", "--steps", "20").exit_code == 0  # type: ignore[attr-defined]
    (cli.cwd / "adir").mkdir()
    for out, why in [("adir", "it is a directory"), ("missing/r.json", "no directory missing")]:
        result: Any = cli("replay", "run.jsonl", "-o", out)
        assert result.exit_code == 2
        assert result.stderr.startswith(f"Error: --output {out}: {why}; nothing was done")
    assert not (cli.cwd / "pagedkv.duckdb").exists()
    # a device is written as it is: /dev/stdout is no file to create beside
    shown: Any = cli("replay", "run.jsonl", "-o", "/dev/stdout", "-f", "json")
    assert shown.exit_code == 0


def test_watch_and_kv_events_take_both_names_of_the_format_for_people(cli: Cli) -> None:
    lines = "".join(f'{{"event_id": {i}, "data": {{"type": "created"}}}}\n' for i in range(3))
    (cli.cwd / "ev.jsonl").write_text(lines)
    for command in (["watch", "ev.jsonl"], ["kv-events", "ev.jsonl"]):
        shown = [cli(*command, "-f", name) for name in ("text", "table")]
        assert [r.exit_code for r in shown] == [0, 0]  # type: ignore[attr-defined]
        text, table = (r.stdout for r in shown)  # type: ignore[attr-defined]
        assert text == table and "0 finding(s)" in text
