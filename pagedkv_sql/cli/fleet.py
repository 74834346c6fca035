"""A fleet behind a KV-aware router (pagedkv_sql/fleet): `fleet check DIR` compares each
replica's events with what it held, and each router's index with the events."""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Any

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


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def summary_text(report: Any) -> list[str]:
    """The summary table: one line a router."""
    head = (
        "router",
        "kind",
        "false_res",
        "missed_res",
        "drop_p50",
        "drop_p99",
        "drop_max",
        "never",
        "learn_p50",
        "learn_p99",
        "misroutes",
        "by_load",
        "false_hits",
        "recomputed",
    )
    rows = [head]
    for s in report.summary:
        rows.append(
            (
                s["router"] + (" (routed)" if s["routed"] else ""),
                s["kind"] or "-",
                _num(s["false_rate"]),
                _num(s["missed_rate"]),
                _num(s["drop_p50"]),
                _num(s["drop_p99"]),
                _num(s["drop_max"]),
                _num(s["drop_never"] + s["learn_never"]),
                _num(s["learn_p50"]),
                _num(s["learn_p99"]),
                _num(s["misroutes"]) if report.misroute_checked else "-",
                _num(s["load_misroutes"]),
                _num(s["false_hits"]),
                _num(s["recomputed_tokens"]),
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
    return [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]


def report_text(report: Any) -> str:
    from .. import findings

    lines = [
        f"fleet {report.directory}: {report.counts.get('fleet_event', 0)} event rows, "
        f"{report.counts.get('fleet_truth', 0)} truth intervals, "
        f"{report.counts.get('fleet_belief', 0)} belief intervals, "
        f"{report.counts.get('fleet_decision', 0)} decisions; lag {report.lag:g}s"
    ]
    lines += summary_text(report)
    if not report.misroute_checked:
        lines.append("misroutes not checked: decisions.jsonl carries no request hashes")
    lines.append("")
    if not report.findings:
        lines.append("no findings")
    else:
        by: dict[str, int] = {}
        for f in report.findings:
            by[f.fault] = by.get(f.fault, 0) + 1
        lines.append(
            f"{len(report.findings)} finding(s): "
            + ", ".join(f"{n} {fault}" for fault, n in sorted(by.items()))
        )
        for f in report.findings:
            lines += findings.text(f)
    return "\n".join(lines)


def report_json(report: Any) -> dict[str, Any]:
    from .. import findings

    return {
        "directory": report.directory,
        "lag": report.lag,
        "summary": report.summary,
        "misroute_checked": report.misroute_checked,
        "findings": [findings.as_dict(f) for f in report.findings],
    }


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

    with guard(), common.open_to_write(db or ":memory:") as database:
        report = fleet.check(database, directory, lag=lag)
        if fmt == FleetFormat.json:
            sys.stdout.write(json.dumps(report_json(report), indent=2) + "\n")
        else:
            sys.stdout.write(report_text(report) + "\n")
    if report.findings:
        raise typer.Exit(1)
