"""The CLI: exact output and exit codes, then the database state."""

from __future__ import annotations

import json
import subprocess
import sys
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


# issue 24: `replay`'s copy of --max-errors had lost min=0, so -5 listed all but the last
# five problems; the option is defined once now (cli/common.py), the bound with it
@pytest.mark.parametrize(
    "command",
    [["load", "x.facts"], ["import", "vllm", "x.npz"], ["replay", "x.jsonl"], ["spark", "resolve"]],
)
def test_max_errors_is_never_negative(cli: Cli, command: list[str]) -> None:
    result: Any = cli(*command, "--max-errors", "-5")
    assert result.exit_code == 2
    assert "Invalid value for '--max-errors'" in result.stderr  # the wording is typer's


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
    import re
    import subprocess
    import sys

    from pagedkv_sql.synth import SynthConfig, synthesize, write

    from .conftest import on_a_terminal

    write(synthesize(SynthConfig(sequences=1000, mean_length=1000)), tmp_path / "w")
    command = [sys.executable, "-m", "pagedkv_sql", "load", "w"]
    returncode, drawn = on_a_terminal(command[3:], tmp_path)
    assert returncode == 0
    order = [f"read and check {r}" for r in pagedkv_sql.INPUT_RELATIONS]
    order += ["diagnostics", "write"]
    text = drawn.replace("\r\n", "\n")
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


def test_reading_commands_run_beside_another_reader(cli: Cli) -> None:
    """DuckDB lets several processes read one file but not write it while another reads
    it: every reading command must open read-only (a read-write open is refused while
    another process holds the file)."""
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    assert cli("synth", "--steps", "4", "log.jsonl").exit_code == 0  # type: ignore[attr-defined]
    assert cli("replay", "log.jsonl").exit_code == 0  # type: ignore[attr-defined]
    path = cli.cwd / "pagedkv.duckdb"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; c = duckdb.connect(sys.argv[1], read_only=True);"
            " print('ready', flush=True); time.sleep(60)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        for command in (
            ["resolve"],
            ["violations"],
            ["check"],
            ["explain", "1", "0"],
            ["stats"],
            ["diff", "--from", "1", "--to", "3"],
        ):
            result: Any = cli(*command)
            assert "locked" not in result.stderr, command
            assert result.exit_code in (0, 1), (command, result.stderr)
        # the pictures need the report extra: without it they stop after opening the file
        for command in (["map", "-o", "m.svg"], ["report", "-o", "r.html"]):
            result = cli(*command)
            assert "locked" not in result.stderr, command
            assert result.exit_code == 0 or "pagedkv-sql[report]" in result.stderr, command
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


def _misaligned(tmp_path: Path, n: int) -> Path:
    """A directory whose block_table_entry has n bases off the 256-byte alignment."""
    bad = tmp_path / f"misaligned{n}"
    bad.mkdir()
    rows = "".join(f"1\t{i}\t{256 * i + 1}\t1\n" for i in range(n))
    (bad / "block_table_entry.facts").write_text(rows)
    return bad


def test_max_errors_lists_that_many_rows_and_counts_the_rest(cli: Cli, tmp_path: Path) -> None:
    bad = _misaligned(tmp_path, 3)
    one: Any = cli("load", str(bad), "--max-errors", "1")
    assert one.exit_code == 1
    assert one.stderr.count("is not 256-byte aligned") == 1
    assert "\n  ... and 2 more (--max-errors 0 lists all that were kept)\n" in one.stderr
    every: Any = cli("load", str(bad), "--max-errors", "0")
    assert every.exit_code == 1
    assert every.stderr.count("is not 256-byte aligned") == 3
    assert "more" not in every.stderr


def test_load_lists_a_hundred_offending_rows_by_default(cli: Cli, tmp_path: Path) -> None:
    result: Any = cli("load", str(_misaligned(tmp_path, 102)))
    assert result.exit_code == 1
    assert result.stderr.count("is not 256-byte aligned") == 100
    assert "\n  ... and 2 more (--max-errors 0 lists all that were kept)\n" in result.stderr


def test_check_limit_shows_that_many_rows_and_zero_shows_all(cli: Cli, tmp_path: Path) -> None:
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    extra = tmp_path / "more.facts"
    extra.write_text("1\t88\t5\t8\n1\t89\t5\t9\n")
    loaded: Any = cli("load", str(extra), "--relation", "virtual_token", "--append")
    assert loaded.exit_code == 0
    one: Any = cli("check", "--limit", "1")
    assert "diag_unresolved_token (warning, 3 rows):" in one.stdout
    assert "  ... and 2 more (--limit 0 shows all)" in one.stdout
    every: Any = cli("check", "--limit", "0")
    assert "diag_unresolved_token (warning, 3 rows):" in every.stdout
    assert "more (--limit 0 shows all)" not in every.stdout
    rows = [line.split()[:2] for line in every.stdout.splitlines()]
    assert ["1", "88"] in rows and ["1", "89"] in rows


def test_explain_shows_a_swapped_block_and_a_missing_entry(cli: Cli) -> None:
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    swapped: Any = cli("explain", "1", "32")
    assert swapped.exit_code == 0
    assert swapped.stdout == (
        "token seq_id 1, token_pos 32\n"
        "  virtual_token      block_index 2, offset_in_block 0\n"
        "  root_table         seq_id 1 -> block table 100\n"
        "  block_table_entry  (100, 2): none\n"
        "  swapped_block      (100, 2): cpu_base_address 1879048192 (0x70000000)\n"
        "  => cpu tier: 1879048192 + 0 = 1879048192 (0x70000000)\n"
    )
    resident: Any = cli("explain", "1", "15")
    assert resident.exit_code == 0
    assert "  swapped_block      (100, 0): none\n" in resident.stdout
    assert "  => gpu tier: 268435456 + 15 = 268435471 (0x1000000f)\n" in resident.stdout


def test_a_closed_stdout_refuses_output_but_not_stdin(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process, the descriptors that paths.reserve_standard_streams found closed: fd 1
    closed refuses `resolve` (nothing written) and leaves `load -` reading stdin; fd 0
    closed refuses `load -` alone."""
    from pagedkv_sql import paths

    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    monkeypatch.setattr(paths, "CLOSED_STREAMS", {1})
    refused: Any = cli("resolve")
    assert (refused.exit_code, refused.stderr) == (
        1,
        "Error: standard output is closed; nothing was written\n"
        "Fix: redirect stdout or pass --output FILE\n",
    )
    read: Any = cli("load", "-", "-r", "swapped_block", "--append", input="101\t1\t4096\n")
    assert read.exit_code == 0, read.stderr
    monkeypatch.setattr(paths, "CLOSED_STREAMS", {0})
    unread: Any = cli("load", "-", "-r", "swapped_block", "--append", input="101\t3\t8192\n")
    assert (unread.exit_code, unread.stderr) == (2, "Error: no standard input to read\n")
    monkeypatch.setattr(paths, "CLOSED_STREAMS", set())
    resolved: Any = cli("resolve")
    assert "2\t16\t4096\n" in resolved.stdout  # the block of the first stdin load
    assert "\t8192\n" not in resolved.stdout


def test_no_command_prints_the_help_with_every_command(cli: Cli) -> None:
    result: Any = cli()
    assert result.exit_code == 2
    assert result.output.startswith("Usage: ")  # click writes it to stdout or stderr
    assert "\nCommands:\n" in result.output and "  resolve " in result.output


def test_ctrl_c_in_a_query_is_recognised_as_either_exception() -> None:
    import duckdb

    from pagedkv_sql.cli.common import interrupted as _interrupted

    assert _interrupted(duckdb.InterruptException("INTERRUPT Error: Interrupted!"))
    assert _interrupted(RuntimeError("Query interrupted"))
    assert not _interrupted(RuntimeError("Invalid Input Error: ..."))
    assert not _interrupted(ValueError("interrupted"))


def test_db_before_the_command_beats_the_environment(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGEDKV_DB", "from-env.duckdb")
    result: Any = cli("--db", "given.duckdb", "load", str(DATA))
    assert result.exit_code == 0, result.stderr
    assert (cli.cwd / "given.duckdb").exists()
    assert not (cli.cwd / "from-env.duckdb").exists()


def test_a_group_without_its_command_prints_its_help(cli: Cli) -> None:
    result: Any = cli("export")
    assert result.exit_code == 2
    assert "\nCommands:\n" in result.output and "  flashinfer " in result.output


def test_errors_of_a_command_without_max_errors_list_a_hundred(cli: Cli) -> None:
    """`diff LOG` reads the log under the default of a hundred listed problems."""
    assert cli("synth", "--steps", "2", "good.jsonl").exit_code == 0  # type: ignore[attr-defined]
    header = (cli.cwd / "good.jsonl").read_text().splitlines()[0]
    (cli.cwd / "bad.jsonl").write_text(header + "\n" + '{"step": "x"}\n' * 102)
    result: Any = cli("diff", "bad.jsonl", "--from", "0", "--to", "1")
    assert result.exit_code == 1
    assert result.stderr.count("'step' must be an integer") == 100
    assert "\n  ... and 2 more (--max-errors 0 lists all that were kept)\n" in result.stderr


def test_db_after_the_command_beats_an_empty_one_before(cli: Cli) -> None:
    assert cli("load", str(DATA), "--db", "s.duckdb").exit_code == 0  # type: ignore[attr-defined]
    result: Any = cli("--db", "", "resolve", "--db", "s.duckdb")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("1\t0\t268435456\n")


def test_an_empty_db_before_the_command_is_refused_not_the_default_file(cli: Cli) -> None:
    """`--db ""` (an unset variable in a script) is refused wherever it is given; before
    the command it used to fall back to ./pagedkv.duckdb silently."""
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    for args in (["--db", "", "resolve"], ["resolve", "--db", ""]):
        result: Any = cli(*args)
        assert result.exit_code == 2, args
        assert result.stderr.startswith("Error: --db is empty (an unset variable?)\n"), args


def test_a_crash_prints_a_plain_python_traceback(tmp_path: Path) -> None:
    """A bug of ours (not bad input) ends in Python's own traceback, for the bug report:
    never typer's boxed rich one."""
    script = (
        "import sys\n"
        "import pagedkv_sql.cli as cli\n"
        "import pagedkv_sql.database as database\n"
        "def boom(*args, **kwargs):\n"
        "    raise KeyError('boom')\n"
        "database.Database.resolve = boom\n"
        "sys.argv = ['pagedkv-sql', '--db', ':memory:', 'resolve']\n"
        "cli.main()\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 1
    assert "Traceback (most recent call last):\n" in run.stderr
    assert run.stderr.endswith("KeyError: 'boom'\n")
    assert "╭" not in run.stderr


def test_ctrl_c_in_a_query_exits_130_with_nothing_changed(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    import duckdb

    from pagedkv_sql.database import Database

    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")

    monkeypatch.setattr(Database, "resolve", interrupted)
    result: Any = cli("resolve")
    assert (result.exit_code, result.stderr) == (130, "Error: interrupted; nothing was changed\n")


# issue 24: the CLI's wing. cli.py imported spark/cli.py at its bottom (noqa: E402), which
# reached back into cli.py's privates inside functions to dodge the circle.
PACKAGE = Path(pagedkv_sql.__file__).parent
WING = PACKAGE / "cli"
FLOOR = {"__init__", "common", "text", "help"}  # the wing's modules that are not a group


def _imports(path: Path) -> set[str]:
    """The pagedkv_sql modules a module imports, as dotted names (`from . import x` too)."""
    import ast

    package = ".".join(("pagedkv_sql", *path.parent.relative_to(PACKAGE).parts))
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.add(module)
            found |= {f"{module}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("pagedkv_sql")}


def test_only_main_imports_the_cli_and_no_group_imports_another() -> None:
    outside = [
        p
        for p in PACKAGE.rglob("*.py")
        if WING not in p.parents and p.name != "__main__.py"
        if any(m == "pagedkv_sql.cli" or m.startswith("pagedkv_sql.cli.") for m in _imports(p))
    ]
    assert outside == []
    # inside: a group or the floor imports only the floor (`from . import app` would be
    # cli/__init__.py, `from . import core` another group)
    for path in WING.glob("*.py"):
        if path.stem != "__init__":
            names = {m.split(".")[2] for m in _imports(path) if m.startswith("pagedkv_sql.cli.")}
            assert names <= FLOOR - {"__init__"}, path.name


def test_the_wing_has_no_room_over_500_lines_and_no_e402() -> None:
    for path in WING.glob("*.py"):
        text = path.read_text()
        assert len(text.splitlines()) <= 500, path.name
        assert "noqa: E402" not in text, path.name
