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
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import require
from .data import TierBlocks

BLOCK_BYTES = 256
GAP_LIMIT = 256  # free blocks drawn to scale between two used blocks
MAX_COLUMNS = 1024
MAX_ROWS = 768  # rows of pixels a tier gets before blocks are aggregated
MAX_MARKED = 200  # anomalous blocks ringed on a large map, when there are no more
SMALL = 32  # up to this many cells a tier is one row of labelled cells
AXES_PX = 1024  # width of a large map's grid in pixels
DPI = 100

# palette indexes; PRIORITY says which wins when a pixel aggregates several blocks
BEYOND, GAP, FREE, SWAPPED, LEAKED, MISMATCH, SHARED2, SHARED3, SHARED4, OWNED = range(10)
COLOURS = {
    BEYOND: "#ffffff",
    GAP: "#cfcfcf",
    FREE: "#eeeeee",
    SWAPPED: "#f0a30a",
    LEAKED: "#111111",
    MISMATCH: "#d62728",
    SHARED2: "#b7a9e0",
    SHARED3: "#8a6fcf",
    SHARED4: "#5b2a9e",
}
LABELS = {
    MISMATCH: "refcount mismatch",
    LEAKED: "leaked (no sequence holds it)",
    SHARED2: "shared, refcount 2",
    SHARED3: "shared, refcount 3",
    SHARED4: "shared, refcount 4+",
    SWAPPED: "swapped-out copy (CPU)",
    FREE: "free",
    GAP: "unmapped gap (collapsed)",
}
_RANK = {BEYOND: 0, GAP: 1, FREE: 2, SWAPPED: 4, LEAKED: 6, MISMATCH: 7}
_RANK |= {SHARED2: 5, SHARED3: 5, SHARED4: 5}
OWNED_RANK = 3
# a colour per sequence while there are few owners; a gradient by seq_id beyond that
FEW_COLOURS = (
    "#1f77b4",
    "#2ca02c",
    "#17becf",
    "#8c564b",
    "#bcbd22",
    "#aec7e8",
    "#98df8a",
    "#9edae5",
    "#c49c94",
    "#dbdb8d",
)
GRADIENT_STEPS = 256
# ColorBrewer's YlGnBu (matplotlib's "YlGnBu" is these nine colours, linearly interpolated),
# from 25% to 85% of the way: computed here, so that the report needs no matplotlib
YLGNBU = [
    "#ffffd9",
    "#edf8b1",
    "#c7e9b4",
    "#7fcdbb",
    "#41b6c4",
    "#1d91c0",
    "#225ea8",
    "#253494",
    "#081d58",
]
GRADIENT = (0.25, 0.85)


def _rgb(colour: str) -> tuple[int, int, int]:
    h = colour.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


@dataclass(frozen=True)
class Palette:
    owners: np.ndarray  # distinct owning seq_ids, sorted
    rgb: np.ndarray  # (n, 3) uint8: one colour a palette index
    priority: np.ndarray  # (n,) int: which index wins in an aggregated pixel

    @property
    def few(self) -> bool:
        return self.owners.size <= len(FEW_COLOURS)

    def owned(self, seq_id: np.ndarray) -> np.ndarray:
        rank = np.searchsorted(self.owners, seq_id)
        if self.few:
            return OWNED + rank
        return OWNED + (rank * (GRADIENT_STEPS - 1)) // max(1, self.owners.size - 1)


def palette(owners: np.ndarray) -> Palette:
    colours = [COLOURS[i] for i in range(OWNED)]
    if owners.size <= len(FEW_COLOURS):
        rgb = [_rgb(c) for c in colours + list(FEW_COLOURS[: owners.size])]
    else:
        rgb = [_rgb(c) for c in colours] + [tuple(c) for c in _gradient().tolist()]
    priority = [_RANK[i] for i in range(OWNED)] + [OWNED_RANK] * (len(rgb) - OWNED)
    return Palette(owners, np.array(rgb, np.uint8), np.array(priority, np.int64))


def _gradient() -> np.ndarray:
    """GRADIENT_STEPS colours of YLGNBU as matplotlib draws them: a 256-entry lookup table
    interpolated between the anchors, sampled from GRADIENT[0] to GRADIENT[1]."""
    anchors = np.array([_rgb(c) for c in YLGNBU], np.float64) / 255
    at, anchor_at = np.linspace(0, 1, 256), np.linspace(0, 1, len(YLGNBU))
    lut = np.stack([np.interp(at, anchor_at, anchors[:, k]) for k in range(3)], axis=1)
    picked = np.minimum((np.linspace(*GRADIENT, GRADIENT_STEPS) * 256).astype(np.int64), 255)
    return np.round(lut[picked] * 255).astype(np.int64)


def block_states(blocks: TierBlocks, pal: Palette) -> np.ndarray:
    """The palette index of each block of a tier."""
    if blocks.tier == "cpu":
        state = np.full(len(blocks), SWAPPED, np.int64)
    else:
        shared = SHARED2 + np.clip(blocks.refcount, 2, 4) - 2
        state = np.where(blocks.holders > 1, shared, pal.owned(blocks.seq_id))
    state = np.where(blocks.orphan, LEAKED, state)
    return np.where(blocks.mismatch, MISMATCH, state)


@dataclass(frozen=True)
class TierGrid:
    """One tier laid out as cells (blocks, free blocks, collapsed gaps) and pixels."""

    blocks: TierBlocks
    cells: np.ndarray  # palette index a cell
    cell_address: np.ndarray  # the address each cell starts at
    block_cell: np.ndarray  # the cell of each block
    gap_blocks: np.ndarray  # for each collapsed-gap cell: how many free blocks it stands for
    columns: int
    per_pixel: int  # blocks (cells) a pixel stands for
    pixels: np.ndarray = field(repr=False)  # (rows, columns) palette indexes
    pixel_cell: np.ndarray = field(repr=False)  # (rows * columns,) the cell each pixel shows, -1

    @property
    def rows(self) -> int:
        return int(self.pixels.shape[0])

    def cell_of(self, address: int) -> int:
        i = int(np.searchsorted(self.blocks.address, address))
        if i >= len(self.blocks) or int(self.blocks.address[i]) != address:
            raise KeyError(f"no {self.blocks.tier} block at {address:#x}")
        return int(self.block_cell[i])


Cells = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _cells(blocks: TierBlocks, states: np.ndarray, pal: Palette) -> Cells:
    """Cells in address order: blocks, the free blocks between them, collapsed gaps."""
    if len(blocks) == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, empty
    slot = blocks.address >> 8  # unaligned CPU addresses share the slot they start in
    uslot, block_slot = np.unique(slot, return_inverse=True)
    # one slot, several blocks: the most severe wins
    key = np.zeros(uslot.size, np.int64)
    np.maximum.at(key, block_slot, pal.priority[states] * 65536 + states)
    slot_state = key % 65536
    free = uslot[1:] - uslot[:-1] - 1
    collapsed = free > GAP_LIMIT
    gap_cells = np.where(collapsed, 1, free)
    slot_cell = np.arange(uslot.size) + np.concatenate([[0], np.cumsum(gap_cells)])
    cells = np.full(int(slot_cell[-1]) + 1, FREE, np.int64)
    cells[slot_cell] = slot_state
    gap_at = slot_cell[:-1][collapsed] + 1
    cells[gap_at] = GAP
    # the address each cell starts at: the slot before it plus 256 bytes a cell
    owner = np.searchsorted(slot_cell, np.arange(cells.size), side="right") - 1
    cell_address = (uslot[owner] + np.arange(cells.size) - slot_cell[owner]) * BLOCK_BYTES
    first_block = np.unique(block_slot, return_index=True)[1]
    cell_address[slot_cell] = blocks.address[first_block]
    return cells, cell_address, slot_cell[block_slot], free[collapsed]


def _columns(cells: int) -> int:
    if cells <= SMALL:
        return max(cells, 1)
    return int(min(MAX_COLUMNS, max(SMALL, 2 ** math.ceil(math.log2(math.sqrt(cells * 2))))))


def _pixels(
    cells: np.ndarray, columns: int, per_pixel: int, pal: Palette
) -> tuple[np.ndarray, np.ndarray]:
    """The (rows, columns) raster of palette indexes, and the cell each pixel shows (the
    most severe of its cells; -1 past the last cell)."""
    n = -(-cells.size // per_pixel) * per_pixel if cells.size else per_pixel
    padded = np.full(n, BEYOND, np.int64)
    padded[: cells.size] = cells
    groups = padded.reshape(-1, per_pixel)
    shown = np.arange(0, n, per_pixel)
    if per_pixel > 1:
        pick = np.argmax(pal.priority[groups], axis=1)
        groups = groups[np.arange(groups.shape[0]), pick][:, None]
        shown += pick
    flat = groups[:, 0]
    rows = -(-flat.size // columns)
    out = np.full(rows * columns, BEYOND, np.int64)
    out[: flat.size] = flat
    cell = np.full(rows * columns, -1, np.int64)
    cell[: flat.size] = np.where(shown < cells.size, shown, -1)
    return out.reshape(rows, columns), cell


@dataclass(frozen=True)
class MemoryMap:
    """Both tiers laid out on one grid width, ready to draw."""

    tiers: tuple[TierGrid, TierGrid]
    palette: Palette
    columns: int
    cell_px: int
    title: str

    @property
    def small(self) -> bool:
        return all(t.cells.size <= SMALL for t in self.tiers)

    def tier(self, name: str) -> TierGrid:
        return next(t for t in self.tiers if t.blocks.tier == name)


def layout(gpu: TierBlocks, cpu: TierBlocks, title: str = "") -> MemoryMap:
    owners = np.unique(np.concatenate([gpu.seq_id, cpu.seq_id]))
    pal = palette(owners[owners >= 0] if owners.size else owners)
    laid = [(b, _cells(b, block_states(b, pal), pal)) for b in (gpu, cpu)]
    most = max(cells[0].size for _, cells in laid)
    columns = _columns(most)
    per_pixel = max(1, -(-most // (columns * MAX_ROWS)))
    grids = [
        TierGrid(b, *cells, columns, per_pixel, *_pixels(cells[0], columns, per_pixel, pal))
        for b, cells in laid
    ]
    small = most <= SMALL
    cell_px = min(110, AXES_PX // columns) if small else max(1, AXES_PX // columns)
    return MemoryMap((grids[0], grids[1]), pal, columns, cell_px, title)


# -- drawing -------------------------------------------------------------------------------
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


def frame(m: MemoryMap) -> Frame:
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


def pixel_of(m: MemoryMap, tier: str, address: int) -> tuple[int, int]:
    """An (x, y) pixel of the drawn picture inside a block's cell: its centre, or on a
    large labelled cell a point near its top left corner, clear of the label."""
    t = m.tier(tier)
    pixel = t.cell_of(address) // t.per_pixel
    row, col = divmod(pixel, m.columns)
    left, top, _, _ = frame(m).grids[tier]
    inset = m.cell_px // 2 if m.cell_px < 24 else m.cell_px // 6
    return left + col * m.cell_px + inset, top + row * m.cell_px + inset


def hex_address(v: int) -> str:
    return f"-0x{-v:x}" if v < 0 else f"0x{v:x}"


def human_bytes(n: int) -> str:
    """Bytes for people, three significant digits: 256 MiB, 1.5 KiB, 7.68 GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(value) < 1000 or unit == "EiB":
            return f"{n} B" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def tier_title(t: TierGrid) -> str:
    b = t.blocks
    name = "GPU tier" if b.tier == "gpu" else "CPU tier (swapped-out copies)"
    if not len(b):
        return f"{name}: no blocks"
    span = f"{hex_address(int(b.address[0]))} - {hex_address(int(b.address[-1]) + BLOCK_BYTES - 1)}"
    blocks = f"{len(b):,} block{'s' if len(b) != 1 else ''}"
    return f"{name}: {blocks} in use ({human_bytes(len(b) * BLOCK_BYTES)}), {span}"


def cell_text(t: TierGrid, cell: int, pal: Palette) -> str:
    state = int(t.cells[cell])
    if state == GAP:
        gaps = np.flatnonzero(t.cells[: cell + 1] == GAP).size - 1
        return f"unmapped\n{human_bytes(int(t.gap_blocks[gaps]) * BLOCK_BYTES)} free"
    if state == FREE:
        return "free"
    i = int(np.flatnonzero(t.block_cell == cell)[0])
    b = t.blocks
    owner = f"seq {int(b.seq_id[i])}\n" if b.seq_id[i] >= 0 else ""
    if state == MISMATCH:
        holders = int(b.holders[i])
        return f"{owner}refcount {int(b.refcount[i])}\nbut {holders} holder{'s' * (holders != 1)}"
    if state == LEAKED:
        return "leaked"
    if SHARED2 <= state <= SHARED4:
        return f"shared\nrefcount {int(b.refcount[i])}"
    return f"seq {int(b.seq_id[i])}" if b.seq_id[i] >= 0 else ""


def state_counts(m: MemoryMap) -> dict[int, int]:
    counts: dict[int, int] = {}
    for t in m.tiers:
        values, n = np.unique(t.cells, return_counts=True)
        for v, c in zip(values.tolist(), n.tolist(), strict=True):
            counts[v] = counts.get(v, 0) + c
    return counts


def draw(m: MemoryMap) -> Any:
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
        sub = f"one cell = one {BLOCK_BYTES}-byte block, in address order"
        if m.tiers[0].per_pixel > 1:
            sub += f"; one pixel = {m.tiers[0].per_pixel} blocks, showing the most severe"
        sub += f"; runs of more than {GAP_LIMIT} free blocks collapsed"
        fig.text(LEFT / f.width, 1 - 48 / f.height, sub, fontsize=9, color="#555555", va="center")
        for t in m.tiers:
            _draw_tier(fig, f, m, t)
        _legend(fig, f, m, Patch)
    return fig


def _axes(fig: Any, f: Frame, rect: tuple[int, int, int, int]) -> Any:
    left, top, w, h = rect
    return fig.add_axes((left / f.width, 1 - (top + h) / f.height, w / f.width, h / f.height))


def _draw_tier(fig: Any, f: Frame, m: MemoryMap, t: TierGrid) -> None:
    rect = f.grids[t.blocks.tier]
    ax = _axes(fig, f, rect)
    fig.text(
        rect[0] / f.width,
        1 - (rect[1] - 12) / f.height,
        tier_title(t),
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


def _mark_anomalies(ax: Any, m: MemoryMap, t: TierGrid) -> None:
    """Ring the blocks that check complains about when there are few: at one pixel a block,
    one red pixel among a million is easy to miss."""
    if m.small:
        return
    marked = np.zeros(t.pixels.shape, bool)
    for state in (MISMATCH, LEAKED):
        cells = np.flatnonzero(t.cells == state)
        if not 0 < cells.size <= MAX_MARKED:
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


def _label_cells(ax: Any, m: MemoryMap, t: TierGrid) -> None:
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
            cell_text(t, cell, m.palette),
            ha="center",
            va="center",
            fontsize=8.5,
            color="white" if dark else "#222222",
            linespacing=1.3,
        )


def _legend(fig: Any, f: Frame, m: MemoryMap, patch: Any) -> None:
    counts = state_counts(m)
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


def _gradient_bar(fig: Any, f: Frame, m: MemoryMap, left: float, entries: int) -> None:
    top = TOP + 60 + 24 * entries
    ax = fig.add_axes((left + 8 / f.width, 1 - (top + 14) / f.height, 240 / f.width, 14 / f.height))
    ramp = m.palette.rgb[OWNED:][None, :, :]
    ax.imshow(ramp, aspect="auto", extent=(0, 1, 0, 1), interpolation="nearest")
    ax.set_yticks([])
    owners = m.palette.owners
    ax.set_xticks([0, 1])
    ax.set_xticklabels([f"seq {owners[0]}", f"seq {owners[-1]}"], fontsize=8)
    ax.set_title(f"owned by one sequence ({owners.size:,}), by seq_id", fontsize=9, loc="left")


def render(m: MemoryMap, fmt: str = "png") -> bytes:
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
