"""Write docs/cli.md, the command reference, from the CLI's own `--help` (`make docs`).

Every command and group in the order `pagedkv-sql --help` lists them, each group followed by
its commands: first a table of the commands with the first sentence of each one's help, then
each `--help` as a user reads it at 80 columns. tests/test_docs.py fails while
docs/cli.md differs from what this writes, so the reference cannot drift from the CLI.

    python tools/cli_reference.py            # rewrite docs/cli.md
    python tools/cli_reference.py --check    # exit 1 if docs/cli.md is stale
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "cli.md"
WIDTH = "80"  # click wraps help to the terminal's width: fixed, as in tests/cli_help.txt
PROG = "pagedkv-sql"

HEADER = f"""\
# Command reference

Generated from the CLI's `--help` by `make docs` (`tools/cli_reference.py`): do not edit by
hand; `tests/test_docs.py` fails while this file is stale. Every command also
answers `{PROG} COMMAND --help`. What the commands share (`--db`, the format names, exit
codes) is in the README's "Commands" section.
"""


def _paths(command: Any, ctx: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The root, then every command in the order its group's help lists them."""
    found = [path]
    if hasattr(command, "commands"):  # a group (typer may bundle its own click)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                found += _paths(sub, ctx, (*path, name))
    return found


def _command(root: Any, path: tuple[str, ...]) -> Any:
    command = root
    for name in path:
        command = command.commands[name]
    return command


def _summary(command: Any) -> str:
    """The first sentence of the command's help, on one line, ready for a table cell."""
    text = " ".join((command.help or "").split("\n\n")[0].split())
    first = re.split(r"(?<=[.!?])\s+(?=[A-Z`])", text)[0]
    return first.replace("|", "\\|")


def _anchor(title: str) -> str:
    """The anchor GitHub gives a heading of plain words and hyphens."""
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")


def _help(path: tuple[str, ...]) -> str:
    from typer.testing import CliRunner

    from pagedkv_sql.cli import app

    result: Any = CliRunner().invoke(app, [*path, "--help"], prog_name=PROG, env={"COLUMNS": WIDTH})
    if result.exit_code != 0:
        raise SystemExit(f"{PROG} {' '.join(path)} --help failed: {result.output}")
    return str(result.stdout).rstrip()


def render() -> str:
    """docs/cli.md as the CLI stands now."""
    import typer

    from pagedkv_sql.cli import app

    root = typer.main.get_command(app)
    ctx = typer.Context(root, info_name=PROG)
    paths = _paths(root, ctx)
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH  # shutil.get_terminal_size reads it first
    try:
        helps = {path: _help(path) for path in paths}
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    rows = ["| command | what it does |", "| --- | --- |"]
    sections = []
    for path in paths:
        title = " ".join((PROG, *path))
        if path:
            rows.append(f"| [`{title}`](#{_anchor(title)}) | {_summary(_command(root, path))} |")
        sections.append(f"## {title}\n\n```text\n{helps[path]}\n```\n")
    return "\n".join([HEADER, *rows, "", *sections]).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--check"]:
        if OUT.read_text(encoding="utf-8") != text:
            sys.stderr.write("docs/cli.md is stale: run `make docs`\n")
            return 1
        return 0
    if argv[1:]:
        sys.stderr.write(__doc__ or "")
        return 2
    OUT.write_text(text, encoding="utf-8")
    sys.stdout.write(f"wrote {OUT.relative_to(ROOT)}\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv))
