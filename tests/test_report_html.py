"""The HTML report's page (pagedkv_sql/report/html.py) as text, without a browser (the
report tier, tests/report, drives it in chromium)."""

from __future__ import annotations

from pathlib import Path

import pagedkv_sql
from pagedkv_sql.report import api


def _cards(page: str) -> dict[str, tuple[str, str]]:
    """The summary cards: label -> (value, class)."""
    import re

    found = re.findall(
        r'<div class="card ([a-z]*)"><div class="v">([^<]*)</div><div class="k">([^<]*)</div>',
        page,
    )
    return {label: (value, cls) for cls, value, label in found}


def test_the_cards_say_a_stored_step_log_broke_at_its_first_bad_step(tmp_path: Path) -> None:
    """A database whose replay broke at step 120 with no check finding: the cards must not
    be all green; with a clean log they say so."""
    from pagedkv_sql.replay import synth

    with pagedkv_sql.connect(tmp_path / "r.duckdb") as db:
        synth.write(
            synth.StepSynthConfig(steps=200, faults=(("double_free", 120),)), tmp_path / "b.jsonl"
        )
        db.replay(str(tmp_path / "b.jsonl"))
        cards = _cards(api.build_report(db))
    assert cards["step log: first broken step"] == ("120", "bad")
    # the state's checks found nothing, but no card is green beside a broken log
    assert cards["errors"] == ("0", "") and cards["warnings"] == ("0", "")
    assert "good" not in {cls for _, cls in cards.values()}
    with pagedkv_sql.connect(tmp_path / "c.duckdb") as db:
        synth.write(synth.StepSynthConfig(steps=50), tmp_path / "c.jsonl")
        db.replay(str(tmp_path / "c.jsonl"))
        cards = _cards(api.build_report(db))
    assert cards["step log"] == ("no invariant broken", "good")
    assert "step log: first broken step" not in cards
    assert cards["errors"] == ("0", "good") and cards["warnings"] == ("0", "good")
