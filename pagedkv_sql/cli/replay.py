"""Step logs (pagedkv_sql/replay): `replay` checks every invariant at every step, `diff`
says what changed between two steps."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from .. import paths
from ..formats import ReportFormat
from . import common
from .common import DbOption, OutOption, ReportOption, guard
from .help import examples

REPLAY_EXAMPLES = examples(
    "pagedkv-sql replay run.jsonl  # the first step that broke an invariant: exit 1",
    "pagedkv-sql replay run.jsonl.gz --keep-going -o findings.csv",
    "pagedkv-sql replay run.jsonl --at 300  # then resolve, check, explain that state",
)


def register(app: typer.Typer) -> None:
    app.command(epilog=REPLAY_EXAMPLES)(replay)
    app.command()(diff)


def replay(
    log: str | None = typer.Argument(
        None,
        help="Step log: .jsonl (or - for stdin), or its event table (.parquet, .arrow); "
        "omitted: the log stored in the database.",
        show_default=False,
    ),
    db: str | None = DbOption,
    keep_going: bool = typer.Option(
        False, "--keep-going", "-k", help="Report every broken step, not only the first."
    ),
    at: int | None = typer.Option(
        None,
        "--at",
        metavar="STEP",
        help="Write the state at the end of STEP into the spec's tables (then resolve, check, "
        "explain, stats read it); the exit status counts findings up to STEP only.",
        show_default=False,
    ),
    events: Path | None = typer.Option(
        None,
        "--events",
        metavar="FILE",
        help="Also write the log's event table to FILE (.parquet, or .arrow: Arrow IPC; "
        ".gz or .zst after it compresses).",
        show_default=False,
    ),
    fmt: ReportFormat | None = ReportOption,
    out: str | None = OutOption,
    limit: int = common.limit_option(100, "Findings shown with --keep-going (0: all)."),
    max_errors: int = common.max_errors_option(),
) -> None:
    """Replay an engine's step log: check every invariant at every step at once and name
    the first step that broke one (exit 1), with its request and block ids. Tabular
    formats write the findings, one row each."""
    from .. import replay as replaying
    from ..replay import render

    with guard():  # before the database is opened: a refused --output changes nothing
        fmt_name = common.report_format(out, fmt)
        if events is not None:
            from ..replay.log import events_format

            events_format(events)
    with guard(max_errors), common.open_to_write(db) as database:
        inputs = [log] if log not in (None, "-") else []
        if events is not None:
            paths.protect_output(events, database.path, inputs)
        if out not in (None, "-"):
            paths.protect_output(out, database.path, inputs)
        source: Any = log
        if log == "-":
            source = sys.stdin.buffer
        with common.progress(database, "replay"):
            report = replaying.run(
                database, source, keep_going=keep_going or at is not None, limit=None
            )
            if events is not None:
                replaying.write_events(replaying.stored_events(database), events)
            if at is not None:
                done = replaying.at(database, at)
                report = render.until(report, at)
        if not keep_going:
            report = render.first_only(report)
        common.write_report(
            out,
            fmt_name,
            render.text_report(report, limit or None),
            report.to_dict(),
            render.findings_table(report),
            database.path,
        )
        if at is not None:
            sizes = ", ".join(f"{r} {n}" for r, n in done.rows.items())
            common.err(f"state at step {at} written to {database.path}: {sizes}")
    if not report.ok:
        raise typer.Exit(1)


def diff(
    log: str | None = typer.Argument(
        None, help="Step log (default: the one stored by `replay`).", show_default=False
    ),
    from_step: int = typer.Option(
        ..., "--from", metavar="STEP", help="Earlier step.", show_default=False
    ),
    to_step: int = typer.Option(
        ..., "--to", metavar="STEP", help="Later step.", show_default=False
    ),
    db: str | None = DbOption,
    fmt: ReportFormat | None = ReportOption,
    out: str | None = OutOption,
) -> None:
    """What changed between the end of two steps of a step log: requests, block-table
    entries (added, removed, swapped out or in), tokens, refcounts. json is one document;
    tabular formats write the changes, one row each."""
    from .. import replay as replaying
    from ..database import connect
    from ..replay import render

    with guard():
        fmt_name = common.report_format(out, fmt)
        if log is not None:
            with connect(":memory:") as memory, common.progress(memory, "diff"):
                replaying.run(memory, sys.stdin.buffer if log == "-" else log)
                changes = replaying.diff(memory, from_step, to_step)
        else:
            with common.open_read_only(db) as database, common.progress(database, "diff"):
                changes = replaying.diff(database, from_step, to_step)
        common.write_report(
            out,
            fmt_name,
            render.diff_text(changes, from_step, to_step),
            render.diff_document(changes, from_step, to_step),
            changes,
            common.db_path(db),
        )
