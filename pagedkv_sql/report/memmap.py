"""`pagedkv-sql map`: the physical memory of each tier as a grid, one cell a 256-byte block
in address order, coloured by state.

The raster is computed with numpy (one palette index a cell, then one a pixel) and drawn by
matplotlib's ``imshow``; no shape is drawn by hand. Free blocks between two used ones are
drawn to scale up to ``GAP_LIMIT``; a longer run of free addresses (another allocation
region) is collapsed into one "unmapped" cell, and the address axis shows the jump. Past
``MAX_ROWS`` rows a pixel stands for several blocks and shows the most severe of them, so
that one leaked or mismatched block among millions stays visible.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..numbers import hex_address
from . import grid, require
from .palette import COLOURS, GAP, LABELS, LEAKED, MISMATCH, OWNED

DPI = 100

# -- drawing: the picture's frame in pixels, then matplotlib ------------------------------
LEFT, RIGHT_GAP, LEGEND_W, TOP, TIER_TITLE, TIER_AXIS, SPACING, BOTTOM = (
    120,
    40,
    330,
    64,
    34,
    52,
    18,
    20,
)
EMPTY_TIER_PX = 36
# fixed fonts and SVG ids: the same map gives the same bytes
RC = {
    "font.family": "DejaVu Sans",
    "font.size": 10,
    "svg.hashsalt": "pagedkv-sql",
    "svg.fonttype": "path",
}


@dataclass(frozen=True)
class Frame:
    """Where each tier's grid sits in the picture, in pixels from the top left."""

    width: int
    height: int
    grids: dict[str, tuple[int, int, int, int]]  # tier -> (left, top, width, height)


def frame(m: grid.MemoryMap) -> Frame:
    grid_w = m.columns * m.cell_px
    top = TOP
    grids = {}
    for i, t in enumerate(m.tiers):
        h = t.rows * m.cell_px if len(t.blocks) else EMPTY_TIER_PX
        # a small map's tier is as wide as its own cells
        w = max(1, t.cells.size) * m.cell_px if m.small and len(t.blocks) else grid_w
        top += TIER_TITLE
        grids[t.blocks.tier] = (LEFT, top, w, h)
        top += h + TIER_AXIS + (SPACING if i + 1 < len(m.tiers) else 0)
    width = LEFT + grid_w + RIGHT_GAP + LEGEND_W
    entries = len(LABELS) + (m.palette.owners.size if m.palette.few else 4)
    legend_h = TOP + 40 + 22 * entries + BOTTOM
    return Frame(width, max(top + BOTTOM, legend_h), grids)


def pixel_of(m: grid.MemoryMap, tier: str, address: int) -> tuple[int, int]:
    """An (x, y) pixel of the drawn picture inside a block's cell: its centre, or on a
    large labelled cell a point near its top left corner, clear of the label."""
    t = m.tier(tier)
    pixel = t.cell_of(address) // t.per_pixel
    row, col = divmod(pixel, m.columns)
    left, top, _, _ = frame(m).grids[tier]
    inset = m.cell_px // 2 if m.cell_px < 24 else m.cell_px // 6
    return left + col * m.cell_px + inset, top + row * m.cell_px + inset


def draw(m: grid.MemoryMap) -> Any:
    """The picture as a matplotlib Figure (no pyplot: no global state, no GUI backend)."""
    mpl = require("matplotlib")
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    f = frame(m)
    with mpl.rc_context(RC):
        fig = Figure(figsize=(f.width / DPI, f.height / DPI), dpi=DPI)
        fig.text(
            LEFT / f.width,
            1 - 26 / f.height,
            m.title or "KV cache memory map",
            fontsize=15,
            weight="bold",
            va="center",
        )
        sub = f"one cell = one {grid.BLOCK_BYTES}-byte block, in address order"
        if m.tiers[0].per_pixel > 1:
            sub += f"; one pixel = {m.tiers[0].per_pixel} blocks, showing the most severe"
        sub += f"; runs of more than {grid.GAP_LIMIT} free blocks collapsed"
        fig.text(LEFT / f.width, 1 - 48 / f.height, sub, fontsize=9, color="#555555", va="center")
        for t in m.tiers:
            _draw_tier(fig, f, m, t)
        _legend(fig, f, m, Patch)
    return fig


def _axes(fig: Any, f: Frame, rect: tuple[int, int, int, int]) -> Any:
    left, top, w, h = rect
    return fig.add_axes((left / f.width, 1 - (top + h) / f.height, w / f.width, h / f.height))


def _draw_tier(fig: Any, f: Frame, m: grid.MemoryMap, t: grid.TierGrid) -> None:
    rect = f.grids[t.blocks.tier]
    ax = _axes(fig, f, rect)
    fig.text(
        rect[0] / f.width,
        1 - (rect[1] - 12) / f.height,
        grid.tier_title(t),
        fontsize=11,
        weight="bold",
        va="center",
    )
    for side in ax.spines.values():
        # a large map fills its frame: a spine would paint over its edge blocks
        side.set_color("#999999")
        side.set_visible(m.small or not len(t.blocks))
    if not len(t.blocks):
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(
            0.5,
            0.5,
            "nothing on this tier",
            ha="center",
            va="center",
            color="#777777",
            transform=ax.transAxes,
        )
        return
    image = m.palette.rgb[t.pixels]
    width = t.cells.size if m.small else m.columns
    ax.imshow(
        image[:, :width],
        interpolation="nearest",
        aspect="auto",
        extent=(0, width, t.rows, 0),
        resample=False,
    )
    ax.tick_params(labelsize=8, colors="#444444")
    _mark_anomalies(ax, m, t)
    if m.small:
        _label_cells(ax, m, t)
        return
    per_row = m.columns * t.per_pixel
    ticks = max(1, min(9, t.rows * m.cell_px // 36))
    rows = np.unique(np.linspace(0, t.rows - 1, ticks).astype(int))
    ax.set_yticks(rows + 0.5)
    first = rows * per_row
    ax.set_yticklabels(
        [hex_address(int(t.cell_address[min(c, t.cells.size - 1)])) for c in first],
        family="DejaVu Sans Mono",
    )
    cols = np.linspace(0, m.columns, 5).astype(int)
    ax.set_xticks(cols)
    ax.set_xticklabels([f"+{c * t.per_pixel:,}" for c in cols])
    ax.set_xlabel(
        f"blocks from the row's first address ({per_row:,} blocks a row)",
        fontsize=8,
        color="#444444",
    )


def _mark_anomalies(ax: Any, m: grid.MemoryMap, t: grid.TierGrid) -> None:
    """Ring the blocks that check complains about when there are few: at one pixel a block,
    one red pixel among a million is easy to miss."""
    if m.small:
        return
    marked = np.zeros(t.pixels.shape, bool)
    for state in (MISMATCH, LEAKED):
        cells = np.flatnonzero(t.cells == state)
        if not 0 < cells.size <= grid.MAX_MARKED:
            continue
        row, col = np.divmod(cells // t.per_pixel, m.columns)
        marked[row, col] = True
        ax.scatter(
            col + 0.5,
            row + 0.5,
            s=110,
            facecolors="none",
            edgecolors=COLOURS[state],
            linewidths=1.6,
            zorder=3,
            clip_on=False,
        )
        if state == LEAKED:
            ax.scatter(
                col + 0.5,
                row + 0.5,
                s=190,
                facecolors="none",
                edgecolors="white",
                linewidths=0.8,
                zorder=3,
                clip_on=False,
            )
    if marked.any():
        # the blocks themselves stay on top of the rings of their neighbours
        overlay = np.zeros((*t.pixels.shape, 4), np.uint8)
        overlay[..., :3] = m.palette.rgb[t.pixels]
        overlay[..., 3] = np.where(marked, 255, 0)
        ax.imshow(
            overlay,
            interpolation="nearest",
            aspect="auto",
            extent=(0, m.columns, t.rows, 0),
            resample=False,
            zorder=4,
        )


def _label_cells(ax: Any, m: grid.MemoryMap, t: grid.TierGrid) -> None:
    n = t.cells.size
    ax.set_yticks([])
    ax.set_xticks(np.arange(n) + 0.5)
    ax.set_xticklabels(
        [hex_address(int(a)) for a in t.cell_address], family="DejaVu Sans Mono", fontsize=7.5
    )
    for x in range(1, n):
        ax.axvline(x, color="white", linewidth=2)
    for cell in range(n):
        rgb = m.palette.rgb[t.cells[cell]]
        dark = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] < 140
        ax.text(
            cell + 0.5,
            0.5,
            grid.cell_text(t, cell, m.palette),
            ha="center",
            va="center",
            fontsize=8.5,
            color="white" if dark else "#222222",
            linespacing=1.3,
        )


def _legend(fig: Any, f: Frame, m: grid.MemoryMap, patch: Any) -> None:
    counts = grid.state_counts(m)
    handles = []
    for state, label in LABELS.items():
        if counts.get(state):
            unit = "cell" if state == GAP else "block"
            if m.tiers[0].per_pixel > 1:
                unit = "pixel"
            n = counts[state]
            handles.append(
                patch(
                    facecolor=COLOURS[state],
                    edgecolor="#999999",
                    label=f"{label}: {n:,} {unit}{'s' if n != 1 else ''}",
                )
            )
    pal = m.palette
    if pal.few:
        for i, seq in enumerate(pal.owners.tolist()):
            n = counts.get(OWNED + i, 0)
            colour = "#{:02x}{:02x}{:02x}".format(*pal.rgb[OWNED + i].tolist())
            handles.append(
                patch(
                    facecolor=colour,
                    edgecolor="#999999",
                    label=f"owned by seq {seq}: {n:,} block{'s' * (n != 1)}",
                )
            )
    left = (LEFT + m.columns * m.cell_px + RIGHT_GAP) / f.width
    legend = fig.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(left, 1 - TOP / f.height),
        frameon=False,
        fontsize=9,
        title="block state",
        title_fontsize=10,
        alignment="left",
        handlelength=1.6,
        handleheight=1.2,
    )
    legend.get_title().set_weight("bold")
    if not pal.few and pal.owners.size:
        _gradient_bar(fig, f, m, left, len(handles))


def _gradient_bar(fig: Any, f: Frame, m: grid.MemoryMap, left: float, entries: int) -> None:
    top = TOP + 60 + 24 * entries
    ax = fig.add_axes((left + 8 / f.width, 1 - (top + 14) / f.height, 240 / f.width, 14 / f.height))
    ramp = m.palette.rgb[OWNED:][None, :, :]
    ax.imshow(ramp, aspect="auto", extent=(0, 1, 0, 1), interpolation="nearest")
    ax.set_yticks([])
    owners = m.palette.owners
    ax.set_xticks([0, 1])
    ax.set_xticklabels([f"seq {owners[0]}", f"seq {owners[-1]}"], fontsize=8)
    ax.set_title(f"owned by one sequence ({owners.size:,}), by seq_id", fontsize=9, loc="left")


def render(m: grid.MemoryMap, fmt: str = "png") -> bytes:
    """The picture as PNG or SVG bytes, the same bytes for the same map (no dates, no
    version in the metadata; a fixed SVG hash salt)."""
    mpl = require("matplotlib")
    buffer = io.BytesIO()
    metadata: dict[str, Any] = (
        {"Software": None} if fmt == "png" else {"Date": None, "Creator": None}
    )
    with mpl.rc_context(RC):
        draw(m).savefig(buffer, format=fmt, dpi=DPI, metadata=metadata)
    return buffer.getvalue()
