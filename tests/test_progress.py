"""progress.py: the progress bars drawn on a terminal."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import on_a_terminal


def test_progress_stages_draw_each_bar_forward_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a terminal receives: a bar redrawn in place, never backwards, capped at 100%,
    finished on its own line when the next stage starts; an unmeasured stage shows time."""
    import io

    from pagedkv_sql import progress

    monkeypatch.setattr("pagedkv_sql.progress.time.monotonic", lambda: 12.0)
    out = io.StringIO()
    read = ("read and check root_table", 10.0, True)
    with progress.Stages(out) as stages:
        stages.update(None, 50.0)  # no stage yet: nothing drawn
        stages.update(read, 40.0)
        stages.update(read, 20.0)  # a new statement's lower figure: the bar stays
        stages.update(read, 55.0)
        stages.update(read, 250.0)
        stages.update(("diagnostics", 11.5, False), 30.0)
    label = "read and check root_table       "
    assert out.getvalue() == (
        f"\r{label} [{'#' * 12}{'.' * 18}]  40% 2.0s"
        f"\r{label} [{'#' * 12}{'.' * 18}]  40% 2.0s"
        f"\r{label} [{'#' * 16}{'.' * 14}]  55% 2.0s"
        f"\r{label} [{'#' * 30}] 100% 2.0s"
        f"\r{label} [{'#' * 30}] 100% 2.0s\n"
        f"\r{'diagnostics':<32} [{'.' * 30}]      0.5s"
        f"\r{'diagnostics':<32} [{'#' * 30}]      0.5s\n"
    )


def test_a_progress_bar_clears_its_line_and_an_undrawn_one_writes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io

    from pagedkv_sql import progress

    monkeypatch.setattr("pagedkv_sql.progress.time.monotonic", lambda: 12.0)
    out = io.StringIO()
    with progress.Bar("x", out, start=12.0) as bar:
        bar.update(-1.0)
    assert out.getvalue() == (f"\r{'x':<32} [{'.' * 30}]   0% 0.0s" * 2) + "\r\x1b[2K"
    quiet = io.StringIO()
    progress.Bar("y", quiet).finish()
    with progress.Stages(quiet):
        pass
    assert quiet.getvalue() == ""


# -- every long command, not only load (issue 29) ----------------------------------------


@pytest.mark.slow
def test_check_shows_progress_on_a_terminal_and_none_under_quiet(
    tmp_path: Path,
) -> None:
    from pagedkv_sql.synth import SynthConfig, synthesize, write

    write(synthesize(SynthConfig(sequences=200, mean_length=200)), tmp_path / "w")
    subprocess.run(
        [sys.executable, "-m", "pagedkv_sql", "load", "w"], cwd=tmp_path, capture_output=True
    )
    code, drawn = on_a_terminal(["check"], tmp_path)
    assert code in (0, 1), drawn
    # the label and the time, drawn at once and redrawn in place, cleared before the
    # report starts
    assert re.search(r"\r\x1b\[2Kcheck +\d+\.\ds", drawn), drawn
    report = drawn.rsplit("\r\x1b[2K", 1)[1]
    code, quiet = on_a_terminal(["-q", "check"], tmp_path)
    assert "\x1b[2K" not in quiet
    assert quiet.replace("\r\n", "\n") == report.replace("\r\n", "\n")


def test_a_ticker_draws_its_label_time_and_the_running_query(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pagedkv_sql.progress import Ticker

    clock = iter([10.0, 11.5, 12.25])
    monkeypatch.setattr("pagedkv_sql.progress.time.monotonic", lambda: next(clock))
    out = io.StringIO()
    with Ticker("replay", out) as ticker:
        ticker.tick(-1.0)
        ticker.tick(42.0)
    lines = out.getvalue().split("\r\x1b[2K")
    assert lines == ["", f"{'replay':<32} 1.5s", f"{'replay':<32} 2.2s (query  42%)", ""]


def test_verbose_and_quiet_set_what_the_library_log_shows(tmp_path: Path) -> None:
    # issue 29: the library's log never reached the shell (a NullHandler ate it)
    cr = tmp_path / "cr.facts"
    cr.write_bytes(b"1\t100\r\n2\t101\r\n")
    note = "info: cr.facts: CR line ends; reading it with pyarrow's CSV reader"

    def load(*root: str) -> str:
        run = subprocess.run(
            [sys.executable, "-m", "pagedkv_sql", *root, "load", "-r", "root_table", "cr.facts"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        )
        return run.stderr

    assert note in load("-v").splitlines()
    assert note not in load()
    assert load("-q") == ""  # no report, no warning: errors only
