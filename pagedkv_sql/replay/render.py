"""Replay reports as text and JSON, for the CLI."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pyarrow as pa

from .. import findings, formats, output
from .engine import ReplayReport


def until(report: ReplayReport, step: int) -> ReplayReport:
    """Only the findings at or before ``step``."""
    kept = [f for f in report.findings if f.step <= step]
    return dataclasses.replace(report, findings=kept, counts=findings.counts(kept))


def first_only(report: ReplayReport) -> ReplayReport:
    return dataclasses.replace(report, findings=report.findings[:1])


def _shown(lines: list[str]) -> str:
    """The report's lines, each through the one terminal escaper (``formats.printable``)."""
    return "\n".join(formats.printable(line) for line in lines)


def text_report(report: ReplayReport, limit: int | None = None) -> str:
    lines = [
        f"replayed {report.steps} step(s), {report.events} event(s), {report.requests} request(s)"
    ]
    if report.mark is not None:
        lines.append(report.mark.text())
    if report.ok:
        lines.append("no invariant broken")
        return _shown(lines)
    if len(report.findings) == 1 and not report.counts:
        lines += findings.text(report.findings[0])
        return _shown(lines)
    shown = report.findings if limit is None else report.findings[:limit]
    lines += output.text_table(
        list(findings.TABLE_HEADER), [findings.table_row(f) for f in shown]
    ).split("\n")
    if len(report.findings) > len(shown):
        lines.append(f"... and {len(report.findings) - len(shown)} more (--limit 0 shows all)")
    found = ", ".join(f"{name} {n}" for name, n in sorted(report.counts.items()))
    total = sum(report.counts.values())
    lines.append(f"{total} finding(s): {found}; first at step {report.findings[0].step}")
    return _shown(lines)


def json_report(report: ReplayReport) -> str:
    return json.dumps(report.to_dict(), indent=2)


def diff_text(changes: pa.Table, a: int, b: int) -> str:
    rows = changes.to_pylist()
    if not rows:
        return f"no change from step {a} to step {b}"
    cols = changes.column_names
    body = [["" if r[c] is None else r[c] for c in cols] for r in rows]
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r["change"]] = kinds.get(r["change"], 0) + 1
    summary = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    return "\n".join([output.text_table(cols, body), f"from step {a} to step {b}: {summary}"])


def diff_document(changes: pa.Table, a: int, b: int) -> dict[str, Any]:
    """``diff -f json``: one document, as every json of the tool (JSON Lines is jsonl)."""
    return {"from_step": a, "to_step": b, "changes": changes.to_pylist()}


FINDING_SCHEMA = pa.schema(
    [
        ("invariant", pa.string()),
        ("check", pa.string()),
        ("event", pa.int64()),
        ("step", pa.int64()),
        ("op", pa.string()),
        ("request", pa.string()),
        ("other_requests", pa.string()),
        ("block_id", pa.int64()),
        ("block_index", pa.int64()),
        ("expected", pa.string()),
        ("found", pa.string()),
        ("message", pa.string()),
        ("cause", pa.string()),
    ]
)


def findings_table(report: ReplayReport) -> pa.Table:
    """A replay's findings as rows (``replay -f csv``, ``parquet``...), one a finding."""
    rows = [{**dataclasses.asdict(f), "invariant": f.invariant} for f in report.findings]
    return pa.Table.from_pylist(rows, FINDING_SCHEMA)
