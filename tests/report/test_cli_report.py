"""`pagedkv-sql map` and `report` in the report tier: where they write, what they say,
what they refuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def test_map_and_report_write_to_stdout(cli: Any, seed_dir: Path) -> None:
    cli("load", str(seed_dir))
    result = cli("map", "-o", "-", "--format", "svg")
    assert result.exit_code == 0
    assert result.stdout_bytes.startswith(b"<?xml") and b"wrote" not in result.stdout_bytes
    result = cli("map", "-o", "-")
    assert result.stdout_bytes.startswith(b"\x89PNG")
    result = cli("report", "-o", "-")
    assert result.exit_code == 0
    assert result.stdout_bytes.startswith(b"<!DOCTYPE html>")
    assert not list(cli.cwd.glob("*.png")) and not list(cli.cwd.glob("*.html"))


def test_report_says_what_it_wrote_and_how_big(cli: Any, seed_dir: Path) -> None:
    """`report -o FILE` names the file and its size in MB on stderr; to stdout, no such line."""
    assert cli("load", str(seed_dir)).exit_code == 0
    result = cli("report", "-o", "r.html")
    assert result.exit_code == 0, result.output
    size = (cli.cwd / "r.html").stat().st_size
    assert size > 2**20 // 10  # the page inlines its scripts: a tenth of a MB and more
    assert result.stderr == f"wrote r.html: {size / 2**20:.1f} MB\n"
    result = cli("report", "-o", "-")
    assert result.exit_code == 0 and result.stderr == ""


def test_map_refuses_an_unknown_format_and_a_missing_database(cli: Any, seed_dir: Path) -> None:
    result = cli("map", "-o", "map.gif")
    assert result.exit_code == 1 and "no database" in result.output
    cli("load", str(seed_dir))
    result = cli("map", "-o", "map.gif")
    assert result.exit_code == 2
    assert "cannot draw a map as 'gif'" in result.output and "Fix:" in result.output
    assert not (cli.cwd / "map.gif").exists()
    result = cli("map", "-o", "m.png", "--format", "gif")
    assert result.exit_code == 2 and "'gif' is not one of" in result.output
    assert cli("map", "-o", "picture", "--format", "svg").exit_code == 0
    assert (cli.cwd / "picture").read_bytes().startswith(b"<?xml")
