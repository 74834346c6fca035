"""cli/__init__.py, the CLI's root: --db and PAGEDKV_DB before and after the command,
--memory-limit, --verbose and --quiet, the help of the app and of a group, usage errors,
a crash's traceback, reading commands beside another reader, a closed stdout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql import database as database_module

from .helpers import DATA, SEED_OUTPUT, Cli, settings


def test_db_option_and_environment(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli("load", str(DATA), "--db", "a.duckdb").exit_code == 0
    monkeypatch.setenv("PAGEDKV_DB", "a.duckdb")
    assert cli("resolve").stdout == SEED_OUTPUT
    assert not (cli.cwd / "pagedkv.duckdb").exists()
    assert cli("resolve", "--db", ":memory:").stdout == ""


def test_usage_errors_exit_2(cli: Cli) -> None:
    result: Any = cli("resolve", "--format", "xml")
    assert result.exit_code == 2
    result = cli("load", "-")
    assert result.exit_code == 2
    assert result.stderr == (
        "Error: reading stdin ('-') needs --relation NAME\n"
        "Fix: Datalog facts name their relations: pass -f dl for those\n"
    )


def test_help_for_every_command(cli: Cli) -> None:
    from pagedkv_sql.cli import app

    for command in app.registered_commands:
        name = command.name or (command.callback.__name__ if command.callback else "")
        result: Any = cli(name, "--help")
        assert result.exit_code == 0
        assert "Usage:" in result.stdout


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


def test_verbose_and_quiet_set_what_the_library_log_shows(tmp_path: Path) -> None:
    # the library's log reaches the shell (no NullHandler eats it)
    cr = tmp_path / "cr.facts"
    cr.write_bytes(b"1\t100\r\n2\t101\r\n")
    note = "info: cr.facts: CR line ends; reading it with pyarrow's CSV reader"

    def load(*root: str) -> str:
        run = subprocess.run(
            [sys.executable, "-m", "pagedkv_sql", *root, "load", "-r", "root_table", "cr.facts"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        )
        return run.stderr

    assert note in load("-v").splitlines()
    assert note not in load()
    assert load("-q") == ""  # no report, no warning: errors only


def opened_limits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the memory_limit of every database the CLI opens."""
    seen: list[str] = []
    real = database_module.connect

    def spy(*args: Any, **kwargs: Any) -> pagedkv_sql.Database:
        db = real(*args, **kwargs)
        seen.append(settings(db)[0])
        return db

    monkeypatch.setattr(database_module, "connect", spy)  # cli.common.open_db calls it
    return seen


def test_cli_memory_limit_option(cli: Cli, seed_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGEDKV_MEMORY_LIMIT", raising=False)
    seen = opened_limits(monkeypatch)
    result: Any = cli("--memory-limit", "300MB", "load", str(seed_dir), "-q")
    assert result.exit_code == 0, result.output
    result = cli("resolve")
    assert result.exit_code == 0, result.output
    assert seen[0] == "286.1 MiB" and seen[1] != "286.1 MiB"  # only where it was given
    assert sorted(p.name for p in cli.cwd.iterdir()) == ["pagedkv.duckdb"]


def test_cli_memory_limit_from_the_environment(
    cli: Cli, seed_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGEDKV_MEMORY_LIMIT", "200MB")
    seen = opened_limits(monkeypatch)
    result: Any = cli("load", str(seed_dir), "-q")
    assert result.exit_code == 0, result.output
    assert seen == ["190.7 MiB"]


def test_cli_bad_memory_limit(cli: Cli, seed_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGEDKV_MEMORY_LIMIT", raising=False)
    result: Any = cli("--memory-limit", "lots", "load", str(seed_dir))
    assert result.exit_code != 0
    assert "memory" in result.output.lower() and "Traceback" not in result.output
    assert list(cli.cwd.iterdir()) == []
