"""TAB completion answered twice, by typer (the reference) and by the table
(pagedkv_sql/completion.py), in every shell typer supports, on every command line made
systematically or at random from a table's words; held equal by tests/test_completion.py
and tests/test_cli_completion_table.py."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer.main
import typer.rich_utils
from typer._completion_classes import completion_init

from pagedkv_sql import completion
from pagedkv_sql.cli.completion_table import _help_in_declared_order, build, context

try:
    from typer._click.shell_completion import _resolve_context, get_completion_class
except ImportError:  # typer 0.16 uses click's
    from click.shell_completion import (  # type: ignore[no-redef]
        _resolve_context,
        get_completion_class,
    )

TABLE = json.loads(Path(completion.TABLE).read_text(encoding="utf-8"))


ENV_KEYS = (
    "COMP_WORDS",
    "COMP_CWORD",
    "_TYPER_COMPLETE_ARGS",
    "_TYPER_COMPLETE_WORD_TO_COMPLETE",
    "_TYPER_COMPLETE_FISH_ACTION",
)


@contextmanager
def environ(env: dict[str, str]) -> Iterator[None]:
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


def prepared(app: Any) -> Any:
    """The click command typer makes of `app`, its completion classes registered."""
    completion_init()
    cli = typer.main.get_command(app)
    for key in build(app)["commands"]:  # `-h` and `--help` in one order (typer's is a set's)
        ctx = context(cli, key.split())
        _help_in_declared_order(ctx.command, ctx)
    return cli


def nested(table: dict[str, Any], words: list[str]) -> bool:
    """Whether these words reach a command inside a group inside the root (`export vllm`)."""
    try:
        node = completion._resolve_context(table["commands"], list(words)).node
    except completion._Unsupported:  # the zoo's `two`, at the root
        return False
    key = next(key for key, entry in table["commands"].items() if entry is node)
    return key.count(" ") >= 1


def click_follows_nested_groups(cli: Any) -> bool:
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
    with environ(env):
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


def options_of(node: dict[str, Any]) -> list[str]:
    return [opt for p in node["params"] for opt in [*p["opts"], *p["secondary"]]]


def vocabulary_of(table: dict[str, Any]) -> list[str]:
    """Every word the CLI knows, and words it does not, to type at it."""
    words = {"--", "-", "=", "x", "data/", "-vv", "-vq", "-fjson", "--bogus", "-Z", "--db=x"}
    for node in table["commands"].values():
        words.update(name for name, _, _ in node.get("commands", ()))
        words.update(options_of(node))
        words.update(opt + "x" for opt in node["short"])  # a value attached: -ox
        for param in node["params"]:
            for value, _ in param["completes"].get("items", ()):
                words.add(value)
                words.add(value[:1])
    return sorted(words)


def systematic_lines(table: dict[str, Any], key: str) -> list[tuple[list[str], str]]:
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
    options = options_of(node)
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


def random_lines(table: dict[str, Any], count: int, seed: int) -> list[tuple[list[str], str]]:
    rng = random.Random(seed)
    vocabulary = vocabulary_of(table)
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


def check_completions(
    cases: list[tuple[list[str], str]], cli: Any, monkeypatch: Any, table: dict[str, Any] = TABLE
) -> int:
    checked = 0
    nested_too = click_follows_nested_groups(cli)
    for words, incomplete in cases:
        if not nested_too and nested(table, words):
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
