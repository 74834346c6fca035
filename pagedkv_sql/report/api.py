"""The two entry points, `map` and `report`, over an open Database (reached through
``Database.cursor()``, never its connection)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from .. import findings
from ..errors import PagedKVError, UsageError
from ..numbers import megabytes
from . import data, grid, html, memmap, require

if TYPE_CHECKING:
    from ..database import Database

MAP_FORMATS = ("png", "svg")


@dataclass(frozen=True)
class Written:
    path: Path
    bytes: int
    summary: str


def memory_map(db: Database, title: str | None = None) -> grid.MemoryMap:
    """Both tiers of the database laid out as a grid of blocks, ready to draw."""
    with db.cursor("reading the memory map") as cur:
        return _memory_map(cur, db.path, title)


def _memory_map(
    con: duckdb.DuckDBPyConnection, path: str, title: str | None = None
) -> grid.MemoryMap:
    gpu, cpu = data.tier_blocks(con)
    return grid.layout(gpu, cpu, title or _map_title(path))


def _map_title(path: str) -> str:
    return f"KV cache memory map: {Path(path).name}"


def map_format(path: Path | None, fmt: str | None) -> str:
    """The picture's format: the one given, else ``path``'s extension, else PNG."""
    chosen = (fmt or (path.suffix.lstrip(".") if path is not None else "") or "png").lower()
    if chosen not in MAP_FORMATS:
        raise UsageError(
            f"cannot draw a map as '{chosen}'",
            hint="give --output a .png or .svg file, or --format png|svg",
        )
    return chosen


@dataclass(frozen=True)
class Drawn:
    content: bytes
    summary: str


def draw_map(db: Database, fmt: str = "png") -> Drawn:
    """The memory map as PNG or SVG bytes."""
    chosen = map_format(None, fmt)
    require("matplotlib")
    m = memory_map(db)
    gpu, cpu = (len(t.blocks) for t in m.tiers)
    summary = f"GPU {gpu:,} block(s), CPU {cpu:,} block(s)"
    return Drawn(memmap.render(m, chosen), summary)


def save_map(db: Database, path: Path, fmt: str | None = None) -> Written:
    """Draw the memory map to ``path`` as PNG or SVG (by default, from its extension)."""
    drawn = draw_map(db, map_format(path, fmt))
    _write(path, drawn.content)
    return Written(path, len(drawn.content), drawn.summary)


def _sequences(
    con: duckdb.DuckDBPyConnection,
    resident: data.Slots | None,
    timeline: html.Timeline | None,
) -> tuple[list[data.Sequence], dict[int, str], html.Timeline | None]:
    sequences = data.sequences(con, resident)
    requests = data.request_ids(con)
    return sequences, requests, timeline if timeline is not None else _stored_timeline(con)


def build_report(
    db: Database,
    *,
    limit: int | None = html.DEFAULT_ROWS,
    timeline: html.Timeline | None = None,
    title: str | None = None,
) -> str:
    """The HTML report of the database, as one self-contained page. Its parts are
    independent: check, stats and the strips run in threads of their own (DuckDB releases
    the GIL; each runs on a cursor of its own) while this one lays out the map; the strips
    take the map's GPU slots (with their bases' states) rather than read them again. The
    map is drawn by plotly.js in the page (shipped in the package's assets): no matplotlib,
    no plotly package."""
    with ExitStack() as stack:
        cursors = [stack.enter_context(db.cursor("report")) for _ in range(2)]
        with ThreadPoolExecutor(3) as pool:
            check = pool.submit(db.check, limit=limit)
            stats = pool.submit(db.stats)
            gpu, cpu, resident = data.tiers_and_slots(cursors[1])
            strips = pool.submit(_sequences, cursors[0], resident, timeline)
            laid = grid.layout(gpu, cpu, _map_title(db.path))
            sequences, requests, found_timeline = strips.result()
            report = html.ReportInput(
                title=title or f"KV cache report: {Path(db.path).name}",
                source=db.path,
                stats=stats.result(),
                check=check.result(),
                map=laid,
                sequences=sequences,
                request_ids=requests,
                timeline=found_timeline,
            )
    return html.render(report)


def stored_timeline(db: Database) -> html.Timeline | None:
    """The timeline of the step log stored in the database by `replay`, if there is one,
    with the first step that broke an invariant."""
    with db.cursor("reading the stored log") as cur:
        return _stored_timeline(cur)


def _stored_timeline(con: duckdb.DuckDBPyConnection) -> html.Timeline | None:
    series = data.timeline(con)
    if series is None:
        return None
    from ..replay.engine import check

    first = check(con).first
    return html.Timeline(
        steps=series.steps.tolist(),
        series={k: v.tolist() for k, v in series.series.items()},
        first_bad_step=first.step if first else None,
        first_bad_reason=findings.line(first).removeprefix(f"step {first.step}: ") if first else "",
    )


def log_timeline(log: Path) -> html.Timeline | None:
    """The timeline of a step log file, replayed in a scratch in-memory database."""
    from ..database import Database
    from ..replay import run

    with Database(":memory:") as scratch:
        run(scratch, log)
        return stored_timeline(scratch)


def save_report(
    db: Database,
    path: Path,
    *,
    limit: int | None = html.DEFAULT_ROWS,
    timeline: html.Timeline | None = None,
) -> Written:
    """Write the HTML report to ``path``."""
    page = build_report(db, limit=limit, timeline=timeline).encode("utf-8")
    _write(path, page)
    return Written(path, len(page), megabytes(len(page)))


def _write(path: Path, content: bytes) -> None:
    try:
        path.write_bytes(content)
    except OSError as e:
        raise PagedKVError(f"cannot write {path}: {e.strerror}") from None
