"""The memory map's palette: a palette index a block state (free, swapped, leaked, a
refcount mismatch, shared, owned by a sequence), its colour, its label and which state wins
when a pixel stands for several blocks. Computed with numpy alone: the HTML report takes
the same colours without matplotlib."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .data import TierBlocks

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
