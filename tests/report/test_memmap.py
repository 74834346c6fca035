"""report/memmap.py (`pagedkv-sql map`): the picture of the spec's data and of a synthetic
cache, drawn by matplotlib, the same on every run."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import pagedkv_sql
from pagedkv_sql.report import api, grid, memmap, palette
from pagedkv_sql.synth import SynthConfig, synthesize

from ..helpers import DATA


def test_rendering_is_deterministic(tmp_path: Path) -> None:
    with pagedkv_sql.connect(tmp_path / "pagedkv.duckdb") as db:
        db.load(DATA)
        first = api.save_map(db, tmp_path / "a.png")
        api.save_map(db, tmp_path / "b.png")
        api.save_map(db, tmp_path / "a.svg")
        api.save_map(db, tmp_path / "b.svg")
    assert first.bytes > 0
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()


MISMATCH_BASE = 0x10000000  # refcount 2, one holder: diag_refcount_mismatch


def rgb(colour: str) -> tuple[int, int, int]:
    return palette._rgb(colour)


def pixel(path: Path, xy: tuple[int, int]) -> tuple[int, int, int]:
    with Image.open(path) as image:
        return tuple(image.convert("RGB").getpixel(xy))  # type: ignore[return-value]


def test_spec_map_shows_the_mismatch_block_in_the_mismatch_colour(cli: Any, seed_dir: Path) -> None:
    assert cli("load", str(seed_dir)).exit_code == 0
    result = cli("map", "--output", "map.png")
    assert result.exit_code == 0, result.output
    assert "wrote map.png: GPU 4 block(s), CPU 1 block(s)" in result.output
    png = cli.cwd / "map.png"
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb", read_only=True) as db:
        m = api.memory_map(db)
    assert pixel(png, memmap.pixel_of(m, "gpu", MISMATCH_BASE)) == rgb(
        palette.COLOURS[palette.MISMATCH]
    )
    # the other blocks are not: seq 1's own block, seq 2's blocks, the swapped copy
    seq1 = rgb(palette.FEW_COLOURS[0])
    seq2 = rgb(palette.FEW_COLOURS[1])
    assert pixel(png, memmap.pixel_of(m, "gpu", 0x20000000)) == seq1
    assert pixel(png, memmap.pixel_of(m, "gpu", 0x30000000)) == seq2
    assert pixel(png, memmap.pixel_of(m, "gpu", 0x40000000)) == seq2
    assert pixel(png, memmap.pixel_of(m, "cpu", 0x70000000)) == rgb(
        palette.COLOURS[palette.SWAPPED]
    )
    # the 256 MiB between two blocks is one collapsed cell, not a million free ones
    gpu = m.tier("gpu")
    assert gpu.cells.tolist()[:3] == [palette.MISMATCH, palette.GAP, palette.OWNED]


def test_svg_is_drawn_by_matplotlib_with_the_raster_inside(cli: Any, seed_dir: Path) -> None:
    cli("load", str(seed_dir))
    assert cli("map", "-o", "map.svg").exit_code == 0
    root = ET.parse(cli.cwd / "map.svg").getroot()
    assert root.tag.endswith("svg")
    assert any(e.tag.endswith("image") for e in root.iter())
    texts = (cli.cwd / "map.svg").read_text()
    assert "refcount mismatch: 1 block" in texts or "refcount" in texts


@pytest.fixture
def synthetic(tmp_path: Path) -> Path:
    path = tmp_path / "synth.duckdb"
    tables = synthesize(SynthConfig(sequences=300, mean_length=400, anomalies=3, seed=7))
    with pagedkv_sql.connect(path) as db:
        for relation, table in tables.items():
            db.load_arrow(relation, table, diagnostics=False)
    return path


def test_every_anomaly_is_visible_on_a_large_map(synthetic: Path, tmp_path: Path) -> None:
    with pagedkv_sql.connect(synthetic, read_only=True) as db:
        m = api.memory_map(db)
        api.save_map(db, tmp_path / "m.png")
    gpu = m.tier("gpu")
    assert not m.small and m.cell_px >= 1
    mismatched = gpu.blocks.address[gpu.blocks.mismatch]
    leaked = gpu.blocks.address[gpu.blocks.orphan]
    assert mismatched.size == 3 and leaked.size == 3
    for address, colour in [(a, palette.MISMATCH) for a in mismatched] + [
        (a, palette.LEAKED) for a in leaked
    ]:
        xy = memmap.pixel_of(m, "gpu", int(address))
        assert pixel(tmp_path / "m.png", xy) == rgb(palette.COLOURS[colour]), hex(address)


def test_aggregated_pixels_keep_the_most_severe_block(
    synthetic: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grid, "MAX_ROWS", 4)
    with pagedkv_sql.connect(synthetic, read_only=True) as db:
        m = api.memory_map(db)
    gpu = m.tier("gpu")
    assert gpu.per_pixel > 1 and gpu.rows <= 4
    for address in gpu.blocks.address[gpu.blocks.mismatch]:
        p = gpu.cell_of(int(address)) // gpu.per_pixel
        assert gpu.pixels.flat[p] == palette.MISMATCH
    # every block is in exactly one pixel: nothing is dropped at the end
    assert gpu.pixels.size * gpu.per_pixel >= gpu.cells.size


def test_cells_keep_address_order_and_free_gaps(synthetic: Path) -> None:
    with pagedkv_sql.connect(synthetic, read_only=True) as db:
        m = api.memory_map(db)
    gpu = m.tier("gpu")
    assert np.all(np.diff(gpu.block_cell) > 0)
    assert np.all(np.diff(gpu.cell_address) > 0)
    free = int((gpu.cells == palette.FREE).sum())
    slots = (gpu.blocks.address[-1] - gpu.blocks.address[0]) // 256 + 1
    gaps = gpu.gap_blocks.sum()
    assert free + len(gpu.blocks) + gaps == slots


def test_the_owners_gradient_is_matplotlibs_ylgnbu() -> None:
    """The palette computes YlGnBu itself (the report imports no matplotlib); `map` and the
    page still show what matplotlib's colormap gives."""
    import matplotlib

    ramp = matplotlib.colormaps["YlGnBu"](np.linspace(*palette.GRADIENT, palette.GRADIENT_STEPS))
    expected = np.round(ramp[:, :3] * 255).astype(np.int64)
    pal = palette.palette(np.arange(50))
    assert not pal.few
    assert np.array_equal(pal.rgb[palette.OWNED :], expected)
