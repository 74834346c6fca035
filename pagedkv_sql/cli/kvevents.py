"""`kv-events`: a recorded stream of prefix-cache events checked on its own (no database;
pagedkv_sql/replay/kvevents.py). A group of its own, registered after `report` so the root
help lists the commands in the order they always had."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..formats import TextFormat
from . import common, text
from .common import TextFormatOption, guard


def register(app: typer.Typer) -> None:
    app.command("kv-events")(kv_events)


def kv_events(
    path: Path = typer.Argument(
        ...,
        help="A recorded stream: msgpack EventBatches (vLLM, SGLang) or JSON Lines (Dynamo).",
        show_default=False,
    ),
    fmt: TextFormat = TextFormatOption,
    limit: int = common.limit_option(100, "Findings shown (0: all)."),
) -> None:
    """Check a recorded stream of prefix-cache events (BlockStored / BlockRemoved /
    AllBlocksCleared): unknown hashes removed, unknown parents, sequence gaps, hashes used
    after AllBlocksCleared; exit 1 on findings."""
    from ..replay import kvevents

    with guard():
        report = kvevents.check_kv_events(kvevents.read_kv_events(path))
    if fmt == "json":
        typer.echo(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        typer.echo(text.kv_events_text(report, limit))
    if not report.ok:
        raise typer.Exit(1)
