"""The picture commands of the CLI (map, report) and what they print or refuse."""

from __future__ import annotations

from typing import Any

import pytest

from .helpers import DATA, Cli


def test_report_json_is_one_document_indented_by_two(cli: Cli) -> None:
    import json

    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    for command in (["check"], ["stats"], ["explain", "1", "0"]):
        result: Any = cli(*command, "--format", "json")
        assert result.stdout == json.dumps(json.loads(result.stdout), indent=2) + "\n", command


def test_report_limit_zero_asks_for_every_row_and_n_for_n(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`report --limit 0` means all rows (None to build_report), any other N that many;
    the size of a page written to a file is said in MiB. The page itself needs plotly (the
    report tier): here build_report is replaced by a recorder, which only sees what the
    command asks of it."""
    from pagedkv_sql.report import api

    asked: list[int | None] = []
    page = "<html>" + " " * (3 * 2**19 - 13) + "</html>"  # 1.5 MiB

    def build_report(database: object, *, limit: int | None, timeline: object) -> str:
        asked.append(limit)
        return page

    monkeypatch.setattr(api, "build_report", build_report)
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    for given in ("0", "7"):
        result: Any = cli("report", "--limit", given, "-o", "-")
        assert result.exit_code == 0 and result.stdout == page, result.stderr
        assert result.stderr == ""  # nothing was written to a file
    assert asked == [None, 7]
    result = cli("report", "-o", "page.html")
    assert result.stderr == "wrote page.html: 1.5 MB\n"
    assert (cli.cwd / "page.html").read_text() == page


def test_map_says_what_it_wrote_to_a_file_only(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """The picture needs matplotlib (the report tier): here draw_map is a recorder."""
    from types import SimpleNamespace

    from pagedkv_sql.report import api

    def draw_map(database: object, fmt: str) -> object:
        return SimpleNamespace(content=b"<svg/>", summary=f"a {fmt} map")

    monkeypatch.setattr(api, "draw_map", draw_map)
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    shown: Any = cli("map", "-f", "svg", "-o", "-")
    assert shown.stdout == "<svg/>" and shown.stderr == ""
    written: Any = cli("map", "-o", "m.svg")
    assert written.stderr == "wrote m.svg: a svg map\n"
    assert (cli.cwd / "m.svg").read_bytes() == b"<svg/>"


def test_a_report_may_be_written_to_a_file_named_none(cli: Cli) -> None:
    """Without --log the report has no input to protect: even an output named None (what
    str(None) spells) is not refused as one."""
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    result: Any = cli("report", "-o", "None")
    assert "refusing" not in result.stderr
    assert result.exit_code == 0 or "pagedkv-sql[report]" in result.stderr


def test_report_refuses_to_write_over_its_step_log(cli: Cli) -> None:
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    assert cli("synth", "--steps", "4", "run.jsonl").exit_code == 0  # type: ignore[attr-defined]
    before = (cli.cwd / "run.jsonl").read_bytes()
    result: Any = cli("report", "-o", "run.jsonl", "--log", "run.jsonl")
    assert result.exit_code == 2
    assert "refusing to write run.jsonl: it is an input of this command" in result.stderr
    assert (cli.cwd / "run.jsonl").read_bytes() == before


def test_map_takes_its_format_from_the_output_extension_before_drawing(cli: Cli) -> None:
    """`map -o map.gif` is refused by its extension (no drawing library needed for that)."""
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    result: Any = cli("map", "-o", "map.gif")
    assert result.exit_code == 2
    assert "cannot draw a map as 'gif'" in result.stderr
    assert not (cli.cwd / "map.gif").exists()
    for args in (["-o", "map.gif", "--format", "png"], ["-o", "-"]):  # --format wins; - is png
        result = cli("map", *args)
        assert "cannot draw" not in result.stderr, args
        assert result.exit_code == 0 or "pagedkv-sql[report]" in result.stderr, args
