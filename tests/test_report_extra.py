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


@pytest.mark.parametrize(
    ("command", "missing"), [("map", "matplotlib"), ("report", "matplotlib"), ("report", "plotly")]
)
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
