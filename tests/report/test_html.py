"""`pagedkv-sql report`, opened in a real headless Chromium with no network."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import pagedkv_sql
from pagedkv_sql.report import api, grid, html, palette
from pagedkv_sql.synth import SynthConfig, synthesize

from ..helpers import DATA

SPEC_FINDINGS = [
    "diag_refcount_mismatch",
    "refcount 2 but 1 holder(s)",
    "diag_unresolved_token",
    "block 1 of block table 101 is neither resident nor swapped",
]


class Page:
    """A report opened in the browser, with everything it logged and asked for."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.context = browser.new_context(viewport={"width": 1400, "height": 900})
        self.page = self.context.new_page()
        self.console: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))

        def route(r: Any) -> None:
            self.requests.append(r.request.url)
            if r.request.url == path.as_uri():
                r.continue_()
            else:
                r.abort()

        self.page.route("**/*", route)
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("#fig-refcount .main-svg")
        self.page.wait_for_selector("#map[data-drawn]")
        self.url = path.as_uri()

    def errors(self) -> list[str]:
        return [m for m in self.console if m.startswith(("error", "pageerror", "warning"))]

    def text(self) -> str:
        return str(self.page.inner_text("body"))

    def rows(self, selector: str) -> list[str]:
        return [t for t in self.page.locator(selector).all_inner_texts() if t.strip()]

    def map_cell(self, tier: str, row: int, col: int) -> tuple[float, float]:
        """The middle of a cell (a pixel of the raster) of a tier's heatmap, in the page."""
        plot = self.page.locator(f"#map-{tier}")
        plot.scroll_into_view_if_needed()
        box = plot.locator(".nsewdrag").first.bounding_box()
        rows, width = self.page.evaluate(
            f"() => {{ const z = document.getElementById('map-{tier}').data[0].z; "
            "return [z.length, z[0].length]; }"
        )
        return (
            box["x"] + (col + 0.5) * box["width"] / width,
            box["y"] + (row + 0.5) * box["height"] / rows,
        )

    def hover(self, tier: str, row: int, col: int) -> str:
        # the previous hover's tip is cleared first: still visible, it was read before the
        # new hover replaced it (seen once on a loaded machine: the last anomaly's text)
        self.page.evaluate(
            "() => { const t = document.getElementById('strip-tip');"
            " t.textContent = ''; t.style.display = 'none'; }"
        )
        self.page.mouse.move(*self.map_cell(tier, row, col))
        self.page.wait_for_function(
            "() => { const t = document.getElementById('strip-tip');"
            " return t.style.display === 'block' && t.textContent !== ''; }"
        )
        return str(self.page.inner_text("#strip-tip"))


@pytest.fixture
def spec_report(cli: Any, seed_dir: Path) -> Path:
    assert cli("load", str(seed_dir)).exit_code == 0
    result = cli("report", "--output", "report.html")
    assert result.exit_code == 0, result.output
    return cli.cwd / "report.html"


def test_spec_report_opens_clean_and_shows_every_finding(browser: Any, spec_report: Path) -> None:
    p = Page(browser, spec_report)
    assert p.errors() == []
    assert p.requests == [p.url]  # nothing but the file itself
    text = p.text()
    for finding in SPEC_FINDINGS:
        assert finding in text
    assert "0 error(s) (the spec's constraints) and 2 warning(s)" in text
    # the stats, both sequences with their strips, both charts, the map
    assert "unused token slots in last blocks" in text
    assert len(p.rows("#seq-table tbody tr")) == 2
    assert p.page.locator("#seq-table canvas").count() == 2
    assert p.page.locator("#fig-tiers .main-svg").count() >= 1
    assert p.page.get_attribute("#map", "data-drawn") == "yes"
    assert p.page.locator("#map-gpu .main-svg").count() >= 1
    shot = Image.open(io.BytesIO(p.page.screenshot(full_page=True))).convert("RGB")
    colours = shot.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # not blank
    background = max(colours)[0] / (shot.width * shot.height)
    assert background < 0.9
    p.context.close()


def test_the_map_is_a_plotly_heatmap_with_hover_and_click(browser: Any, spec_report: Path) -> None:
    """The spec's GPU tier is one row of labelled cells: the mismatched block, a collapsed
    gap, seq 1's block, a gap, seq 2's two blocks 256 bytes apart... (test_map has the same
    layout in the PNG)."""
    p = Page(browser, spec_report)
    kinds = p.page.evaluate(
        "() => ['gpu', 'cpu'].map(t => document.getElementById('map-' + t).data[0].type)"
    )
    assert kinds == ["heatmap", "heatmap"]
    cells = p.page.evaluate("() => Array.from(document.getElementById('map-gpu').data[0].z[0])")
    assert cells[:3] == [palette.MISMATCH, palette.GAP, palette.OWNED]
    assert "refcount 2" in p.page.inner_text("#map-gpu")  # the cells' labels
    tip = p.hover("gpu", 0, 0)
    assert "GPU block 0x10000000" in tip and "refcount mismatch" in tip and "seq 1" in tip
    tip = p.hover("gpu", 0, 1)
    assert "unmapped: 1,048,575 free blocks (256 MiB)" in tip and "0x10000100 - 0x1fffffff" in tip
    tip = p.hover("cpu", 0, 0)
    assert "CPU block 0x70000000" in tip and "swapped-out copy (CPU)" in tip
    assert "legend" in p.page.inner_html("#map") and "owned by seq 2: 2 blocks" in p.text()
    # a click on seq 2's block shows seq 2
    p.page.mouse.click(*p.map_cell("gpu", 0, 4))
    assert p.page.input_value("#search") == "2"
    rows = p.rows("#seq-table tbody tr")
    assert len(rows) == 1 and rows[0].split()[:2] == ["2", "101"]
    # and the blocks seq 2 owns are marked on the map: cells 4 and 6, nothing on the CPU
    marks = (
        "t => { const d = document.getElementById('map-' + t).data.find(d => d.name === "
        "'searched'); return [Array.from(d.x), Array.from(d.y)]; }"
    )
    assert p.page.evaluate(marks, "gpu") == [[4, 6], [0, 0]]
    assert p.page.evaluate(marks, "cpu") == [[], []]
    p.page.fill("#search", "1")
    assert p.page.evaluate(marks, "gpu") == [[0, 2], [0, 0]]
    assert p.page.evaluate(marks, "cpu") == [[0], [0]]
    p.page.fill("#search", "")
    assert p.page.evaluate(marks, "gpu") == [[], []]
    assert p.errors() == []
    p.context.close()


def _synth_report(tmp_path: Path) -> Any:
    """A 300-sequence synth with three planted anomalies: its report written to
    tmp_path/r.html, and its memory map returned."""
    tables = synthesize(SynthConfig(sequences=300, mean_length=400, anomalies=3, seed=7))
    with pagedkv_sql.connect(tmp_path / "synth.duckdb") as db:
        for relation, table in tables.items():
            db.load_arrow(relation, table, diagnostics=False)
        api.save_report(db, tmp_path / "r.html")
        return api.memory_map(db)


def test_a_large_map_hovers_each_anomaly_at_its_address(browser: Any, tmp_path: Path) -> None:
    m = _synth_report(tmp_path)
    gpu = m.tier("gpu")
    assert not m.small and gpu.per_pixel == 1
    p = Page(browser, tmp_path / "r.html")
    assert (
        p.page.evaluate("() => document.querySelectorAll('#map-gpu .scatterlayer .point').length")
        == 6
    )
    for address, state in [
        (a, "refcount mismatch") for a in gpu.blocks.address[gpu.blocks.mismatch]
    ] + [(a, "leaked") for a in gpu.blocks.address[gpu.blocks.orphan]]:
        row, col = divmod(gpu.cell_of(int(address)), m.columns)
        tip = p.hover("gpu", row, col)
        assert f"GPU block {int(address):#x}" in tip and state in tip, tip
    # an owned block names its owner
    i = int(
        np.flatnonzero(~gpu.blocks.mismatch & ~gpu.blocks.orphan & (gpu.blocks.holders == 1))[0]
    )
    row, col = divmod(int(gpu.block_cell[i]), m.columns)
    tip = p.hover("gpu", row, col)
    assert f"seq {int(gpu.blocks.seq_id[i])} " in tip and "owned by one sequence" in tip
    assert p.errors() == []
    p.context.close()


def test_an_aggregated_pixel_hovers_its_range_and_most_severe_block(
    browser: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_ROWS rows a pixel stands for several blocks (at 100M tokens and more): its
    hover gives the range it covers and the state it shows, the most severe."""
    monkeypatch.setattr(grid, "MAX_ROWS", 4)
    m = _synth_report(tmp_path)
    gpu = m.tier("gpu")
    assert gpu.per_pixel > 1 and gpu.rows <= 4
    p = Page(browser, tmp_path / "r.html")
    address = int(gpu.blocks.address[gpu.blocks.mismatch][0])
    pixel = gpu.cell_of(address) // gpu.per_pixel
    first = int(gpu.cell_address[pixel * gpu.per_pixel])
    tip = p.hover("gpu", *divmod(pixel, m.columns))
    assert f"GPU {first:#x} - " in tip and "the most severe shown" in tip, tip
    assert "refcount mismatch" in tip
    assert f"One pixel = {gpu.per_pixel:,} blocks, showing the most severe" in p.text()
    assert p.errors() == []
    p.context.close()


def test_the_report_never_imports_matplotlib(tmp_path: Path) -> None:
    script = (
        "import sys, pagedkv_sql\n"
        "from pagedkv_sql.report import api\n"
        f"with pagedkv_sql.connect({str(tmp_path / 'x.duckdb')!r}) as db:\n"
        f"    db.load({str(DATA)!r})\n"
        f"    api.save_report(db, __import__('pathlib').Path({str(tmp_path / 'x.html')!r}))\n"
        "print(sorted(m for m in sys.modules if m.startswith('matplotlib')))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"
    assert (tmp_path / "x.html").stat().st_size > 0


def test_search_by_seq_id_filters_sequences_and_findings(browser: Any, spec_report: Path) -> None:
    p = Page(browser, spec_report)
    p.page.fill("#search", "2")
    rows = p.rows("#seq-table tbody tr")
    assert len(rows) == 1 and rows[0].split()[:2] == ["2", "101"]
    visible = p.rows("table.rows tbody tr:visible")
    assert len(visible) == 1 and "neither resident nor swapped" in visible[0]
    # seq 1 holds table 100, which holds the mismatched base
    p.page.fill("#search", "1")
    visible = p.rows("table.rows tbody tr:visible")
    assert len(visible) == 1 and "refcount 2 but 1 holder(s)" in visible[0]
    p.page.fill("#search", "")
    assert len(p.rows("table.rows tbody tr:visible")) == 2
    # only the sequences with a missing or mismatched block: both, here
    p.page.check("#only-bad")
    assert len(p.rows("#seq-table tbody tr")) == 2
    p.page.uncheck("#only-bad")
    # a seq_id in a finding is a link to its sequence
    p.page.click("a.seq")
    assert p.page.input_value("#search") == "2"
    assert p.errors() == []
    p.context.close()


def test_many_findings_are_capped_with_their_full_count(
    browser: Any, cli: Any, facts_dir: Any, tmp_path: Path
) -> None:
    facts = {
        "root_table": [(1, 100)],
        "block_table_entry": [(100, i, 0x1000 + 256 * i, 3) for i in range(40)],
        "virtual_token": [(1, 16 * i, i, 0) for i in range(45)],
        "swapped_block": [],
    }
    cli("load", str(facts_dir(facts)))
    assert cli("report", "-o", "r.html", "--limit", "10").exit_code == 0
    p = Page(browser, cli.cwd / "r.html")
    text = p.text()
    assert "40 rows" in text and "30 more row(s) not in this page" in text
    assert "5 rows" in text  # 5 unresolved tokens, all shown
    p.page.check("#only-bad")  # seq 1 misses blocks 40-44
    assert len(p.rows("#seq-table tbody tr")) == 1
    assert p.errors() == []
    p.context.close()


def test_report_of_an_empty_database(browser: Any, tmp_path: Path) -> None:
    path = tmp_path / "empty.duckdb"
    with pagedkv_sql.connect(path) as db:
        api.save_report(db, tmp_path / "e.html")
    p = Page(browser, tmp_path / "e.html")
    assert "every check passed" in p.text()
    assert p.errors() == []
    p.context.close()


def test_timeline_marks_the_first_bad_step(browser: Any, tmp_path: Path) -> None:
    timeline = html.Timeline(
        steps=[0, 1, 2, 3],
        series={"gpu blocks": [1, 2, 4, 3]},
        first_bad_step=2,
        first_bad_reason="block 7 freed twice",
    )
    with pagedkv_sql.connect(tmp_path / "t.duckdb") as db:
        api.save_report(db, tmp_path / "t.html", timeline=timeline)
    p = Page(browser, tmp_path / "t.html")
    p.page.wait_for_selector("#fig-timeline .main-svg")
    assert "First bad step: 2 block 7 freed twice" in p.text()
    assert "first bad step 2" in p.page.inner_text("#fig-timeline")
    assert p.errors() == []
    p.context.close()


def test_a_replayed_step_log_gives_the_timeline_and_request_ids(browser: Any, cli: Any) -> None:
    log = "run.jsonl"
    assert cli("synth", log, "--steps", "300", "--fault", "double_free@120").exit_code == 0
    result = cli("replay", log, "--at", "100")
    assert result.exit_code == 0, result.output
    assert cli("report", "-o", "r.html").exit_code == 0
    p = Page(browser, cli.cwd / "r.html")
    p.page.wait_for_selector("#fig-timeline .main-svg")
    text = p.text()
    assert "First bad step: 120 double_free" in text
    assert "first bad step 120" in p.page.inner_text("#fig-timeline")
    # the log's request ids are searchable
    assert "request id" in p.page.inner_text("#seq-table thead")
    first = p.rows("#seq-table tbody tr")[0].split()
    p.page.fill("#search", first[1])
    rows = p.rows("#seq-table tbody tr")
    assert len(rows) == 1 and rows[0].split()[:2] == first[:2]
    assert p.errors() == []
    p.context.close()


def test_report_log_option_replays_a_log_beside_any_database(
    browser: Any, cli: Any, seed_dir: Path
) -> None:
    cli("load", str(seed_dir))
    cli("synth", "run.jsonl", "--steps", "200", "--fault", "double_free@50")
    result = cli("report", "-o", "r.html", "--log", "run.jsonl")
    assert result.exit_code == 0, result.output
    p = Page(browser, cli.cwd / "r.html")
    assert "First bad step: 50 double_free" in p.text()
    for finding in SPEC_FINDINGS:
        assert finding in p.text()
    assert p.errors() == []
    p.context.close()


# -- strings that could break out of the page's embedded JSON stay inside it ---------------


HOSTILE_IDS = [
    "chat<!--1",
    "</script><script>document.title='owned'</script>",
    "<script>",
    "a\u2028b\u2029c",
    "-->x",
    "&amp;<\\!--",
    "\\u003c",
    "<!-- </SCRIPT",
]


def test_any_request_id_leaves_the_pages_data_valid_json(browser: Any, cli: Any) -> None:
    """Request ids with comment openers, script tags, line and paragraph separators: the
    page parses its data (no page error), draws its charts and its map, lists every
    sequence, and each id reads back exactly as given."""
    from pagedkv_sql.engines import flashinfer

    n = len(HOSTILE_IDS)
    flashinfer.snapshot(
        np.arange(n + 1, dtype=np.int32),
        np.arange(n, dtype=np.int32),
        np.full(n, 4, np.int32),
        16,
        request_ids=HOSTILE_IDS,
    ).save(cli.cwd / "c.npz")
    assert cli("import", "flashinfer", "c.npz").exit_code == 0
    assert cli("report", "-o", "r.html").exit_code == 0
    page = (cli.cwd / "r.html").read_text()
    script = page[page.index('id="pagedkv-data"') :]
    script = script[: script.index("</script>")]
    assert "<!--" not in script and "<script" not in script.lower()
    p = Page(browser, cli.cwd / "r.html")
    assert p.errors() == []
    assert p.page.title() != "owned"
    assert p.page.locator("#fig-refcount .main-svg").count() >= 1
    assert p.page.locator("#map-gpu .main-svg").count() >= 1
    assert len(p.rows("#seq-table tbody tr")) == n
    got = p.page.evaluate(
        "() => JSON.parse(document.getElementById('pagedkv-data').textContent)"
        ".sequences.map(s => s[4])"
    )
    assert got == HOSTILE_IDS
    p.context.close()


def test_a_replayed_request_id_leaves_the_pages_data_valid_json(browser: Any, cli: Any) -> None:
    allocate = [{"op": "allocate", "req": r, "blocks": [i + 1]} for i, r in enumerate(HOSTILE_IDS)]
    lines: list[dict[str, Any]] = [{"step": 0, "ops": allocate}]
    lines.append({"step": 1, "ops": [{"op": "append", "req": r, "tokens": 3} for r in HOSTILE_IDS]})
    (cli.cwd / "l.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = cli("replay", "l.jsonl", "--at", "1")
    assert result.exit_code == 0, result.output
    assert cli("report", "-o", "r.html").exit_code == 0
    p = Page(browser, cli.cwd / "r.html")
    assert p.errors() == []
    assert len(p.rows("#seq-table tbody tr")) == len(HOSTILE_IDS)
    got = p.page.evaluate(
        "() => JSON.parse(document.getElementById('pagedkv-data').textContent)"
        ".sequences.map(s => s[4])"
    )
    assert sorted(got) == sorted(HOSTILE_IDS)
    p.context.close()
