"""Reports rendered for people: what the library hands back (dataclasses, Arrow tables)
as the lines a command prints. Pure functions of their input; pyarrow (through output.py)
is imported when one runs, never at `--help`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..check import CheckReport
    from ..load import LoadReport


def joined(lines: list[str]) -> str:
    """The lines of a report, each made safe for a terminal (``formats.printable``: an
    engine's string with an escape sequence or a newline in it is shown escaped, never
    obeyed, and cannot forge a line); every renderer here ends with it."""
    from ..formats import printable

    return "\n".join(printable(line) for line in lines)


def warning_lines(warnings: list[Any]) -> list[str]:
    """The one line a load or an import ends with when a diagnostic fired."""
    if not warnings:
        return []
    found = ", ".join(f"{w.label} {w.count}" for w in warnings)
    total = sum(w.count for w in warnings)
    return [f"warning: {total} diagnostic finding(s): {found}; see `pagedkv-sql check`"]


def load_summary(report: LoadReport, path: str) -> str:
    from ..output import text_table

    rows = []
    for r in report.relations:
        source = r.source if r.source is not None else f"(no file: {r.mode})"
        read = r.rows_read if r.source is not None else "-"
        dropped = r.duplicates_dropped if r.source is not None else "-"
        rows.append([r.relation, r.rows_total, read, dropped, r.mode, source])
    lines = text_table(["relation", "rows", "read", "duplicates", "mode", "source"], rows).split(
        "\n"
    )
    lines.append(f"loaded into {path}")
    lines += warning_lines(report.warnings)
    return joined(lines)


def import_summary(report: Any, path: str) -> str:
    """What `import` wrote: the rows of each table, the engine's only when it has some."""
    from ..output import text_table

    rows = [[t, n] for t, n in report.rows.items() if n or not t.startswith("engine_")]
    lines = text_table(["table", "rows"], rows).split("\n")
    lines.append(f"imported {report.engine} snapshot {report.source} into {path}")
    lines += warning_lines(report.warnings)
    return joined(lines)


def check_text(report: CheckReport) -> str:
    from ..output import text_table

    lines = text_table(
        ["invariant", "check", "severity", "found", "what it means"],
        [[r.invariant, r.name, r.severity, r.count, r.check.description] for r in report.results],
    ).split("\n")
    for r in report.results:
        if not r.count:
            continue
        lines.append("")
        rows_said = f"{r.count} row{'s' if r.count != 1 else ''}"
        lines.append(f"{r.label}, {r.severity}, {rows_said}:")
        rows = r.rows.to_pylist()
        table = text_table(r.rows.column_names, [list(x.values()) for x in rows])
        lines.extend("  " + t for t in table.splitlines())
        if r.count > len(rows):
            lines.append(f"  ... and {r.count - len(rows)} more (--limit 0 shows all)")
    lines.append("")
    lines.append(f"{report.errors} error(s), {report.warnings} warning(s)")
    return joined(lines)


def explain_text(e: Any, kv: list[Any], layer: int | None, head: int) -> str:
    from ..output import hex_or_int as hexed

    lines = [f"token seq_id {e.seq_id}, token_pos {e.token_pos}"]
    if e.request_id is not None:
        lines.append(f"  engine request     {e.request_id}")
    for block, offset in e.decompositions:
        lines.append(f"  virtual_token      block_index {block}, offset_in_block {offset}")
    for ptr in e.roots:
        lines.append(f"  root_table         seq_id {e.seq_id} -> block table {ptr}")
    for h in e.hops:
        key = f"({h.block_table_ptr}, {h.block_index})"
        if h.resident:
            for base, refcount in h.resident:
                lines.append(f"  block_table_entry  {key}: base {hexed(base)}, refcount {refcount}")
        else:
            lines.append(f"  block_table_entry  {key}: none")
        if h.swapped:
            for cpu in h.swapped:
                lines.append(f"  swapped_block      {key}: cpu_base_address {hexed(cpu)}")
        else:
            lines.append(f"  swapped_block      {key}: none")
    for r in e.resolutions:
        lines.append(
            f"  => {r.tier} tier: {r.base} + {r.offset_in_block} = {hexed(r.physical_address)}"
        )
    if e.broken:
        lines.append(f"  => unresolved: {e.broken}")
    for a in kv:
        where = f"{a.tensor} block {a.block_id} slot {a.slot}"
        bounds = "" if a.in_bounds else " (outside the tensor's shape)"
        lines.append(f"  {a.kv}  layer {layer} head {head}: {where} -> {a.address:#x}{bounds}")
    if layer is not None and not kv:
        lines.append(f"  no K/V address: no recorded tensor holds layer {layer} for this token")
    return joined(lines)


def kv_events_text(report: Any) -> str:
    """`kv-events`: the counts, the findings kept (--limit), the total; engine-supplied
    strings with their control characters escaped."""
    c = report.counts
    head = f"{report.events} event(s): {c['stored']} stored, {c['removed']} removed, "
    head += f"{c['cleared']} cleared" + "".join(
        f", {c[k]} {k}" for k in ("updated", "created") if c[k]
    )
    lines = [head] + [f"{f.where}: {f.check}: {f.message}" for f in report.findings]
    if report.total > len(report.findings):
        lines.append(f"... and {report.total - len(report.findings)} more (--limit 0: all)")
    lines.append(f"{report.total} finding(s)")
    return joined(lines)


def stats_rows(s: Any) -> list[list[Any]]:
    """`stats` as rows of (metric, value): the counts, then the refcount histogram, then
    each KV-cache group of an engine import."""
    rows = [[k.replace("_", " "), v] for k, v in s.counts.items()]
    rows += [[f"physical blocks with refcount {r}", n] for r, n in s.refcount_histogram]
    rows += [[label, value] for pool in s.pools for label, value in pool.rows()]
    # the KV-cache groups when there are several or one that is not full attention (a lone
    # full-attention group says nothing the figures above do not; -f json lists it)
    if len(s.groups) > 1 or any(g.kind != "full_attention" for g in s.groups):
        rows += [[label, value] for group in s.groups for label, value in group.rows()]
    return rows
