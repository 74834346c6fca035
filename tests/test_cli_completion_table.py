"""cli/completion_table.py: the table TAB is answered from, built from a typer app (ours,
and a zoo of what click and typer offer), against typer's own answers."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any

import pytest
import typer.main
import typer.rich_utils

from pagedkv_sql import completion
from pagedkv_sql.cli import app
from pagedkv_sql.cli.completion_table import _help_in_declared_order, build, context, dumps

from .completions import (
    check_completions,
    click_follows_nested_groups,
    prepared,
    random_lines,
    systematic_lines,
)


def test_the_table_is_made_from_the_cli_as_it_is() -> None:
    # a command or option changed without `make completion`: TAB would offer the old ones
    assert dumps(build(app)) == Path(completion.TABLE).read_text(encoding="utf-8"), (
        "pagedkv_sql/cli/completion.json is stale. Fix: make completion"
    )


# A zoo of what click and typer offer and pagedkv-sql does not use (yet): paths, an argument
# of any number between two others, a case-blind choice, a repeated option, an option of two
# values, a --on/--off pair, hidden options and commands, unknown options passed through, a
# group two deep, a completer; and an argument of two values, which the table leaves to
# typer. The table is exact for a CLI that grows into these too.
class Mode(str, enum.Enum):
    fast = "fast"
    Careful = "Careful"


def _fruit(incomplete: str) -> list[tuple[str, str]]:
    fruits = [("apple", "Red: or green."), ("apricot", ""), ("banana", "[bold]Yellow[/bold].")]
    return [(f, why) for f, why in fruits if f.startswith(incomplete)]


zoo = typer.Typer(context_settings={"help_option_names": ["-h", "--help"]})
deep = typer.Typer()
grp = typer.Typer()
argd = typer.Typer()
zoo.add_typer(grp, name="grp")
grp.add_typer(deep, name="deep")
zoo.add_typer(argd, name="argd")


@argd.callback()
def _argd(where: str = typer.Argument(...)) -> None:
    """A group with an argument of its own, which the table leaves to typer."""


@argd.command()
def inner() -> None:
    """In a group with an argument."""


@zoo.callback()
def _zoo_root(
    verbose: int = typer.Option(0, "-v", count=True),
    name: str = typer.Option("", "--name", "-n", help="A name: [bold]with[/bold] a colon."),
) -> None:
    """The zoo."""


@zoo.command()
def paths(
    src: Path = typer.Argument(...),
    middle: list[Path] = typer.Argument(None),
    last: str = typer.Argument(...),
    mode: Mode = typer.Option(Mode.fast, case_sensitive=False, help="How."),
    tag: list[str] = typer.Option([], "--tag", "-t"),
    pair: tuple[str, str] = typer.Option(("", ""), "--pair", autocompletion=_fruit),
    on: bool = typer.Option(True, "--on/--off", help="On or off."),
    secret: str = typer.Option("", hidden=True),
    x: bool = typer.Option(False, "-x"),
    y: str = typer.Option("", "-y"),
    fruit: str = typer.Option("", autocompletion=_fruit),
    out: typer.FileTextWrite = typer.Option(None, "--out", "-o"),
) -> None:
    """Paths and the rest."""


@zoo.command(hidden=True)
def ghost() -> None:
    """Not listed."""


@zoo.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def loose(
    args: list[str] = typer.Argument(None), x: bool = typer.Option(False, "-x"), y: str = "-"
) -> None:
    """Unknown options passed through."""


@zoo.command(context_settings={"ignore_unknown_options": True})
def pass1(mode: Mode = typer.Argument(...), x: bool = typer.Option(False, "-x")) -> None:
    """Unknown options passed through to a choice."""


@zoo.command()
def two(xy: tuple[str, str] = typer.Argument(...), z: str = typer.Option("", "-z")) -> None:
    """An argument of two values."""


@grp.command()
def leaf(n: int = typer.Option(1, "--n")) -> None:
    """A command in a group."""


@deep.command()
def end(where: Path = typer.Argument(...)) -> None:
    """Two groups deep."""


# made for each test, not once: the mutation tool maps a line to the tests that run it
@pytest.fixture
def zoo_table() -> dict[str, Any]:
    return json.loads(dumps(build(zoo)))


@pytest.fixture
def zoo_cli() -> Any:
    return prepared(zoo)


def test_the_zoo_has_what_it_is_for(zoo_table: dict[str, Any]) -> None:
    kinds = {p["completes"]["kind"] for n in zoo_table["commands"].values() for p in n["params"]}
    assert kinds == {"none", "word", "choices", "prefix"}
    paths = zoo_table["commands"]["paths"]
    assert [nargs for _, nargs in paths["arguments"]] == [1, -1, 1]
    assert zoo_table["commands"]["two"]["arguments"] == [["xy", 2]]
    assert zoo_table["commands"]["argd"]["arguments"] == [["where", 1]]
    mode = next(p for p in paths["params"] if p["name"] == "mode")
    assert mode["completes"] == {
        "kind": "choices",
        "items": [["fast", None], ["Careful", None]],
        "case_sensitive": False,
    }
    # rich's markup is rendered away in zsh's, fish's and PowerShell's help texts
    assert set(zoo_table["render"].values()) == {
        "A name\\\\: with a colon.",
        "A name: with a colon.",
        "Yellow.",
    }
    assert zoo_table["commands"]["loose"]["ignore_unknown"]
    assert "grp deep end" in zoo_table["commands"]


@pytest.mark.parametrize(
    "key", ["", "paths", "loose", "pass1", "two", "argd", "grp", "grp leaf", "grp deep end"]
)
def test_the_zoo_completes_as_typer_does(
    key: str, zoo_table: dict[str, Any], zoo_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if key.count(" ") and not click_follows_nested_groups(zoo_cli):
        pytest.skip("click 8.2.0 stops at a nested group (see _click_follows_nested_groups)")
    assert check_completions(systematic_lines(zoo_table, key), zoo_cli, monkeypatch, zoo_table) > 0


@pytest.mark.parametrize("seed", range(2))
def test_random_command_lines_of_the_zoo_complete_as_typer_does(
    seed: int, zoo_table: dict[str, Any], zoo_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    check_completions(random_lines(zoo_table, 400, seed), zoo_cli, monkeypatch, zoo_table)


def _not_a_prefix_filter(incomplete: str) -> list[str]:
    return ["apple"] if not incomplete else ["avocado"]  # depends on more than a prefix


def test_a_completer_that_is_not_a_prefix_filter_is_refused() -> None:
    odd = typer.Typer()

    @odd.command()
    def cmd(x: str = typer.Option("", autocompletion=_not_a_prefix_filter)) -> None:
        """Offers a word that was not offered for less."""

    with pytest.raises(SystemExit, match="not a prefix filter"):
        build(odd)


def test_the_help_option_is_tabled_in_its_declared_order() -> None:
    cli = typer.main.get_command(app)
    ctx = context(cli, ["load"])
    option = ctx.command.get_help_option(ctx)
    option.opts = ["--help", "-h"]  # as a set may give them
    _help_in_declared_order(ctx.command, ctx)
    assert option.opts == ["-h", "--help"]
