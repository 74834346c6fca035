"""A ``FleetReport`` as `fleet check` and `spark fleet check` print it: the summary a
router, then the findings (``report_text``), or one JSON document (``report_json``)."""

from __future__ import annotations

from typing import Any


def num(value: Any) -> str:
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
                num(s["false_rate"]),
                num(s["missed_rate"]),
                num(s["drop_p50"]),
                num(s["drop_p99"]),
                num(s["drop_max"]),
                num(s["drop_never"] + s["learn_never"]),
                num(s["learn_p50"]),
                num(s["learn_p99"]),
                num(s["misroutes"]) if report.misroute_checked else "-",
                num(s["load_misroutes"]),
                num(s["false_hits"]),
                num(s["recomputed_tokens"]),
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
    for s in report.summary:
        if s.get("cause"):
            lines.append(f"{s['router']}: {s['cause']} (measured above, never a finding)")
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
