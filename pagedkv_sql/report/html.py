"""`pagedkv-sql report`: the whole state of a KV cache as one self-contained HTML page.

Everything is inside the file (plotly.js, the styles, the script and the data), so it opens
on an air-gapped machine and makes no request. Charts are plotly figures; so is the memory
map (pagemap.py: the raster `map` draws, as a heatmap with hover), so the page needs no
matplotlib, and plotly.js comes from the package's assets, so it needs no plotly package.
"""

from __future__ import annotations

import html
import json
import string
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import resources
from typing import Any

from ..check import CheckReport, CheckResult
from ..inspect import Stats
from ..numbers import hex_address
from ..output import HEX_COLUMNS
from . import data, grid, pagemap, palette

# the rows of each finding written into the page; the count is always the full count
DEFAULT_ROWS = 1000
SEQ_COLUMNS = ("seq_id",)
# the columns of a finding's row that the search matches: the ids of sequences, block
# tables and requests (not counts or refcounts, which would match any small number)
KEY_COLUMNS = (
    "seq_id",
    "seq_ids",
    "block_table_id",
    "block_table_ptr",
    "block_table_ptrs",
    "request_id",
    "request_ids",
)
STRIP_COLOURS = {
    ".": "#ffffff",
    "r": "#1f77b4",
    "s": palette.COLOURS[palette.SHARED3],
    "c": palette.COLOURS[palette.SWAPPED],
    "x": palette.COLOURS[palette.MISMATCH],
    "m": "#e377c2",
}
STRIP_RANK = {".": 0, "r": 1, "s": 2, "c": 3, "m": 4, "x": 5}
FONT = "system-ui, -apple-system, Segoe UI, DejaVu Sans, sans-serif"


@dataclass(frozen=True)
class Timeline:
    """Blocks in use per step of a step log (the replay capability fills it in)."""

    steps: list[int]
    series: dict[str, list[int]]  # a name ("gpu blocks", "cpu blocks"...) -> one value a step
    first_bad_step: int | None = None
    first_bad_reason: str = ""


@dataclass(frozen=True)
class ReportInput:
    title: str
    source: str
    stats: Stats
    check: CheckReport
    map: grid.MemoryMap
    sequences: list[data.Sequence]
    request_ids: dict[int, str] = field(default_factory=dict)
    timeline: Timeline | None = None


# plotly.js's cartesian partial bundle (npm plotly.js-cartesian-dist-min 4.1.1, MIT,
# assets/plotly-cartesian.LICENSE): the bar, scatter and heatmap traces the page draws, 1.5 MB
# where the whole plotly.js the plotly package ships is 4.8 MB (docs/benchmarks.md)
PLOTLY_JS = "plotly-cartesian.min.js"


def _asset(name: str) -> str:
    return (resources.files("pagedkv_sql.report") / "assets" / name).read_text(encoding="utf-8")


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


# what could end the <script> element, open a comment or a nested script in it, or start
# an entity, written as JSON escapes (valid JSON: these appear only inside strings)
_SCRIPT_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def _script_json(value: Any) -> str:
    """JSON that is safe inside a <script> element and still valid JSON: ``<``, ``>``,
    ``&``, U+2028 and U+2029 are written as ``\\uXXXX`` (``<\\!--`` is no JSON escape)."""
    return json.dumps(value, separators=(",", ":")).translate(_SCRIPT_ESCAPES)


def _value_cell(column: str, value: Any) -> str:
    if value is None:
        return '<td class="empty">-</td>'
    if isinstance(value, list):
        return f"<td>{_e('[' + ', '.join(str(v) for v in value) + ']')}</td>"
    if isinstance(value, int) and not isinstance(value, bool):
        if column in SEQ_COLUMNS:
            return f'<td class="num"><a class="seq" data-seq="{value}">{value}</a></td>'
        if column in HEX_COLUMNS or column.endswith("_address"):
            return f'<td class="num">{value}<span class="hex">{hex_address(value)}</span></td>'
        return f'<td class="num">{value}</td>'
    cls = ' class="reason"' if column == "reason" else ""
    return f"<td{cls}>{_e(value)}</td>"


def _search_key(row: dict[str, Any]) -> str:
    """The ids a search term is matched against, space-separated."""
    words: list[str] = []
    for column, value in row.items():
        if value is None:
            continue
        if column == "held_by":  # "table:index table:index"
            words += [part.split(":")[0] for part in str(value).split()]
        elif column in KEY_COLUMNS or column.endswith("_request_id"):
            values = value if isinstance(value, list) else [value]
            words += [str(v) for v in values]
    return " ".join(words)


def _description(doc: str) -> str:
    """A check's explanation without its Plan: comment (which is for developers)."""
    return doc.split(" Plan:")[0]


def _finding(r: CheckResult) -> str:
    rows = r.rows.to_pylist()
    columns = r.rows.column_names
    head = "".join(f"<th>{_e(c)}</th>" for c in columns)
    body = []
    for row in rows:
        key = _search_key(row)
        cells = "".join(_value_cell(c, row[c]) for c in columns)
        body.append(f'<tr data-key="{_e(key)}">{cells}</tr>')
    more = ""
    if r.count > len(rows):
        more = (
            f'<p class="more">{r.count - len(rows):,} more row(s) not in this page: '
            f"<code>pagedkv-sql check --limit 0</code> lists them all, and "
            f"<code>SELECT * FROM {_e(r.name)}</code> in the DuckDB shell.</p>"
        )
    plural = "s" if r.count != 1 else ""
    return (
        f'<details class="finding" id="check-{_e(r.name)}" open>'
        f'<summary><span class="badge {r.severity}">{r.severity}</span>'
        f'<span class="name">{_e(r.label)}</span>'
        f'<span class="count">{r.count:,} row{plural}</span></summary>'
        f'<p class="desc">{_e(_description(r.check.description))}</p>'
        f'<div class="tablewrap"><table class="rows"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>{more}</details>"
    )


def _findings(report: CheckReport) -> str:
    found = [r for r in report.results if r.count]
    passed = [r for r in report.results if not r.count]
    parts = [_finding(r) for r in found]
    if not found:
        parts.append('<p><span class="badge ok">ok</span> every check passed.</p>')
    if passed:
        names = " ".join(f"<code>{_e(r.name)}</code>" for r in passed)
        parts.append(f'<p class="passed">Passed ({len(passed)}): {names}</p>')
    return "".join(parts)


def _cards(r: ReportInput) -> str:
    c = r.stats.counts
    errors, warnings = r.check.errors, r.check.warnings
    # the checks read one state; when the step log broke, no green says the cache is fine
    broken = r.timeline is not None and r.timeline.first_bad_step is not None
    fine = "" if broken else "good"
    items = [
        ("sequences", f"{c.get('sequences', 0):,}", ""),
        ("tokens", f"{c.get('tokens', 0):,}", ""),
        ("GPU blocks", f"{c.get('physical_gpu_blocks', 0):,}", ""),
        ("CPU blocks (swapped)", f"{c.get('physical_cpu_blocks', 0):,}", ""),
        (
            "missing blocks",
            f"{c.get('missing_blocks', 0):,}",
            "warn" if c.get("missing_blocks") else "",
        ),
        ("errors", f"{errors:,}", "bad" if errors else fine),
        ("warnings", f"{warnings:,}", "warn" if warnings else fine),
    ]
    t = r.timeline
    if t is not None:  # a stored step log: its first finding is as bad as an error
        if t.first_bad_step is not None:
            items.append(("step log: first broken step", f"{t.first_bad_step:,}", "bad"))
        else:
            items.append(("step log", "no invariant broken", "good"))
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card {cls}"><div class="v">{v}</div><div class="k">{_e(k)}</div></div>'
            for k, v, cls in items
        )
        + "</div>"
    )


def _stats_table(stats: Stats) -> str:
    rows = [(k.replace("_", " "), v) for k, v in stats.counts.items()]
    rows += [(f"physical blocks with refcount {rc}", n) for rc, n in stats.refcount_histogram]
    rows += [row for group in stats.groups for row in group.rows()]
    body = "".join(f'<tr><td>{_e(k)}</td><td class="num">{v:,}</td></tr>' for k, v in rows)
    return (
        f"<table><thead><tr><th>metric</th><th>value</th></tr></thead><tbody>{body}</tbody></table>"
    )


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    return {
        "title": {"text": title, "font": {"size": 14}, "x": 0, "xanchor": "left"},
        "margin": {"l": 70, "r": 20, "t": 40, "b": 50},
        "font": {"family": FONT, "size": 12, "color": "#1d2433"},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "showlegend": False,
        **extra,
    }


def _figures(r: ReportInput) -> dict[str, Any]:
    """The page's charts as plotly.js figures (plain dicts: plotly.graph_objects would
    cost more to import and validate than the rest of the page to write)."""
    hist = r.stats.refcount_histogram
    counts = [n for _, n in hist]
    log = bool(counts) and max(counts) > 50 * max(1, min(counts))
    refcount = {
        "data": [
            {
                "type": "bar",
                "x": [str(rc) for rc, _ in hist],
                "y": counts,
                "marker": {
                    "color": [
                        "#1f77b4" if rc == 1 else palette.COLOURS[palette.SHARED3] for rc, _ in hist
                    ]
                },
                "text": [f"{n:,}" for n in counts],
                "textposition": "outside",
                "hovertemplate": "refcount %{x}: %{y:,} physical blocks<extra></extra>",
            }
        ],
        "layout": _layout(
            "Physical GPU blocks by refcount",
            xaxis={"title": {"text": "refcount"}, "type": "category"},
            yaxis={
                "title": {"text": "physical blocks"},
                "type": "log" if log else "linear",
                "gridcolor": "#eceff3",
                "tickformat": ",d",
                "rangemode": "tozero",
                # small counts: ticks at whole numbers only (",d" would print 1, 1, 2, 2)
                **({"dtick": 1} if not log and max(counts, default=0) < 8 else {}),
            },
        ),
    }
    c = r.stats.counts
    used = [c.get("gpu_bytes", 0), c.get("cpu_bytes", 0)]
    blocks = [c.get("physical_gpu_blocks", 0), c.get("physical_cpu_blocks", 0)]
    tier = {
        "data": [
            {
                "type": "bar",
                "y": ["GPU", "CPU"],
                "x": used,
                "orientation": "h",
                "marker": {"color": ["#1f77b4", palette.COLOURS[palette.SWAPPED]]},
                "text": [
                    f"{grid.human_bytes(b)} in {n:,} block{'s' * (n != 1)}"
                    for b, n in zip(used, blocks, strict=True)
                ],
                "textposition": "auto",
                "hovertemplate": "%{y}: %{x:,} bytes<extra></extra>",
            }
        ],
        "layout": _layout(
            "Bytes in use per tier (256-byte blocks)",
            xaxis={"title": {"text": "bytes"}, "gridcolor": "#eceff3"},
            yaxis={"autorange": "reversed"},
        ),
    }
    figures = {"fig-refcount": refcount, "fig-tiers": tier}
    if r.timeline is not None:
        figures["fig-timeline"] = _timeline_figure(r.timeline)
    return figures


def _timeline_figure(t: Timeline) -> dict[str, Any]:
    colours = ["#1f77b4", palette.COLOURS[palette.SWAPPED], palette.COLOURS[palette.SHARED3]]
    traces = [
        {
            "type": "scatter",
            "x": t.steps,
            "y": values,
            "name": name,
            "mode": "lines",
            "line": {"color": colours[i % len(colours)], "width": 2},
        }
        for i, (name, values) in enumerate(t.series.items())
    ]
    layout = _layout(
        "Blocks in use per step",
        showlegend=True,
        xaxis={"title": {"text": "step"}, "gridcolor": "#eceff3"},
        yaxis={"title": {"text": "blocks, requests"}, "gridcolor": "#eceff3"},
    )
    if t.first_bad_step is not None:
        red = palette.COLOURS[palette.MISMATCH]
        layout["shapes"] = [
            {
                "type": "line",
                "x0": t.first_bad_step,
                "x1": t.first_bad_step,
                "xref": "x",
                "y0": 0,
                "y1": 1,
                "yref": "paper",
                "line": {"color": red, "width": 2, "dash": "dash"},
            }
        ]
        layout["annotations"] = [
            {
                "x": t.first_bad_step,
                "y": 1,
                "yref": "paper",
                "showarrow": False,
                "text": f"first bad step {t.first_bad_step}",
                "xanchor": "left",
                "font": {"color": red},
            }
        ]
    return {"data": traces, "layout": layout}


def _strip_legend() -> str:
    return (
        '<div class="legend">'
        + "".join(
            f'<span style="--c:{STRIP_COLOURS[k]}">{_e(data.STRIP_NAMES[k])}</span>'
            for k in ("r", "s", "c", "x", "m", ".")
        )
        + "</div>"
    )


def render(r: ReportInput) -> str:
    """The page as one string."""
    payload = {
        "sequences": [
            [s.seq_id, s.block_tables, s.tokens, s.strip, r.request_ids.get(s.seq_id, "")]
            for s in r.sequences
        ],
        "has_requests": bool(r.request_ids),
        "strip_colours": STRIP_COLOURS,
        "strip_names": data.STRIP_NAMES,
        "strip_rank": STRIP_RANK,
        "figures": _figures(r),
        "map": pagemap.payload(r.map, FONT),
    }
    timeline = ""
    if r.timeline is not None:
        bad = (
            f"First bad step: <b>{r.timeline.first_bad_step}</b> {_e(r.timeline.first_bad_reason)}"
            if r.timeline.first_bad_step is not None
            else "No step broke the cache."
        )
        timeline = (
            '<section id="timeline"><h2>Timeline</h2>'
            f'<p class="lead">{bad}</p><div id="fig-timeline" class="plot"></div></section>'
        )
    search_label = "seq_id or request id" if r.request_ids else "seq_id"
    page = string.Template(_asset("report.html"))
    return page.substitute(
        title=_e(r.title),
        source=_e(r.source),
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        css=_asset("report.css"),
        plotly=_asset(PLOTLY_JS),
        timeline_link='<a href="#timeline">Timeline</a>' if timeline else "",
        search_label=search_label,
        cards=_cards(r),
        errors=f"{r.check.errors:,}",
        warnings=f"{r.check.warnings:,}",
        findings=_findings(r.check),
        timeline=timeline,
        map=pagemap.section(r.map),
        strip_legend=_strip_legend(),
        request_head="<th>request id</th>" if r.request_ids else "",
        stats=_stats_table(r.stats),
        data=_script_json(payload),
        js=_asset("report.js"),
    )
