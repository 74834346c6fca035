"""Pictures and pages for people (pagedkv_sql/report, the report extra): `map` draws the
physical memory, `report` writes one self-contained HTML page."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from .. import paths
from . import common
from .common import DbOption, guard


class MapFormat(str, Enum):
    png = "png"
    svg = "svg"


def register(app: typer.Typer) -> None:
    app.command("map")(map_)
    app.command()(report)


def map_(
    db: str | None = DbOption,
    out: str = common.output_option(
        "The picture to write ('-': stdout); its extension picks the format when "
        "--format is not given.",
        "map.png",
    ),
    fmt: MapFormat | None = common.format_option(
        "Picture format (default: from the --output extension, else png)."
    ),
) -> None:
    """Draw the physical memory of each tier: one cell a block in address order, coloured by
    owner and state (shared, swapped, leaked, refcount mismatch, free). Needs
    pagedkv-sql[report]."""
    with guard(), common.open_read_only(db) as database:
        from ..compression import strip
        from ..report import api

        path = None if out == "-" else Path(out)
        with common.progress(database, "map", out):
            # map.svg.gz: an SVG, compressed as it is written
            shape = None if path is None else Path(strip(path)[0])
            drawn = api.draw_map(database, api.map_format(shape, fmt.value if fmt else None))
        with common.open_output(out, database.path) as stream:
            stream.write(drawn.content)
    if path is not None:
        common.err(f"wrote {out}: {drawn.summary}")


def report(
    db: str | None = DbOption,
    out: str = common.output_option("The page to write ('-': stdout).", "report.html"),
    limit: int = common.limit_option(1000, "Offending rows written per check (0: all)."),
    log: Path | None = typer.Option(
        None,
        "--log",
        metavar="LOG",
        help="A step log for the timeline (default: the one `replay` stored, if any).",
        show_default=False,
    ),
) -> None:
    """Write one self-contained HTML page (no network needed): stats, every finding of check
    with its rows, the memory map, each sequence's block table, refcounts and bytes per tier,
    and the blocks in use per step of a step log; searchable by seq_id or request id."""
    with guard(), common.open_read_only(db) as database:
        from ..report import api

        if log is not None and out != "-":
            paths.protect_output(out, None, [log])
        with common.progress(database, "report", out):
            timeline = api.log_timeline(log) if log is not None else None
            page = api.build_report(database, limit=limit or None, timeline=timeline)
        content = page.encode("utf-8")
        with common.open_output(out, database.path) as stream:
            stream.write(content)
    if out != "-":
        from ..numbers import megabytes

        common.err(f"wrote {out}: {megabytes(len(content))}")
