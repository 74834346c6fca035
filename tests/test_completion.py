"""TAB completion answered from the table (pagedkv_sql/completion.py), against typer's own.

typer takes 0.36 s (bash) and 0.52 s (zsh) a TAB, importing itself, click, rich and
pydantic to answer it; the table answers in a few milliseconds. These tests hold
the two answers equal, byte for byte, in every shell typer supports: on every command with
every word that can follow it, and on thousands of random command lines made of the CLI's
own words (and on a zoo app of what click and typer offer and our CLI does not use yet:
tests/test_cli_completion_table.py). typer renders help through rich at an unbounded
width here (TERMINAL_WIDTH):
the table does not wrap (docs/decisions.md); what zsh shows is the same at any width.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import typer.main
import typer.rich_utils

from pagedkv_sql import completion
from pagedkv_sql.cli import app

try:
    from typer._click.shell_completion import get_completion_class
except ImportError:  # typer 0.16 uses click's
    from click.shell_completion import (  # type: ignore[no-redef]
        get_completion_class,
    )
from .completions import (
    ENV_KEYS,
    TABLE,
    check_completions,
    click_follows_nested_groups,
    environ,
    ours,
    prepared,
    random_lines,
    systematic_lines,
    typers,
)

# what a TAB must not wait for: typer and what it imports, and the library's heavy parts
HEAVY = ("typer", "click", "rich", "pydantic", "duckdb", "pyarrow", "numpy")


@pytest.fixture(scope="module")
def typer_cli() -> Any:
    return prepared(app)


@pytest.mark.parametrize("key", sorted(TABLE["commands"]))
def test_every_command_and_option_completes_as_typer_does(
    key: str, typer_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if key.count(" ") and not click_follows_nested_groups(typer_cli):
        pytest.skip("click 8.2.0 stops at a nested group (see _click_follows_nested_groups)")
    assert check_completions(systematic_lines(TABLE, key), typer_cli, monkeypatch) >= 50


@pytest.mark.parametrize("seed", range(4))
def test_random_command_lines_complete_as_typer_does(
    seed: int, typer_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_completions(random_lines(TABLE, 400, seed), typer_cli, monkeypatch)


def test_the_comparison_can_fail(typer_cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # the same check on a table with one command's options in a different order fails
    table = json.loads(json.dumps(TABLE))
    table["commands"]["load"]["params"].reverse()
    env = {"_TYPER_COMPLETE_ARGS": "pagedkv-sql load --"}
    assert completion.complete(table, "zsh", env) != typers(typer_cli, "zsh", env, monkeypatch)


@pytest.mark.parametrize("width", [40, 80, 132])
def test_what_zsh_shows_is_typers_at_any_terminal_width(
    width: int, typer_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # typer's zsh script runs `eval $(...)`: the shell splits the answer at any white space,
    # so rich's line breaks are gone by the time zsh reads it
    for key in TABLE["commands"]:
        if key.count(" ") and not click_follows_nested_groups(typer_cli):
            continue
        env = {"_TYPER_COMPLETE_ARGS": f"pagedkv-sql {key} --"}
        want = typers(typer_cli, "zsh", env, monkeypatch)
        monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", width)
        cls = get_completion_class("zsh")
        assert cls is not None
        with environ(env):
            wrapped = cls(typer_cli, {}, "pagedkv-sql", "_PAGEDKV_SQL_COMPLETE").complete()
        got = ours("zsh", env)
        assert isinstance(got, str)
        assert got == want
        assert got.split() == wrapped.split()


# the console script, as a shell runs it
def _script(env: dict[str, str], probe: bool = False) -> subprocess.CompletedProcess[str]:
    code = (
        "import atexit, sys\n"
        "sys.argv = ['pagedkv-sql']\n"
        f"atexit.register(lambda: print(*(m for m in {HEAVY!r} if m in sys.modules), "
        "file=sys.stderr))\n"
        "from pagedkv_sql.__main__ import main\n"
        "main()\n"
    )
    clean = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**clean, "TERMINAL_WIDTH": "1000000", **env},
    )


FISH_ACTION = "_TYPER_COMPLETE_FISH_ACTION"
BASH_EX = {"COMP_WORDS": "pagedkv-sql ex", "COMP_CWORD": "1"}


@pytest.mark.parametrize(
    ("shell", "env"),
    [
        ("bash", {"COMP_WORDS": "pagedkv-sql ex", "COMP_CWORD": "1"}),
        ("zsh", {"_TYPER_COMPLETE_ARGS": "pagedkv-sql replay --f"}),
        ("fish", {"_TYPER_COMPLETE_ARGS": "pagedkv-sql import ", FISH_ACTION: "get-args"}),
        ("powershell", {"_TYPER_COMPLETE_ARGS": "pagedkv-sql replay --format "}),
    ],
)
def test_the_console_script_answers_without_importing_typer(
    shell: str, env: dict[str, str], typer_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _script({"_PAGEDKV_SQL_COMPLETE": f"complete_{shell}", **env})
    assert run.returncode == 0
    assert run.stderr == "\n"  # nothing of HEAVY loaded
    assert run.stdout == f"{typers(typer_cli, shell, env, monkeypatch)}\n"
    assert run.stdout.strip()


def test_fish_is_args_answers_with_the_exit_code() -> None:
    env = {"_PAGEDKV_SQL_COMPLETE": "complete_fish", "_TYPER_COMPLETE_FISH_ACTION": "is-args"}
    assert _script({**env, "_TYPER_COMPLETE_ARGS": "pagedkv-sql lo"}).returncode == 0
    assert _script({**env, "_TYPER_COMPLETE_ARGS": "pagedkv-sql load "}).returncode == 1


def test_what_the_table_does_not_answer_typer_does() -> None:
    # the completion script for a shell's rc file: typer's (it imports typer)
    run = _script({"_PAGEDKV_SQL_COMPLETE": "source_bash"})
    assert run.returncode == 0
    assert "complete -o default -F _pagedkv_sql_completion pagedkv-sql" in run.stdout
    assert "typer" in run.stderr
    # an instruction typer refuses is refused by typer
    run = _script({"_PAGEDKV_SQL_COMPLETE": "complete_tcsh"})
    assert run.returncode == 1
    assert run.stderr.startswith("Shell tcsh not supported.\n")


def test_without_the_table_typer_answers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # run as the console script runs: its __main__ is a script, not a package's
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    monkeypatch.setattr(sys, "argv", ["pagedkv-sql"])
    with monkeypatch.context() as patch:
        patch.setattr(completion, "TABLE", str(tmp_path / "missing.json"))
        assert completion.answer({"_PAGEDKV_SQL_COMPLETE": "complete_bash", **BASH_EX}) is None
    # the same request, the table there: answered
    assert completion.answer({"_PAGEDKV_SQL_COMPLETE": "complete_bash", **BASH_EX}) == 0
    assert capsys.readouterr().out == "explain\nexample\nexport\n"


def test_python_m_is_not_answered_from_the_table() -> None:
    # `python -m pagedkv_sql`: typer names the program "python -m pagedkv_sql", and the
    # variable it reads is not _PAGEDKV_SQL_COMPLETE: the table must not answer either
    run = subprocess.run(
        [sys.executable, "-m", "pagedkv_sql"],
        capture_output=True,
        text=True,
        env={**os.environ, "_PAGEDKV_SQL_COMPLETE": "complete_bash", **BASH_EX},
    )
    assert "Usage: python -m pagedkv_sql" in run.stdout + run.stderr


def test_bash_completes_through_the_script_typer_installs() -> None:
    # the real thing: the script `--install-completion` puts in ~/.bashrc, run by bash,
    # calling the console script, which answers from the table
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "pagedkv-sql").exists(), "the console script is installed (pip install -e .)"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    source = subprocess.run(
        ["pagedkv-sql"],
        env={**env, "_PAGEDKV_SQL_COMPLETE": "source_bash"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    asks = [
        ('COMP_WORDS=(pagedkv-sql export ""); COMP_CWORD=2', ["flashinfer", "vllm", "parquet"]),
        ("COMP_WORDS=(pagedkv-sql replay --format j); COMP_CWORD=3", ["json", "jsonl"]),
        ("COMP_WORDS=(pagedkv-sql --db x.db lo); COMP_CWORD=3", ["load"]),
    ]
    for words, want in asks:
        ask = '_pagedkv_sql_completion pagedkv-sql; printf "%s\\n" "${COMPREPLY[@]}"'
        script = f"{source}\n{words}\n{ask}\n"
        run = subprocess.run(
            ["bash", "--norc", "-c", script], env=env, capture_output=True, text=True
        )
        assert (run.returncode, run.stderr) == (0, "")
        assert sorted(run.stdout.split()) == sorted(want), words


@pytest.mark.parametrize(
    "typed",
    ['pagedkv-sql replay --format "js', "pagedkv-sql 'lo", 'pagedkv-sql load "a b', "x \\"],
)
def test_an_unfinished_quote_completes_as_typer_does(
    typed: str, typer_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # click's split keeps the unfinished word as it is (shlex gives up on it)
    for shell, env in [
        ("zsh", {"_TYPER_COMPLETE_ARGS": typed}),
        ("bash", {"COMP_WORDS": typed, "COMP_CWORD": "2"}),
        ("powershell", {"_TYPER_COMPLETE_ARGS": typed, "_TYPER_COMPLETE_WORD_TO_COMPLETE": "x"}),
    ]:
        assert ours(shell, env) == typers(typer_cli, shell, env, monkeypatch), (shell, typed)


def test_a_run_that_is_not_a_completion_goes_to_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    monkeypatch.setattr(sys, "argv", ["pagedkv-sql", "resolve"])
    assert completion.answer({}) is None
    assert completion.answer({"_PAGEDKV_SQL_COMPLETE": ""}) is None
    assert completion.answer({"_OTHER_TOOL_COMPLETE": "complete_bash", **BASH_EX}) is None


def _script_to(stdout: Any, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The console script answering with its stdout ``stdout`` (a file, a pipe)."""
    clean = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    code = "import sys\nsys.argv = ['pagedkv-sql']\nfrom pagedkv_sql.__main__ import main\nmain()\n"
    return subprocess.run(
        [sys.executable, "-c", code],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env={**clean, "_PAGEDKV_SQL_COMPLETE": "complete_bash", **env},
    )


def test_a_full_or_closed_stdout_ends_the_answer_quietly() -> None:
    """/dev/full, or a reader gone (`| true`): no traceback, a failing exit code."""
    with open("/dev/full", "w") as full:
        run = _script_to(full, BASH_EX)
    assert (run.returncode, run.stderr) == (1, "")
    reader, writer = os.pipe()
    os.close(reader)
    with os.fdopen(writer, "w") as gone:
        run = _script_to(gone, BASH_EX)
    assert (run.returncode, run.stderr) == (1, "")


@pytest.mark.parametrize(
    "env",
    [
        {"COMP_WORDS": "pagedkv-sql l", "COMP_CWORD": "abc"},
        {"COMP_WORDS": "pagedkv-sql l", "COMP_CWORD": ""},
        {"COMP_CWORD": "1"},
        {"COMP_WORDS": "pagedkv-sql l"},
    ],
)
def test_a_bash_request_bash_never_sends_gets_no_answer_and_no_traceback(
    env: dict[str, str],
) -> None:
    run = _script(env | {"_PAGEDKV_SQL_COMPLETE": "complete_bash"})
    assert (run.returncode, run.stderr) == (0, "\n")  # nothing on stderr: no traceback
