"""Replay reports as text and JSON, for the CLI."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pyarrow as pa

from .. import formats, output
from .engine import Finding, ReplayReport


def until(report: ReplayReport, step: int) -> ReplayReport:
    """Only the findings at or before ``step``."""
    kept = [f for f in report.findings if f.step <= step]
    counts: dict[str, int] = {}
    for f in kept:
        counts[f.invariant] = counts.get(f.invariant, 0) + 1
    return dataclasses.replace(report, findings=kept, counts=counts)


def first_only(report: ReplayReport) -> ReplayReport:
    return dataclasses.replace(report, findings=report.findings[:1])


def _ids(f: Finding) -> str:
    parts = [f"event {f.event}", f"op {f.op}"]
    if f.request is not None:
        parts.append(f"request {f.request}")
    if f.other_requests:
        parts.append(f"other requests {f.other_requests}")
    if f.block_id is not None:
        parts.append(f"block {f.block_id}")
    if f.block_index is not None:
        parts.append(f"block index {f.block_index}")
    return ", ".join(parts)


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
        f = report.findings[0]
        lines.append(f"step {f.step}: {f.message}")
        lines.append(f"  {f.invariant}: {_ids(f)}")
        lines.append(f"  expected {f.expected}; found {f.found}")
        return _shown(lines)
    shown = report.findings if limit is None else report.findings[:limit]
    rows = [
        [
            f.step,
            f.invariant,
            f.op,
            f.request or "",
            f.block_id if f.block_id is not None else "",
            f.message,
        ]
        for f in shown
    ]
    header = ["step", "invariant", "op", "request", "block", "message"]
    lines += output.text_table(header, rows).split("\n")
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
    ]
)


def findings_table(report: ReplayReport) -> pa.Table:
    """A replay's findings as rows (``replay -f csv``, ``parquet``...), one a finding."""
    return pa.Table.from_pylist([f.to_dict() for f in report.findings], FINDING_SCHEMA)
