"""A fleet behind a KV-aware router (pagedkv_sql/fleet): `fleet check DIR` compares each
replica's events with what it held, and each router's index with the events."""

from __future__ import annotations

import json
import sys
from enum import Enum

import typer

from . import common
from .common import guard
from .help import examples

FLEET_HELP = "A fleet of replicas behind a KV-aware router: its index checked against them."
CHECK_EXAMPLES = examples(
    "pagedkv-sql fleet check run/  # the summary a router, then the findings: exit 1",
    "pagedkv-sql fleet check run/ -f json | jq '.findings[] | {invariant, cause, fault}'",
    "pagedkv-sql fleet check run/ --lag 0.5 --db fleet.duckdb  # keep the tables for `sql`",
)


class FleetFormat(str, Enum):
    text = "text"
    json = "json"


def register(app: typer.Typer) -> None:
    fleet = common.group(app, "fleet", help=FLEET_HELP, epilog=CHECK_EXAMPLES)
    fleet.command("check", epilog=CHECK_EXAMPLES)(fleet_check)


def fleet_check(
    directory: str = typer.Argument(..., metavar="DIR", help="A fleet directory (docs/fleet.md)."),
    fmt: FleetFormat = typer.Option(FleetFormat.text, "--format", "-f", help="text or json."),
    lag: float = typer.Option(
        0.0,
        "--lag",
        metavar="SECONDS",
        min=0.0,
        help="Tolerate a residency mismatch up to this long (0: compare at the same instant, "
        "as `fleet sim` records; a live recording wants its events' delivery lag).",
    ),
    db: str | None = typer.Option(
        None,
        "--db",
        metavar="PATH",
        help="Keep the fleet's tables and views in this database file (default: in memory).",
        show_default=False,
    ),
) -> None:
    """Check a fleet: each replica's KV events against what it held (fault `engine`), then
    each router's index against the events (fault `router`), and each routing decision
    against the truth at its time. A summary a router first, then the findings, each
    with its cause. Exit 0: clean; 1: findings; 2: the directory cannot be read."""
    from .. import fleet
    from ..fleet.output import report_json, report_text

    with guard(), common.open_to_write(db or ":memory:") as database:
        report = fleet.check(database, directory, lag=lag)
        if fmt == FleetFormat.json:
            sys.stdout.write(json.dumps(report_json(report), indent=2) + "\n")
        else:
            sys.stdout.write(report_text(report) + "\n")
    if report.findings:
        raise typer.Exit(1)
