"""progress.py: the progress bars drawn on a terminal."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pagedkv_sql
from pagedkv_sql import progress

from .helpers import on_a_terminal


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


def test_progress_one_bar_a_stage_on_a_terminal_only(tmp_path: Path) -> None:
    """On a terminal: one labelled line a stage (read and check each relation,
    diagnostics, write), in the load's order, each redrawn in place and never going
    backwards, finished at 100%; piped or --quiet: no bar at all."""
    import re
    import subprocess
    import sys

    from pagedkv_sql.synth import SynthConfig, synthesize, write

    from .helpers import on_a_terminal

    write(synthesize(SynthConfig(sequences=1000, mean_length=1000)), tmp_path / "w")
    command = [sys.executable, "-m", "pagedkv_sql", "load", "w"]
    returncode, drawn = on_a_terminal(command[3:], tmp_path)
    assert returncode == 0
    order = [f"read and check {r}" for r in pagedkv_sql.INPUT_RELATIONS]
    order += ["diagnostics", "write"]
    text = drawn.replace("\r\n", "\n")
    bars = text[: text.index("relation ")].split("\n")[:-1]  # the stages, then the report
    assert bars, text
    labels = []
    for line in bars:
        draws = [d for d in line.split("\r") if d]
        parsed = [re.fullmatch(r"(.+?) +\[([#.]{30})\] +(\d*)%? *(\d+\.\d)s", d) for d in draws]
        assert all(parsed), line
        label = parsed[0].group(1)  # type: ignore[union-attr]
        assert {p.group(1) for p in parsed} == {label}, line  # type: ignore[union-attr]
        percents = [int(p.group(3)) for p in parsed if p.group(3)]  # type: ignore[union-attr]
        assert percents == sorted(percents), line  # monotone
        assert parsed[-1].group(2) == "#" * 30, line  # type: ignore[union-attr]
        labels.append(label)
    # the load's order, once each (a stage over before the 0.25 s poll draws no line)
    assert labels == [x for x in order if x in labels], labels
    piped = subprocess.run(command, cwd=tmp_path, capture_output=True, check=True)
    assert b"[" not in piped.stderr.split(b"relation ")[0]
    assert piped.stderr.startswith(b"relation ")


# -- every long command, not only load -------------------------------------------------


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


def test_a_meter_counts_what_a_reader_read_and_its_share_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"0123456789\n" * 10)
    assert progress.running() == ""
    with path.open("rb") as f, progress.metering("lines", progress.file_size(f)) as meter:
        lines = progress.counted(iter(f), meter)
        for _ in range(4):
            next(lines)
        assert progress.running() == "read 3 lines (40%)"  # 44 of 110 bytes: the 4th is being read
        with progress.metering("lines", None) as inner:  # the newest is the one shown
            inner.count = 7
            assert progress.running() == "read 7 lines"
        assert progress.running() == "read 3 lines (40%)"
    assert progress.running() == ""
    assert progress.file_size(io.BytesIO(b"x")) is None  # a stream without a file: no share


def test_a_ticker_shows_what_a_reader_read_before_the_query(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter([10.0, 11.5])
    monkeypatch.setattr("pagedkv_sql.progress.time.monotonic", lambda: next(clock))
    out = io.StringIO()
    with progress.Ticker("replay", out) as ticker:
        ticker.tick(-1.0, "read 12,345 lines (41%)")
    assert out.getvalue().split("\r\x1b[2K")[1] == f"{'replay':<32} 1.5s read 12,345 lines (41%)"


def test_a_loads_read_stage_reports_the_percent_of_its_statement(tmp_path: Path) -> None:
    """A Database's cursors are sessions of their own: each is set up to report its
    statement's progress, so the bar of `read and check virtual_token` moves (it sat at 0%
    while the connection alone reported any)."""
    import threading

    from pagedkv_sql.synth import SynthConfig, synthesize, write

    write(synthesize(SynthConfig(sequences=2000, mean_length=1000)), tmp_path / "w")
    seen: list[float] = []
    with pagedkv_sql.connect(tmp_path / "p.duckdb") as db:
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                seen.append(db.progress())
                done.wait(0.002)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            db.load(tmp_path / "w", diagnostics=False)
        finally:
            done.set()
            poller.join()
    assert any(0 < p < 100 for p in seen), sorted(set(seen))


@pytest.mark.slow
def test_replay_shows_the_lines_it_read_and_their_percent_on_a_terminal(tmp_path: Path) -> None:
    from pagedkv_sql.replay.synth import StepSynthConfig
    from pagedkv_sql.replay.synth import write as write_log

    write_log(StepSynthConfig(steps=8000), tmp_path / "run.jsonl")
    code, drawn = on_a_terminal(["replay", "run.jsonl"], tmp_path)
    assert code == 0, drawn
    counts = [int(n.replace(",", "")) for n in re.findall(r"read ([\d,]+) lines \(\d+%\)", drawn)]
    assert counts and counts == sorted(counts), drawn
