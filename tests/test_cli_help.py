"""The `--help` of every command, compared with tests/cli_help.txt: what the user reads
(options, defaults, ranges, choices, metavars) changes only on purpose.

A change to an option's help, default, bound or choices makes this test fail; if the
change is meant, rewrite the file and commit it with the change:

    .venv/bin/python -m tests.test_cli_help          # rewrites tests/cli_help.txt
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

GOLDEN = Path(__file__).with_name("cli_help.txt")
WIDTH = "80"  # click wraps help to the terminal's width: fixed here


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path of the CLI, the root first, groups before their commands."""
    found = [path]
    if hasattr(group, "commands"):  # a group (typer may bundle its own click)
        for name in sorted(group.commands):
            found += _commands(group.commands[name], (*path, name))
    return found


def _is_group(root: Any, path: tuple[str, ...]) -> bool:
    command = root
    for name in path:
        command = command.commands[name]
    return hasattr(command, "commands")


def help_text() -> str:
    """The help of every command, one section a command, in a fixed order; and what a
    group (the root, `export`, `spark`) prints when its command is missing."""
    from pagedkv_sql.cli import app

    runner = CliRunner()
    root = typer.main.get_command(app)
    sections = []
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH  # shutil.get_terminal_size reads it first
    try:
        for path in _commands(root):
            result: Any = runner.invoke(
                app, [*path, "--help"], prog_name="pagedkv-sql", env={"COLUMNS": WIDTH}
            )
            assert result.exit_code == 0, (path, result.output)
            title = " ".join(("pagedkv-sql", *path))
            sections.append(f"==> {title} --help\n{result.stdout.rstrip()}\n")
            if _is_group(root, path):
                bare: Any = runner.invoke(app, list(path), prog_name="pagedkv-sql")
                sections.append(
                    f"==> {title} (no command: exit {bare.exit_code})\n{bare.output.rstrip()}\n"
                )
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(sections)


def test_every_help_is_the_committed_one() -> None:
    """Defaults, ranges (`x>=0`), choices and texts as committed; regenerate on purpose
    with `.venv/bin/python -m tests.test_cli_help`."""
    expected = GOLDEN.read_text()
    actual = help_text()
    if actual != expected:
        import difflib

        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                "tests/cli_help.txt",
                "the CLI now",
            )
        )
        raise AssertionError(
            "the CLI's --help changed; if meant, run `.venv/bin/python -m tests.test_cli_help` "
            "and commit tests/cli_help.txt:\n" + diff
        )


def test_the_golden_file_covers_every_command() -> None:
    """A command added without regenerating the file is caught by name too."""
    from pagedkv_sql.cli import app

    text = GOLDEN.read_text()
    for path in _commands(typer.main.get_command(app)):
        assert f"==> {' '.join(('pagedkv-sql', *path))} --help\n" in text, path


if __name__ == "__main__":
    GOLDEN.write_text(help_text())
    sys.stdout.write(f"wrote {GOLDEN}\n")


def test_plain_help_lists_the_options_after_a_hidden_one() -> None:
    import typer
    from typer.testing import CliRunner

    from pagedkv_sql.cli.help import PlainTyper

    app = PlainTyper(rich_markup_mode=None)

    @app.command()
    def run(
        secret: int = typer.Option(0, "--secret", hidden=True),
        shown: int = typer.Option(3, "--shown", help="Shown."),
    ) -> None:
        """Run."""

    @app.command()
    def other() -> None:
        """Other."""

    result: Any = CliRunner().invoke(app, ["run", "--help"])
    assert "--shown INTEGER" in result.stdout and "Shown.  [default: 3]" in result.stdout
    assert "--secret" not in result.stdout


EXAMPLED = [
    ("load",),
    ("resolve",),
    ("check",),
    ("import",),
    ("replay",),
    ("watch",),
    ("fuzz",),
    ("fuzz", "vllm"),
    ("fuzz", "sglang"),
]


@pytest.mark.parametrize("path", EXAMPLED, ids=" ".join)
def test_the_main_commands_show_examples_that_parse(path: tuple[str, ...]) -> None:
    """An Examples section, last; every line in it a command line the CLI parses (its
    command and options as they are now), a comment after '  #' set aside."""
    import shlex

    from pagedkv_sql.cli import app

    root = typer.main.get_command(app)
    result: Any = CliRunner().invoke(app, [*path, "--help"], prog_name="pagedkv-sql")
    shown = result.stdout.split("\nExamples:\n")
    assert len(shown) == 2, result.stdout
    lines = [line.strip() for line in shown[1].splitlines() if line.strip()]
    assert lines and all(line.startswith("pagedkv-sql ") for line in lines), lines
    for line in lines:
        words = shlex.split(line.split("  #")[0], comments=False)
        words = words[: words.index("<")] if "<" in words else words  # a redirection
        command: Any = root
        args = words[1:]
        while hasattr(command, "commands"):  # a group (typer bundles its own click)
            command, args = command.commands[args[0]], args[1:]
        context = command.make_context(" ".join(words[:1]), list(args))
        context.close()
