"""The table that TAB completion answers from, made from the CLI itself.

A shell's TAB runs `pagedkv-sql` with `_PAGEDKV_SQL_COMPLETE` set; typer would import itself,
build every command and coerce the root's options through pydantic (0.3-0.5 s a TAB on this
machine). pagedkv_sql/completion.py answers instead from cli/completion.json, which
this module makes: every command, its parameters as click's parser and typer's completion
see them, and what each parameter completes to. `make completion` rewrites it;
tests/test_cli_completion_table.py fails when it is stale; tests/test_completion.py holds
every answer equal to typer's.

What a parameter completes to is asked of typer here, once: choices (an Enum, a Literal),
the incomplete word itself (a path), nothing, or a completer's answers (`autocompletion=`),
which must be a pure function of the incomplete word keeping the names that start with it
(checked here, and refused otherwise)."""

from __future__ import annotations

import json
import re
from typing import Any

from typer.main import get_command

from ..completion import escape_zsh

PROG = "pagedkv-sql"


def build(app: Any) -> dict[str, Any]:
    """The table for the CLI `app` (a typer app) as it is now: what `make completion` writes,
    for `pagedkv_sql.cli.app`. The app is passed in: a module of the shell's floor imports
    no command group nor cli/__init__.py (tests/test_layering.py)."""
    root = get_command(app)
    commands: dict[str, Any] = {}
    helps: set[str] = set()
    _visit(root, [], commands, helps)
    return {
        "about": "Written by `make completion` (pagedkv_sql/cli/completion_table.py); "
        "read by pagedkv_sql/completion.py. Do not edit.",
        "commands": commands,
        "render": _rendered(helps),
    }


def _visit(root: Any, path: list[str], commands: dict[str, Any], helps: set[str]) -> None:
    ctx = context(root, path)
    command: Any = ctx.command
    parser = command.make_parser(ctx)
    params = command.get_params(ctx)
    _help_in_declared_order(command, ctx)
    index = {id(param): i for i, param in enumerate(params)}
    entry: dict[str, Any] = {
        "interspersed": bool(ctx.allow_interspersed_args),
        "ignore_unknown": bool(ctx.ignore_unknown_options),
        "parser_prefixes": sorted(parser._opt_prefixes),
        "long": {opt: _parser_option(o, index) for opt, o in parser._long_opt.items()},
        "short": {opt: _parser_option(o, index) for opt, o in parser._short_opt.items()},
        "arguments": [[a.dest, a.nargs] for a in parser._args],
        "params": [_param(ctx, param, helps) for param in params],
    }
    if ctx.token_normalize_func is not None:  # pragma: no cover - none of ours normalizes
        raise SystemExit(f"{PROG} {' '.join(path)}: token_normalize_func is not tabled")
    subcommands = getattr(command, "commands", None)
    if subcommands is not None:
        listed = []
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            short = sub.get_short_help_str()
            helps.add(short)
            listed.append([name, short, bool(sub.hidden)])
        entry["commands"] = listed
    commands[" ".join(path)] = entry
    for name in sorted(subcommands or ()):
        _visit(root, [*path, name], commands, helps)


def context(root: Any, path: list[str]) -> Any:
    """The click context of the command at `path`, made as completion makes it (resilient:
    no callback runs). Not click's `_resolve_context`: click 8.2.0's stops at a nested group."""
    ctx = root.make_context(PROG, [], resilient_parsing=True)
    for name in path:
        command = ctx.command.get_command(ctx, name)
        ctx = command.make_context(name, [], parent=ctx, resilient_parsing=True)
    return ctx


def _help_in_declared_order(command: Any, ctx: Any) -> None:
    """The help option's names in the order declared (`-h`, `--help`).

    click makes them from a set, so typer lists them in an order that changes from one run
    to the next (string hashing); the table, and the comparison with typer, keep one."""
    option = command.get_help_option(ctx)
    if option is not None:
        option.opts = [name for name in ctx.help_option_names if name in option.opts]


def _parser_option(option: Any, index: dict[int, int]) -> list[Any]:
    """[the parameter's index, the parser action, nargs, whether a const value is stored]."""
    return [index[id(option.obj)], option.action, option.nargs, option.const is not None]


def _param(ctx: Any, param: Any, helps: set[str]) -> dict[str, Any]:
    is_option = param.param_type_name == "option"
    help_text = getattr(param, "help", None) or None
    if is_option and help_text:
        helps.add(help_text)
    spec = _completes_to(ctx, param)
    for _, item_help in spec.get("items", []):
        if item_help:
            helps.add(item_help)
    return {
        "name": param.name,
        "option": is_option,
        "opts": list(param.opts),
        "secondary": list(param.secondary_opts),
        "flag": bool(getattr(param, "is_flag", False)),
        "count": bool(getattr(param, "count", False)),
        "multiple": bool(param.multiple),
        "nargs": param.nargs,
        "hidden": bool(getattr(param, "hidden", False)),
        "help": help_text if is_option else None,
        "completes": spec,
    }


def _completes_to(ctx: Any, param: Any) -> dict[str, Any]:
    """What typer completes this parameter's value to, asked of typer."""
    everything = param.shell_complete(ctx, "")
    items = [[item.value, item.help or None] for item in everything]
    if getattr(param, "_custom_shell_complete", None) is not None:
        for value, _ in items:  # a completer must keep what starts with the word
            for cut in range(len(value) + 1):
                got = [i.value for i in param.shell_complete(ctx, value[:cut])]
                want = [v for v, _ in items if v.startswith(value[:cut])]
                if got != want:
                    raise SystemExit(
                        f"{param.name}: its completer is not a prefix filter of {want!r} "
                        f"(for {value[:cut]!r} it gave {got!r}): the table cannot hold it"
                    )
        return {"kind": "prefix", "items": items}
    if not everything:
        return {"kind": "none"}
    if len(everything) == 1 and everything[0].value == "" and everything[0].type != "plain":
        return {"kind": "word"}  # a path: the shell completes the incomplete word itself
    sensitive = True
    for value, _ in items:
        if value.swapcase() != value:
            found = [i.value for i in param.shell_complete(ctx, value.swapcase())]
            sensitive = value not in found
            break
    return {"kind": "choices", "items": items, "case_sensitive": sensitive}


def _rendered(helps: set[str]) -> dict[str, str]:
    """Each text typer passes through rich (markup, emoji codes) for zsh, fish and
    PowerShell, as rich renders it, where that changes it.

    Rendered at an unbounded width: typer's rich wraps at the terminal's, putting newlines
    into zsh's list (its eval joins them again) and into fish's and PowerShell's, where each
    line is a completion; the table answers unwrapped (docs/decisions.md)."""
    try:
        from rich.console import Console
    except ImportError:  # pragma: no cover - typer 0.16+ requires rich
        return {}
    console = Console(width=10**6)
    render: dict[str, str] = {}
    for text in sorted(helps):
        for form in (escape_zsh(text), re.sub(r"\s", " ", text), text):
            out = "".join(s.text for s in console.render(form)).rstrip("\n")
            if out != form:
                render[form] = out
    return render


def dumps(table: dict[str, Any]) -> str:
    """The table as `make completion` writes it (stable: sorted keys, one line a command)."""
    return json.dumps(table, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
