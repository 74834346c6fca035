"""The report capability stays out of the core: nothing imports it (or its plotting
libraries) until `map` or `report` runs, and without the extra they say how to get it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def test_the_core_and_the_cli_import_no_plotting() -> None:
    code = (
        "import sys, pagedkv_sql, pagedkv_sql.cli\n"
        "bad = [m for m in sys.modules if m.startswith(('matplotlib', 'plotly', "
        "'pagedkv_sql.report'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(("command", "missing"), [("map", "matplotlib")])
def test_without_the_extra_the_commands_say_how_to_install_it(
    cli: Any, seed_dir: Path, monkeypatch: pytest.MonkeyPatch, command: str, missing: str
) -> None:
    assert cli("load", str(seed_dir)).exit_code == 0
    monkeypatch.setitem(sys.modules, missing, None)  # makes `import missing` fail
    result = cli(command, "-o", "out.file.png" if command == "map" else "out.html")
    assert result.exit_code == 2
    assert f"Error: drawing needs {missing}, which is not installed" in result.output
    assert "pip install 'pagedkv-sql[report]'" in result.output
    assert not list(cli.cwd.glob("out*"))


def test_the_report_needs_neither_matplotlib_nor_plotly(
    cli: Any, seed_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's memory map is drawn by plotly.js from the raster: only `map` (PNG, SVG)
    uses matplotlib; plotly.js comes from the package's assets, not from the
    plotly package."""
    assert cli("load", str(seed_dir)).exit_code == 0
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "plotly", None)
    result = cli("report", "-o", "out.html")
    assert result.exit_code == 0, result.output
    page = (cli.cwd / "out.html").read_bytes()
    assert b'id="map-gpu"' in page
    assert b"plotly.js (cartesian - minified) v4.1.1" in page


def test_what_the_pictures_show_of_the_spec_data(db: Any) -> None:
    """The data behind the map and the strips, which needs no plotting library."""
    from pagedkv_sql.report import data

    from .conftest import DATA

    db.load(DATA)
    gpu, cpu = data.tier_blocks(db.con)
    assert gpu.address.tolist() == [0x10000000, 0x20000000, 0x30000000, 0x40000000]
    assert gpu.seq_id.tolist() == [1, 1, 2, 2]
    assert gpu.mismatch.tolist() == [True, False, False, False]
    assert gpu.holders.tolist() == [1, 1, 1, 1] and gpu.refcount.tolist() == [2, 1, 1, 1]
    assert cpu.address.tolist() == [0x70000000] and cpu.seq_id.tolist() == [1]
    # seq 1: block 0 in the mismatched base, 1 resident, 2 swapped; seq 2: 0 resident,
    # 1 missing (token 16 needs it), 2 resident
    strips = {s.seq_id: (s.strip, s.tokens, s.block_tables) for s in data.sequences(db.con)}
    assert strips == {1: ("xrc", 5, "100"), 2: ("rmr", 3, "101")}
    assert data.request_ids(db.con) == {}


def test_a_duplicate_row_is_one_holder_and_an_orphan_is_leaked(db: Any) -> None:
    from pagedkv_sql.report import data

    from .conftest import DATA

    db.load(DATA)
    # what a DuckDB shell can do: an exact duplicate row, a table no sequence points to
    db.con.execute("INSERT INTO block_table_entry VALUES (100, 1, 536870912, 1)")
    db.con.execute("INSERT INTO block_table_entry VALUES (555, 0, 1280, 1)")
    gpu, _ = data.tier_blocks(db.con)
    assert gpu.address.tolist()[0] == 1280
    assert gpu.orphan.tolist() == [True, False, False, False, False]
    assert gpu.holders.tolist() == [1, 1, 1, 1, 1]
    assert gpu.seq_id.tolist()[0] == -1
    strips = {s.seq_id: s.strip for s in data.sequences(db.con)}
    assert strips == {1: "xrc", 2: "rmr"}  # the duplicate does not make block 1 shared
