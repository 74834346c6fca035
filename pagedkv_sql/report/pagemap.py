"""The memory map of the HTML page: the raster of `grid.layout` (one palette index a
pixel, the same grid `map` draws with matplotlib) as a plotly heatmap per tier, with hover.

The page gets the raster, not a picture: per pixel its palette index and the owner of the
block it shows (an index into the sorted owners), each a little-endian integer array,
deflated (zlib level 1) and base64-encoded (0.36 MB for 660,000 pixels at 10M tokens); the
page inflates them with the browser's DecompressionStream and hands them to plotly.js. The
addresses are sent as the few points where the grid's address stops growing by one block a
cell (the first cell, the cell after each collapsed gap, unaligned CPU copies): the page
computes a pixel's address from them with BigInt, exactly. Nothing here imports matplotlib.
"""

from __future__ import annotations

import base64
import html
import zlib
from typing import Any

import numpy as np

from ..numbers import hex_address
from .grid import (
    BLOCK_BYTES,
    GAP_LIMIT,
    MAX_MARKED,
    MemoryMap,
    TierGrid,
    cell_text,
    state_counts,
    tier_title,
)
from .palette import COLOURS, FEW_COLOURS, GAP, LABELS, LEAKED, MISMATCH, OWNED

SMALL_CELL_PX = 110  # a small map's labelled cells; a large one's are the layout's (cell_px)
MIN_PLOT_PX = 40


def _packed(values: np.ndarray, dtype: str) -> str:
    """An integer array as base64 of its deflated little-endian bytes."""
    return base64.b64encode(zlib.compress(values.astype(dtype).tobytes(), 1)).decode("ascii")


def _segments(t: TierGrid) -> tuple[list[int], list[str]]:
    """The cells where the address is not the cell before's plus one block, and their
    addresses (as strings: 64-bit integers are not JSON numbers)."""
    a = t.cell_address
    if a.size == 0:
        return [], []
    breaks = np.concatenate([[0], np.flatnonzero(np.diff(a) != BLOCK_BYTES) + 1])
    return breaks.tolist(), [str(v) for v in a[breaks].tolist()]


def _pixel_owners(m: MemoryMap, t: TierGrid) -> tuple[np.ndarray, str]:
    """For each pixel, 1 + the index in m.palette.owners of the owner of the block it shows
    (0: no block, or no sequence owns it), and the array's type."""
    cell_block = np.full(t.cells.size, -1, np.int64)
    n = len(t.blocks)
    cell_block[t.block_cell[::-1]] = np.arange(n - 1, -1, -1)  # the first block of a cell
    cell = t.pixel_cell
    block = np.where(cell >= 0, cell_block[np.maximum(cell, 0)], -1) if n else cell
    seq = np.where(block >= 0, t.blocks.seq_id[np.maximum(block, 0)], -1) if n else block
    owners = m.palette.owners
    index = np.where(seq >= 0, np.searchsorted(owners, seq) + 1, 0)
    return index, "<u2" if owners.size < 65535 else "<u4"


def _rings(m: MemoryMap, t: TierGrid) -> list[dict[str, Any]]:
    """Open circles around the mismatched and leaked pixels of a large map, when there are
    few (as `map` rings them): one pixel among a million is easy to miss."""
    if m.small:
        return []
    traces = []
    for state, name in ((MISMATCH, LABELS[MISMATCH]), (LEAKED, LABELS[LEAKED])):
        cells = np.flatnonzero(t.cells == state)
        if not 0 < cells.size <= MAX_MARKED:
            continue
        row, col = np.divmod(np.unique(cells // t.per_pixel), m.columns)
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": col.tolist(),
                "y": row.tolist(),
                "name": name,
                "hoverinfo": "skip",
                "marker": {
                    "symbol": "circle-open",
                    "size": 14,
                    "color": COLOURS[state],
                    "line": {"width": 2, "color": COLOURS[state]},
                },
            }
        )
    return traces


def _tier(m: MemoryMap, t: TierGrid, font: str) -> dict[str, Any]:
    """One tier: the plotly figure without its z (the page inflates it) and what the
    page's hover needs."""
    name = t.blocks.tier
    axis = {"showgrid": False, "zeroline": False, "ticks": "outside", "fixedrange": False}
    layout: dict[str, Any] = {
        "font": {"family": font, "size": 11, "color": "#1d2433"},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "showlegend": False,
        "dragmode": "zoom",
    }
    empty = not len(t.blocks)
    if empty:
        layout |= {
            "height": 60,
            "margin": {"l": 20, "r": 20, "t": 10, "b": 10},
            "xaxis": {"visible": False},
            "yaxis": {"visible": False},
            "annotations": [
                {
                    "text": "nothing on this tier",
                    "showarrow": False,
                    "xref": "paper",
                    "yref": "paper",
                    "x": 0.5,
                    "y": 0.5,
                    "font": {"color": "#777777"},
                }
            ],
        }
        return {"tier": name, "empty": True, "figure": {"data": [], "layout": layout}}
    width = t.cells.size if m.small else m.columns
    if m.small:
        xaxis = axis | {
            "tickvals": list(range(width)),
            "ticktext": [hex_address(int(a)) for a in t.cell_address],
            "tickfont": {"family": "DejaVu Sans Mono, monospace", "size": 10},
        }
        yaxis = {"visible": False, "autorange": "reversed"}
        layout |= {
            "width": 90 + width * SMALL_CELL_PX,
            "height": 20 + 40 + SMALL_CELL_PX,
            "margin": {"l": 40, "r": 50, "t": 20, "b": 40},
        }
    else:
        per_row = m.columns * t.per_pixel
        ticks = max(1, min(9, t.rows // 36))
        rows = np.unique(np.linspace(0, t.rows - 1, ticks).astype(int))
        first = np.minimum(rows * per_row, t.cells.size - 1)
        cols = np.linspace(0, m.columns, 5).astype(int)
        xaxis = axis | {
            "tickvals": (cols - 0.5).tolist(),
            "ticktext": [f"+{c * t.per_pixel:,}" for c in cols],
            "title": {
                "text": f"blocks from the row's first address ({per_row:,} blocks a row)",
                "font": {"size": 11},
            },
        }
        yaxis = axis | {
            "autorange": "reversed",
            "tickvals": rows.tolist(),
            "ticktext": [hex_address(int(a)) for a in t.cell_address[first]],
            "tickfont": {"family": "DejaVu Sans Mono, monospace", "size": 10},
        }
        layout |= {
            "height": 90 + max(MIN_PLOT_PX, t.rows * m.cell_px),
            "margin": {"l": 100, "r": 20, "t": 20, "b": 70},
        }
    # fixed ranges: the rings' markers would pad an automatic one
    xaxis["range"] = [-0.5, width - 0.5]
    yaxis |= {"range": [t.rows - 0.5, -0.5], "autorange": False}
    layout |= {"xaxis": xaxis, "yaxis": yaxis}
    pal = m.palette
    top = max(1, pal.rgb.shape[0] - 1)
    colours = ["#{:02x}{:02x}{:02x}".format(*c) for c in pal.rgb.tolist()]
    colourscale = [[i / top, c] for i, c in enumerate(colours)]
    heatmap: dict[str, Any] = {
        "type": "heatmap",
        "colorscale": colourscale,
        "zmin": 0,
        "zmax": top,
        "zsmooth": False,
        "showscale": False,
        "hoverinfo": "none",
        "xgap": 2 if m.small else 0,
    }
    if m.small:
        text = [cell_text(t, c, pal).replace("\n", "<br>") for c in range(width)]
        heatmap |= {"text": [text], "texttemplate": "%{text}", "textfont": {"size": 11}}
    owner, owner_type = _pixel_owners(m, t)
    cells, addresses = _segments(t)
    gaps = np.flatnonzero(t.cells == GAP)
    return {
        "tier": name,
        "empty": False,
        "figure": {"data": [heatmap, *_rings(m, t)], "layout": layout},
        "rows": t.rows,
        "width": width,
        "cells": int(t.cells.size),
        "per_pixel": t.per_pixel,
        "z": _packed(t.pixels[:, :width], "<u2"),
        "owner": _packed(owner.reshape(t.rows, m.columns)[:, :width], owner_type),
        "owner_type": owner_type[1:],
        "segment_cells": cells,
        "segment_addresses": addresses,
        "gap_cells": gaps.tolist(),
        "gap_blocks": t.gap_blocks.tolist(),
    }


def payload(m: MemoryMap, font: str) -> dict[str, Any]:
    """What the page's script needs to draw and explain the map."""
    pal = m.palette
    states = {i: label for i, label in LABELS.items()}
    return {
        "tiers": [_tier(m, t, font) for t in m.tiers],
        "columns": m.columns,
        "owners": [str(o) for o in pal.owners.tolist()],
        "owned": OWNED,
        "states": {str(k): v for k, v in states.items()},
        "gap_limit": GAP_LIMIT,
    }


def section(m: MemoryMap) -> str:
    """The map's part of the page: its legend, and a title and a plot a tier."""
    parts = [legend(m)]
    if m.tiers[0].per_pixel > 1:
        parts.append(
            f'<p class="more">One pixel = {m.tiers[0].per_pixel:,} blocks, showing the most '
            "severe of them.</p>"
        )
    for t in m.tiers:
        name = t.blocks.tier
        parts.append(
            f'<h3 id="map-{name}-title">{html.escape(tier_title(t))}</h3>'
            f'<div id="map-{name}" class="plot mapplot"></div>'
        )
    return "".join(parts)


def legend(m: MemoryMap) -> str:
    """The map's legend as HTML: each state present with its count, the owners' colours."""
    counts = state_counts(m)
    unit = "pixel" if m.tiers[0].per_pixel > 1 else "block"
    items = []
    for state, label in LABELS.items():
        n = counts.get(state, 0)
        if n:
            u = "cell" if state == GAP and unit == "block" else unit
            items.append((COLOURS[state], f"{label}: {n:,} {u}{'s' if n != 1 else ''}"))
    pal = m.palette
    bar = ""
    if pal.few:
        for i, seq in enumerate(pal.owners.tolist()):
            n = counts.get(OWNED + i, 0)
            items.append((FEW_COLOURS[i], f"owned by seq {seq}: {n:,} block{'s' * (n != 1)}"))
    elif pal.owners.size:
        ramp = pal.rgb[OWNED + np.linspace(0, pal.rgb.shape[0] - OWNED - 1, 9).astype(int)]
        stops = ", ".join("#{:02x}{:02x}{:02x}".format(*c) for c in ramp.tolist())
        bar = (
            '<span class="ramp"><span class="bar" '
            f'style="background:linear-gradient(90deg, {stops})"></span>'
            f"owned by one sequence ({pal.owners.size:,}), by seq_id: "
            f"seq {pal.owners[0]} &hellip; seq {pal.owners[-1]}</span>"
        )
    spans = "".join(f'<span style="--c:{c}">{html.escape(t)}</span>' for c, t in items)
    return f'<div class="legend">{spans}{bar}</div>'
