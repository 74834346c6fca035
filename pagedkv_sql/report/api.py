"""The two entry points, `map` and `report`, over an open Database."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from ..check import CheckReport
from ..errors import PagedKVError, UsageError
from ..inspect import Stats
from . import data, html, memmap, require

if TYPE_CHECKING:
    from ..database import Database

MAP_FORMATS = ("png", "svg")


@dataclass(frozen=True)
class Written:
    path: Path
    bytes: int
    summary: str


def memory_map(db: Database, title: str | None = None) -> memmap.MemoryMap:
    """Both tiers of the database laid out as a grid of blocks, ready to draw."""
    return _memory_map(db.con, db.path, title)


def _memory_map(
    con: duckdb.DuckDBPyConnection, path: str, title: str | None = None
) -> memmap.MemoryMap:
    gpu, cpu = data.tier_blocks(con)
    return memmap.layout(gpu, cpu, title or f"KV cache memory map: {Path(path).name}")


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


@dataclass(frozen=True)
class _Facts:
    check: CheckReport
    stats: Stats
    sequences: list[data.Sequence]
    request_ids: dict[int, str]
    timeline: html.Timeline | None


def _facts(db: Database, limit: int | None, timeline: html.Timeline | None) -> _Facts:
    return _Facts(
        db.check(limit=limit),
        db.stats(),
        data.sequences(db.con),
        data.request_ids(db.con),
        timeline if timeline is not None else stored_timeline(db),
    )


def build_report(
    db: Database,
    *,
    limit: int | None = html.DEFAULT_ROWS,
    timeline: html.Timeline | None = None,
    title: str | None = None,
) -> str:
    """The HTML report of the database, as one self-contained page. The queries run in a
    second thread (DuckDB releases the GIL) while this one draws the map on a cursor of its
    own: the drawing is single-threaded Python, the queries mostly not."""
    require("matplotlib")
    require("plotly")
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_facts, db, limit, timeline)
        cursor = db.con.cursor()
        try:
            png = memmap.render(_memory_map(cursor, db.path), "png")
        finally:
            cursor.close()
        facts = pending.result()
    report = html.ReportInput(
        title=title or f"KV cache report: {Path(db.path).name}",
        source=db.path,
        stats=facts.stats,
        check=facts.check,
        map_png=png,
        sequences=facts.sequences,
        request_ids=facts.request_ids,
        timeline=facts.timeline,
    )
    return html.render(report)


def stored_timeline(db: Database) -> html.Timeline | None:
    """The timeline of the step log stored in the database by `replay`, if there is one,
    with the first step that broke an invariant."""
    series = data.timeline(db.con)
    if series is None:
        return None
    from ..replay.engine import check

    first = check(db.con).first
    return html.Timeline(
        steps=series.steps.tolist(),
        series={k: v.tolist() for k, v in series.series.items()},
        first_bad_step=first.step if first else None,
        first_bad_reason=f"{first.invariant}: {first.message}" if first else "",
    )


def log_timeline(log: Path) -> html.Timeline | None:
    """The timeline of a step log file, replayed in a scratch in-memory database."""
    from ..database import Database

    with Database(":memory:") as scratch:
        scratch.replay(log)
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
    return Written(path, len(page), f"{len(page) / 2**20:.1f} MB")


def _write(path: Path, content: bytes) -> None:
    try:
        path.write_bytes(content)
    except OSError as e:
        raise PagedKVError(f"cannot write {path}: {e.strerror}") from None
