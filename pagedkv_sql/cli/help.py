"""Plain click-style help for the CLI, the same on every typer we support.

typer 0.16 prints arguments as click does but escapes brackets (``\\[required]``) when rich
is installed; typer 0.2x prints type tags (``SEQ_ID <str>``, ``--at <int>``) and braces in
the usage line (``{SEQ_ID}``). These classes write what click users expect: ``SEQ_ID`` and
``[LOG]`` for arguments, ``--at INTEGER`` or the option's metavar, ``[a|b]`` for choices."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

# typer 0.2x's type tags, as click names the types
_TYPE_NAMES = {
    "int": "INTEGER",
    "int range": "INTEGER",
    "float": "FLOAT",
    "float range": "FLOAT",
    "str": "TEXT",
    "bool": "BOOLEAN",
    "path": "PATH",
    "file": "PATH",
    "dir": "DIRECTORY",
}
_TAGGED = re.compile(r"^(.*?) <([^<>]*)>$")


def argument_name(param: Any) -> str:
    """An argument as the usage line and the Arguments section show it."""
    name = param.metavar or (param.name or "").upper()
    if param.nargs != 1:
        name += "..."
    return name if param.required else f"[{name}]"


def _option_name(record_name: str) -> str:
    names = []
    for part in record_name.split(" / "):  # --diagnostics / --no-diagnostics
        tagged = _TAGGED.match(part)
        if tagged:
            opts, tag = tagged.groups()
            metavar = f"[{tag}]" if "|" in tag else _TYPE_NAMES.get(tag, tag.upper())
            part = f"{opts} {metavar}"
        names.append(re.sub(r" (INTEGER|FLOAT) RANGE$", r" \1", part))  # typer 0.16's
    return " / ".join(names)


def _records(ctx: Any, params: list[Any]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    arguments, options = [], []
    for param in params:
        record = param.get_help_record(ctx)
        if record is None:
            continue
        name, text = record
        text = text.replace("\\[", "[")  # typer 0.16 escapes for rich, which we do not use
        if param.param_type_name == "argument":
            arguments.append((argument_name(param), text))
        elif param.param_type_name == "option":
            options.append((_option_name(name), text))
    return arguments, options


def _write(ctx: Any, params: list[Any], formatter: Any) -> None:
    arguments, options = _records(ctx, params)
    if arguments:
        with formatter.section("Arguments"):
            formatter.write_dl(arguments)
    if options:
        with formatter.section("Options"):
            formatter.write_dl(options)


def _usage(command: Any, ctx: Any) -> list[str]:
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        if param.param_type_name == "argument":
            pieces.append(argument_name(param))
    return pieces


def examples(*lines: str) -> str:
    """A command's Examples (its epilog): command lines, each shown as written, a comment
    after two spaces and a '#' (tests/test_cli_help.py parses every one)."""
    return "\n".join(lines)


def _examples(epilog: str | None, formatter: Any) -> None:
    if epilog:
        with formatter.section("Examples"):
            for line in epilog.splitlines():
                formatter.write(f"{'':>{formatter.current_indent}}{line}\n")


class PlainCommand(TyperCommand):
    """A command whose help reads the same on every supported typer, its examples last."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage(self, ctx)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        _write(ctx, self.get_params(ctx), formatter)

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        _examples(self.epilog, formatter)


class PlainGroup(TyperGroup):
    """A group whose help reads the same on every supported typer."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*_usage(self, ctx), self.subcommand_metavar]

    def format_options(self, ctx: Any, formatter: Any) -> None:
        _write(ctx, self.get_params(ctx), formatter)
        self.format_commands(ctx, formatter)

    def format_epilog(self, ctx: Any, formatter: Any) -> None:
        _examples(self.epilog, formatter)


class PlainTyper(typer.Typer):
    """``typer.Typer`` whose group and commands write plain click-style help."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=PlainGroup, **kwargs)

    def command(
        self, *args: Any, cls: type[TyperCommand] | None = None, **kwargs: Any
    ) -> Callable[[Any], Any]:
        return super().command(*args, cls=cls or PlainCommand, **kwargs)
