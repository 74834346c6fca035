"""docs/report.md's picture is the spec's data drawn by the current code (`make images`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from PIL import Image

import pagedkv_sql
from pagedkv_sql.report import api

from ..helpers import DATA, ROOT

IMAGE = ROOT / "docs" / "img" / "memory-map.png"


def pixels(path: Path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"), dtype=np.int16)


def test_readme_image_is_current(tmp_path: Path) -> None:
    # the same steps as `make images`: the spec's data in pagedkv.duckdb, drawn by `map`
    shutil.copytree(DATA, tmp_path / "data")
    with pagedkv_sql.connect(tmp_path / "pagedkv.duckdb") as db:
        db.load(tmp_path / "data")
        api.save_map(db, tmp_path / "memory-map.png")
    fresh, committed = pixels(tmp_path / "memory-map.png"), pixels(IMAGE)
    assert fresh.shape == committed.shape, "docs/img/memory-map.png is stale: run `make images`"
    # a font renderer may move a few antialiased pixels; a changed picture moves many
    changed = (np.abs(fresh - committed).max(axis=2) > 48).mean()
    assert changed < 0.002, f"{changed:.2%} of pixels differ: run `make images`"
    assert "](img/memory-map.png)" in (ROOT / "docs" / "report.md").read_text()
