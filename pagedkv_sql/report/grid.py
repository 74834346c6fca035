"""The memory map's layout: each tier as cells in address order (blocks, the free blocks
between them, collapsed gaps) on one grid width, and the raster of palette indexes drawn
from them (past ``MAX_ROWS`` rows a pixel shows the most severe of several blocks); the
texts that name a tier and a cell. numpy only: drawn by memmap.py (matplotlib) or by the
HTML report (plotly.js)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..numbers import hex_address
from .data import TierBlocks
from .palette import (
    BEYOND,
    FREE,
    GAP,
    LEAKED,
    MISMATCH,
    SHARED2,
    SHARED4,
    Palette,
    block_states,
    palette,
)

BLOCK_BYTES = 256
GAP_LIMIT = 256  # free blocks drawn to scale between two used blocks
MAX_COLUMNS = 1024
MAX_ROWS = 768  # rows of pixels a tier gets before blocks are aggregated
MAX_MARKED = 200  # anomalous blocks ringed on a large map, when there are no more
SMALL = 32  # up to this many cells a tier is one row of labelled cells
AXES_PX = 1024  # width of a large map's grid in pixels
DPI = 100


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
    title = f"{name}: {blocks} in use ({human_bytes(len(b) * BLOCK_BYTES)}), {span}"
    if b.group is None:
        return title
    ids, n = np.unique(b.group, return_counts=True)
    each = ", ".join(f"{g}: {c:,}" for g, c in zip(ids.tolist(), n.tolist(), strict=True))
    return f"{title}; blocks of KV-cache group {each}"


def cell_text(t: TierGrid, cell: int, pal: Palette) -> str:
    """What a cell shows: its state, its owner; after an import of several KV-cache
    groups, the group of its block."""
    text = _cell_state(t, cell)
    if t.blocks.group is None or int(t.cells[cell]) in (GAP, FREE):
        return text
    i = int(np.flatnonzero(t.block_cell == cell)[0])
    return f"{text}\ngroup {int(t.blocks.group[i])}".lstrip("\n")


def _cell_state(t: TierGrid, cell: int) -> str:
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
