"""TAB completion answered from the table (pagedkv_sql/completion.py), against typer's own.

typer takes 0.36 s (bash) and 0.52 s (zsh) a TAB, importing itself, click, rich and
pydantic to answer it; the table answers in a few milliseconds. These tests hold
the two answers equal, byte for byte, in every shell typer supports: on every command with
every word that can follow it, and on thousands of random command lines made of the CLI's
own words; and the same on a zoo app of what click and typer offer and our CLI does not use
yet. typer renders help through rich at an unbounded width here (TERMINAL_WIDTH):
the table does not wrap (docs/decisions.md); what zsh shows is the same at any width.
"""

from __future__ import annotations

import enum
import json
import os
import random
import subprocess
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import typer.main
import typer.rich_utils

from pagedkv_sql import completion
from pagedkv_sql.cli import app
from pagedkv_sql.cli.completion_table import _help_in_declared_order, build, context, dumps

try:
    from typer._click.shell_completion import _resolve_context, get_completion_class
except ImportError:  # typer 0.16 uses click's
    from click.shell_completion import (  # type: ignore[no-redef]
        _resolve_context,
        get_completion_class,
    )
from typer._completion_classes import completion_init

TABLE = json.loads(Path(completion.TABLE).read_text(encoding="utf-8"))
# what a TAB must not wait for: typer and what it imports, and the library's heavy parts
HEAVY = ("typer", "click", "rich", "pydantic", "duckdb", "pyarrow", "numpy")
ENV_KEYS = (
    "COMP_WORDS",
    "COMP_CWORD",
    "_TYPER_COMPLETE_ARGS",
    "_TYPER_COMPLETE_WORD_TO_COMPLETE",
    "_TYPER_COMPLETE_FISH_ACTION",
)


def test_the_table_is_made_from_the_cli_as_it_is() -> None:
    # a command or option changed without `make completion`: TAB would offer the old ones
    assert dumps(build(app)) == Path(completion.TABLE).read_text(encoding="utf-8"), (
        "pagedkv_sql/cli/completion.json is stale. Fix: make completion"
    )


@contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in ENV_KEYS}
    for key in ENV_KEYS:
        os.environ.pop(key, None)
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _prepared(app: Any) -> Any:
    """The click command typer makes of `app`, its completion classes registered."""
    completion_init()
    cli = typer.main.get_command(app)
    for key in build(app)["commands"]:  # `-h` and `--help` in one order (typer's is a set's)
        ctx = context(cli, key.split())
        _help_in_declared_order(ctx.command, ctx)
    return cli


@pytest.fixture(scope="module")
def typer_cli() -> Any:
    return _prepared(app)


def _nested(table: dict[str, Any], words: list[str]) -> bool:
    """Whether these words reach a command inside a group inside the root (`export vllm`)."""
    try:
        node = completion._resolve_context(table["commands"], list(words)).node
    except completion._Unsupported:  # the zoo's `two`, at the root
        return False
    key = next(key for key, entry in table["commands"].items() if entry is node)
    return key.count(" ") >= 1


def _click_follows_nested_groups(cli: Any) -> bool:
    """click 8.2.0 (typer 0.16's floor) stops at a nested group: `pagedkv-sql export vllm -`
    completes `export`'s options there, a bug of click's fixed in 8.2.1. The table answers
    as typer 0.29 does; on 8.2.0 those command lines are not compared."""
    group = next(name for name, sub in cli.commands.items() if hasattr(sub, "commands"))
    inner = next(iter(cli.commands[group].commands))
    return bool(_resolve_context(cli, {}, "pagedkv-sql", [group, inner]).command.name == inner)


def typers(cli: Any, shell: str, env: dict[str, str], monkeypatch: Any) -> str | int:
    """What typer prints for this completion (no final newline), or the exit code."""
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 10**6)
    cls = get_completion_class(shell)
    assert cls is not None
    with _environ(env):
        try:
            return str(cls(cli, {}, "pagedkv-sql", "_PAGEDKV_SQL_COMPLETE").complete())
        except SystemExit as e:
            return int(e.code or 0)


def ours(shell: str, env: dict[str, str], table: dict[str, Any] = TABLE) -> str | int:
    return completion.complete(table, shell, env)


def requests(words: list[str], incomplete: str) -> list[tuple[str, dict[str, str]]]:
    """The one command line (the words typed, then the one being typed) as each shell asks."""
    import shlex

    typed = " ".join(shlex.quote(w) for w in ["pagedkv-sql", *words])
    line = f"{typed} {shlex.quote(incomplete) if incomplete else ''}"
    ps_line = f"{typed} {shlex.quote(incomplete)}" if incomplete else f"{typed} "
    return [
        ("bash", {"COMP_WORDS": line, "COMP_CWORD": str(len(words) + 1)}),
        ("zsh", {"_TYPER_COMPLETE_ARGS": line}),
        ("fish", {"_TYPER_COMPLETE_ARGS": line, "_TYPER_COMPLETE_FISH_ACTION": "get-args"}),
        ("fish", {"_TYPER_COMPLETE_ARGS": line, "_TYPER_COMPLETE_FISH_ACTION": "is-args"}),
        (
            "powershell",
            {"_TYPER_COMPLETE_ARGS": ps_line, "_TYPER_COMPLETE_WORD_TO_COMPLETE": incomplete},
        ),
    ]


def _options(node: dict[str, Any]) -> list[str]:
    return [opt for p in node["params"] for opt in [*p["opts"], *p["secondary"]]]


def _vocabulary(table: dict[str, Any]) -> list[str]:
    """Every word the CLI knows, and words it does not, to type at it."""
    words = {"--", "-", "=", "x", "data/", "-vv", "-vq", "-fjson", "--bogus", "-Z", "--db=x"}
    for node in table["commands"].values():
        words.update(name for name, _, _ in node.get("commands", ()))
        words.update(_options(node))
        words.update(opt + "x" for opt in node["short"])  # a value attached: -ox
        for param in node["params"]:
            for value, _ in param["completes"].get("items", ()):
                words.add(value)
                words.add(value[:1])
    return sorted(words)


def _systematic(table: dict[str, Any], key: str) -> list[tuple[list[str], str]]:
    """The command at `key`, then each of its options (and a value), with what may follow."""
    node = table["commands"][key]
    path = key.split() if key else []
    cases: list[tuple[list[str], str]] = []
    following = ["", "-", "--", "-x", "=", "z"]
    following += [name[:1] for name, _, _ in node.get("commands", ())]
    for param in node["params"]:
        for opt in [*param["opts"], *param["secondary"]]:
            following += [opt, opt[:3], f"{opt}=", f"{opt}=a"]
            for value, _ in param["completes"].get("items", ()):
                following += [f"{opt}={value[:1]}"]
    for word in following:
        cases.append((path, word))
    options = _options(node)
    for param in node["params"]:
        for opt in [*param["opts"], *param["secondary"]]:
            cases.append(([*path, opt], ""))
            cases.append(([*path, opt], "-"))
            cases.append(([*path, opt, "v"], ""))
            cases.append(([*path, opt, "v"], "--"))
            for value, _ in param["completes"].get("items", ()):
                cases.append(([*path, opt], value[:1]))
                cases.append(([*path, opt], value[:1].upper()))
    takes_value = [opt for opt, o in {**node["long"], **node["short"]}.items() if o[1] == "store"]
    for opt in takes_value:  # a value attached (-ov, --out=v), then more options
        attached = f"{opt}v" if opt in node["short"] else f"{opt}=v"
        for other in options[:4]:
            cases.append(([*path, attached, other, "w"], "--"))
    for cluster in ("-" + "".join(o[1] for o in node["short"]), "-" + "".join(node["short"])[1:]):
        cases.append(([*path, cluster], "-"))
        cases.append(([*path, cluster, "a"], ""))
    cases.append(([*path, "a"], ""))
    cases.append(([*path, "a", "b"], "-"))
    cases.append(([*path, "a", "b", "c"], ""))
    cases.append(([*path, "--", "-"], "-"))
    cases.append(([*path, "--bogus"], ""))
    cases.append(([*path, "--bogus", "a"], "--"))
    cases.append((["--db", "x", *path], ""))
    cases.append((["-v", "-q", *path], "--"))
    return cases


def _random(table: dict[str, Any], count: int, seed: int) -> list[tuple[list[str], str]]:
    rng = random.Random(seed)
    vocabulary = _vocabulary(table)
    commands = [key.split() for key in table["commands"]]
    cases = []
    for _ in range(count):
        words = list(rng.choice(commands)) if rng.random() < 0.8 else []
        words += [rng.choice(vocabulary) for _ in range(rng.randrange(6))]
        if rng.random() < 0.1:
            rng.shuffle(words)
        incomplete = rng.choice(["", *vocabulary]) if rng.random() < 0.9 else "--d"
        cases.append((words, incomplete))
    return cases


def _check(
    cases: list[tuple[list[str], str]], cli: Any, monkeypatch: Any, table: dict[str, Any] = TABLE
) -> int:
    checked = 0
    nested_too = _click_follows_nested_groups(cli)
    for words, incomplete in cases:
        if not nested_too and _nested(table, words):
            continue
        for shell, env in requests(words, incomplete):
            want = typers(cli, shell, env, monkeypatch)
            try:
                got = ours(shell, env, table)
            except completion._Unsupported:  # typer answers these: an argument of
                assert {"two", "argd"} & set(words)  # several values, a group's own
                continue
            assert got == want, (shell, env)
            checked += 1
    return checked


@pytest.mark.parametrize("key", sorted(TABLE["commands"]))
def test_every_command_and_option_completes_as_typer_does(
    key: str, typer_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if key.count(" ") and not _click_follows_nested_groups(typer_cli):
        pytest.skip("click 8.2.0 stops at a nested group (see _click_follows_nested_groups)")
    assert _check(_systematic(TABLE, key), typer_cli, monkeypatch) >= 50


@pytest.mark.parametrize("seed", range(4))
def test_random_command_lines_complete_as_typer_does(
    seed: int, typer_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _check(_random(TABLE, 400, seed), typer_cli, monkeypatch)


def test_the_comparison_can_fail(typer_cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # the same check on a table with one command's options in a different order fails
    table = json.loads(json.dumps(TABLE))
    table["commands"]["load"]["params"].reverse()
    env = {"_TYPER_COMPLETE_ARGS": "pagedkv-sql load --"}
    assert completion.complete(table, "zsh", env) != typers(typer_cli, "zsh", env, monkeypatch)


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
    return _prepared(zoo)


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
    if key.count(" ") and not _click_follows_nested_groups(zoo_cli):
        pytest.skip("click 8.2.0 stops at a nested group (see _click_follows_nested_groups)")
    assert _check(_systematic(zoo_table, key), zoo_cli, monkeypatch, zoo_table) > 0


@pytest.mark.parametrize("seed", range(2))
def test_random_command_lines_of_the_zoo_complete_as_typer_does(
    seed: int, zoo_table: dict[str, Any], zoo_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _check(_random(zoo_table, 400, seed), zoo_cli, monkeypatch, zoo_table)


def _not_a_prefix_filter(incomplete: str) -> list[str]:
    return ["apple"] if not incomplete else ["avocado"]  # depends on more than a prefix


def test_a_completer_that_is_not_a_prefix_filter_is_refused() -> None:
    odd = typer.Typer()

    @odd.command()
    def cmd(x: str = typer.Option("", autocompletion=_not_a_prefix_filter)) -> None:
        """Offers a word that was not offered for less."""

    with pytest.raises(SystemExit, match="not a prefix filter"):
        build(odd)


@pytest.mark.parametrize("width", [40, 80, 132])
def test_what_zsh_shows_is_typers_at_any_terminal_width(
    width: int, typer_cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # typer's zsh script runs `eval $(...)`: the shell splits the answer at any white space,
    # so rich's line breaks are gone by the time zsh reads it
    for key in TABLE["commands"]:
        if key.count(" ") and not _click_follows_nested_groups(typer_cli):
            continue
        env = {"_TYPER_COMPLETE_ARGS": f"pagedkv-sql {key} --"}
        want = typers(typer_cli, "zsh", env, monkeypatch)
        monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", width)
        cls = get_completion_class("zsh")
        assert cls is not None
        with _environ(env):
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


def test_the_help_option_is_tabled_in_its_declared_order() -> None:
    cli = typer.main.get_command(app)
    ctx = context(cli, ["load"])
    option = ctx.command.get_help_option(ctx)
    option.opts = ["--help", "-h"]  # as a set may give them
    _help_in_declared_order(ctx.command, ctx)
    assert option.opts == ["-h", "--help"]
