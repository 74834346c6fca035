"""progress.py: the progress bars drawn on a terminal."""

from __future__ import annotations

import pytest

# =================================================================================================
# Moved from the mutation runs' files (issue 24, tests by subject): each test pins a
# boundary or a branch a mutant of `make mutate` moved (docs/mutation.md); its comment
# names the run and the file it was first written in.
# =================================================================================================


# -- progress.py ---------------------------------------------------------------------------
# (from tests/test_mutation_kills.py)


# killed a mutant of progress.py (mutation run, 2026-11-30)
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


# killed a mutant of progress.py (mutation run, 2026-11-30)
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
