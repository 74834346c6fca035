"""TAB completion, answered before typer is imported.

A shell's TAB runs the console script with `_PAGEDKV_SQL_COMPLETE=complete_<shell>`. typer
answers it by importing itself (and click, rich, pydantic), building every command and
parsing the words typed so far: 0.3-0.5 s a TAB. This module answers the same
question from cli/completion.json, a table made from the CLI by cli/completion_table.py, in
a few milliseconds: it walks the words the way click's parser does in completion mode
(resilient: an error stops the walk where it is, nothing is raised) and answers what typer
would, in the format of each shell typer supports. tests/test_completion.py holds the answers
equal to typer's, word for word, on every command and thousands of random command lines.

Only the standard library is imported. Anything the table does not describe — another
instruction (`source_bash`), a missing table, an argument of several values — returns None
and typer answers as before. One difference, decided (docs/decisions.md): help texts are
not wrapped at the terminal's width (typer's rich breaks them into lines, which fish and
PowerShell then offer as completions of their own)."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

TABLE = os.path.join(os.path.dirname(__file__), "cli", "completion.json")
SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")


class _Usage(Exception):
    """click's UsageError while parsing: in completion mode the parse stops there."""


class _Unsupported(Exception):
    """Something the table does not describe: typer answers instead."""


def answer(environ: Mapping[str, str] | None = None) -> int | None:
    """Answer a TAB completion request: print it, return the exit code. None when this run
    is not one, or not one the table answers: then the CLI runs (and typer answers)."""
    environ = os.environ if environ is None else environ
    main = sys.modules.get("__main__")
    if getattr(main, "__package__", None) not in (None, ""):
        return None  # `python -m pagedkv_sql`: typer names the program otherwise
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    instruction = environ.get(f"_{prog}_COMPLETE".replace("-", "_").upper())
    if not instruction or sys.stdout is None:
        return None
    action, _, shell = instruction.partition("_")
    if action != "complete" or shell not in SHELLS:
        return None
    try:
        with open(TABLE, encoding="utf-8") as f:
            table = json.load(f)
        out = complete(table, shell, environ)
    except Exception:  # the table missing or not this one, or beyond it: typer answers
        return None
    if isinstance(out, int):
        return out
    try:
        sys.stdout.write(out + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):  # a closed or full stdout: the shell gets no answer
        null = os.open(os.devnull, os.O_WRONLY)  # and the flush at exit none to fail on
        os.dup2(null, 1)
        os.close(null)
        return 1
    return 0


def complete(table: dict[str, Any], shell: str, environ: Mapping[str, str]) -> str | int:
    """What typer's `<shell>` completion class prints (without the final newline), or the
    exit code it leaves with instead of printing (fish's `is-args`)."""
    render = table["render"]
    if shell == "bash":
        words = split_arg_string(environ.get("COMP_WORDS", ""))
        cword_text = environ.get("COMP_CWORD", "")
        if not cword_text.isdigit():  # bash always sets both: anything else gets no answer
            return ""
        cword = int(cword_text)
        args = words[1:cword]
        try:
            incomplete = words[cword]
        except IndexError:
            incomplete = ""
        return "\n".join(value for value, _ in completions(table, args, incomplete))
    typed = environ.get("_TYPER_COMPLETE_ARGS", "")
    words = split_arg_string(typed)
    if shell in ("powershell", "pwsh"):
        incomplete = environ.get("_TYPER_COMPLETE_WORD_TO_COMPLETE", "")
        args = words[1:-1] if incomplete else words[1:]
        items = completions(table, args, incomplete)
        return "\n".join(
            f"{value}:::{render.get(help_, help_) if help_ else ' '}" for value, help_ in items
        )
    args = words[1:]
    if args and not typed.endswith(" "):
        incomplete, args = args[-1], args[:-1]
    else:
        incomplete = ""
    items = completions(table, args, incomplete)
    if shell == "zsh":
        if not items:
            return "_files"
        lines = []
        for value, help_ in items:
            if help_:
                text = escape_zsh(help_)
                lines.append(f'"{escape_zsh(value)}":"{render.get(text, text)}"')
            else:
                lines.append(f'"{escape_zsh(value)}"')
        return "_arguments '*: :((" + "\n".join(lines) + "))'"
    shown = []  # fish
    for value, help_ in items:
        if help_:
            text = re.sub(r"\s", " ", help_)
            shown.append(f"{value}\t{render.get(text, text)}")
        else:
            shown.append(value)
    action = environ.get("_TYPER_COMPLETE_FISH_ACTION", "")
    if action == "get-args" and shown:
        return "\n".join(shown)
    if action == "is-args":
        return 0 if shown else 1
    return ""


def escape_zsh(text: str) -> str:
    """typer's ZshComplete escape of a value or help text (cli/completion_table.py uses it
    for the texts it renders)."""
    return (
        text.replace('"', '""')
        .replace("'", "''")
        .replace("$", "\\$")
        .replace("`", "\\`")
        .replace(":", r"\\:")
    )


def split_arg_string(string: str) -> list[str]:
    """click's: shlex.split that keeps an unfinished last word as it is."""
    import shlex

    lex = shlex.shlex(string, posix=True)
    lex.whitespace_split = True
    lex.commenters = ""
    out = []
    try:
        for token in lex:
            out.append(token)
    except ValueError:
        out.append(lex.token)
    return out


# --- what click's shell_completion does, over the table -----------------------------------


class _Context:
    """The part of a click Context that completion reads."""

    __slots__ = ("args", "given", "node", "prefixes", "protected")

    def __init__(self, node: dict[str, Any], parent: _Context | None) -> None:
        self.node = node
        self.given: set[str] = set()  # parameters whose source is the command line
        self.prefixes: set[str] = set(parent.prefixes) if parent else set()
        self.protected: list[str] = []
        self.args: list[str] = []


def completions(
    table: dict[str, Any], args: list[str], incomplete: str
) -> list[tuple[str, str | None]]:
    """click's ShellComplete.get_completions: (value, help) of each item."""
    ctx = _resolve_context(table["commands"], args)
    kind, param, incomplete = _resolve_incomplete(ctx, args, incomplete)
    if kind == "command":
        return _complete_command(ctx, incomplete)
    return _complete_value(param, incomplete)


def _resolve_context(commands: dict[str, Any], args: list[str]) -> _Context:
    path: list[str] = []
    ctx = _make_context(commands[""], list(args), None)
    rest = ctx.protected + ctx.args
    while rest:
        node = ctx.node
        if "commands" not in node:
            break
        name = rest[0]
        if name not in {listed[0] for listed in node["commands"]}:
            return ctx
        path.append(name)
        ctx = _make_context(commands[" ".join(path)], rest[1:], ctx)
        rest = ctx.protected + ctx.args
    return ctx


def _make_context(node: dict[str, Any], args: list[str], parent: _Context | None) -> _Context:
    """Command.make_context with resilient_parsing: parse_args, and no callback runs."""
    ctx = _Context(node, parent)
    largs: list[str] = []
    rargs = list(args)
    try:
        _process_options(node, ctx.given, largs, rargs)
        largs = _process_arguments(node, ctx.given, largs + rargs)
    except _Usage:
        pass
    if "commands" in node:  # TyperGroup.parse_args
        if largs:
            ctx.protected, ctx.args = largs[:1], largs[1:]
    else:
        ctx.args = largs
    ctx.prefixes.update(node["parser_prefixes"])
    return ctx


def _process_options(
    node: dict[str, Any], given: set[str], largs: list[str], rargs: list[str]
) -> None:
    prefixes = node["parser_prefixes"]
    while rargs:
        arg = rargs.pop(0)
        if arg == "--":
            return
        if arg[:1] in prefixes and len(arg) > 1:
            _process_opts(node, arg, given, largs, rargs)
        elif node["interspersed"]:
            largs.append(arg)
        else:
            rargs.insert(0, arg)
            return


def _process_opts(
    node: dict[str, Any], arg: str, given: set[str], largs: list[str], rargs: list[str]
) -> None:
    explicit: str | None = None
    if "=" in arg:
        long_opt, explicit = arg.split("=", 1)
    else:
        long_opt = arg
    option = node["long"].get(long_opt)
    if option is None:
        if arg[:2] not in node["parser_prefixes"]:
            _match_short_opt(node, arg, given, largs, rargs)
            return
        if not node["ignore_unknown"]:
            raise _Usage
        largs.append(arg)
        return
    if option[1] in ("store", "append"):
        if explicit is not None:
            rargs.insert(0, explicit)
        _take_value(option, rargs)
    elif explicit is not None:
        raise _Usage
    _process(node, option, given)


def _match_short_opt(
    node: dict[str, Any], arg: str, given: set[str], largs: list[str], rargs: list[str]
) -> None:
    prefix = arg[0]
    unknown = []
    i = 1
    for ch in arg[1:]:
        option = node["short"].get(f"{prefix}{ch}")
        i += 1
        if option is None:
            if node["ignore_unknown"]:
                unknown.append(ch)
                continue
            raise _Usage
        stop = False
        if option[1] in ("store", "append"):
            if i < len(arg):
                rargs.insert(0, arg[i:])
                stop = True
            _take_value(option, rargs)
        _process(node, option, given)
        if stop:
            break
    if node["ignore_unknown"] and unknown:
        largs.append(f"{prefix}{''.join(unknown)}")


# Completion reads only whether a parameter was given on the command line (its source),
# never its value: `given` holds the parameters for which click's parser leaves a value that
# is not None; the values themselves are consumed, not kept.


def _take_value(option: list[Any], rargs: list[str]) -> None:
    """_OptionParser._get_value_from_state: the option's nargs values, or a usage error."""
    nargs = option[2]
    if len(rargs) < nargs:
        raise _Usage
    del rargs[:nargs]


def _process(node: dict[str, Any], option: list[Any], given: set[str]) -> None:
    """_Option.process: a stored constant of None leaves the parameter not given (even if
    an earlier word gave it); a value, a list of values or a count gives it."""
    index, action, _, has_const = option
    dest = node["params"][index]["name"]
    if action == "store_const" and not has_const:
        given.discard(dest)
    elif action in ("store", "append", "store_const", "append_const", "count"):
        given.add(dest)
    else:
        raise _Unsupported(action)


def _process_arguments(node: dict[str, Any], given: set[str], args: list[str]) -> list[str]:
    """_OptionParser._process_args_for_args, as far as completion reads it: which arguments
    were given, and the words left for a group's command.

    click gives the arguments their values from the left until one of any number (nargs
    -1), which takes all but what those after it take from the right. Completion asks only
    whether an argument before it was given (click's _is_incomplete_argument: the one of any
    number is always still incomplete, and comes first), so each argument here counts as
    given when there are words enough to reach it. A group of ours has no arguments of its
    own (it would keep the words its command is named by): typer answers for one."""
    if "commands" in node and node["arguments"]:
        raise _Unsupported("a group's own arguments")
    for index, (dest, nargs) in enumerate(node["arguments"]):
        if nargs > 1:
            raise _Unsupported("an argument of several values")
        if index < len(args):
            given.add(dest)
        else:
            given.discard(dest)
    return args


def _start_of_option(ctx: _Context, value: str) -> bool:
    return bool(value) and value[0] in ctx.prefixes


def _resolve_incomplete(
    ctx: _Context, args: list[str], incomplete: str
) -> tuple[str, dict[str, Any] | None, str]:
    if incomplete == "=":
        incomplete = ""
    elif "=" in incomplete and _start_of_option(ctx, incomplete):
        name, _, incomplete = incomplete.partition("=")
        args.append(name)
    if "--" not in args and _start_of_option(ctx, incomplete):
        return "command", None, incomplete
    params = ctx.node["params"]
    for param in params:
        if _is_incomplete_option(ctx, args, param):
            return "param", param, incomplete
    for param in params:
        if not param["option"] and (param["nargs"] == -1 or param["name"] not in ctx.given):
            if param["nargs"] > 1:
                raise _Unsupported("an argument of several values")
            return "param", param, incomplete
    return "command", None, incomplete


def _is_incomplete_option(ctx: _Context, args: list[str], param: dict[str, Any]) -> bool:
    if not param["option"] or param["flag"] or param["count"]:
        return False
    last = None
    for index, arg in enumerate(reversed(args)):
        if index + 1 > param["nargs"]:
            break
        if _start_of_option(ctx, arg):
            last = arg
            break
    return last is not None and last in param["opts"]


def _complete_command(ctx: _Context, incomplete: str) -> list[tuple[str, str | None]]:
    node = ctx.node
    items: list[tuple[str, str | None]] = [
        (name, short)
        for name, short, hidden in node.get("commands", ())
        if name.startswith(incomplete) and not hidden
    ]
    if incomplete and not incomplete[0].isalnum():
        for param in node["params"]:
            if (
                not param["option"]
                or param["hidden"]
                or (not param["multiple"] and param["name"] in ctx.given)
            ):
                continue
            items.extend(
                (name, param["help"])
                for name in [*param["opts"], *param["secondary"]]
                if name.startswith(incomplete)
            )
    return items


def _complete_value(param: Any, incomplete: str) -> list[tuple[str, str | None]]:
    spec = param["completes"]
    kind = spec["kind"]
    if kind == "none":
        return []
    if kind == "word":
        return [(incomplete, None)]
    if kind == "prefix" or spec["case_sensitive"]:
        return [(value, help_) for value, help_ in spec["items"] if value.startswith(incomplete)]
    lowered = incomplete.lower()
    return [(value, help_) for value, help_ in spec["items"] if value.lower().startswith(lowered)]
