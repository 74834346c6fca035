"""replay/render.py: a replay report as a table and as JSON."""

from __future__ import annotations

import json

import pagedkv_sql
from pagedkv_sql.replay import render

from .steplogs import alloc, release, table


def test_one_finding_of_a_keep_going_run_prints_the_table_and_the_count() -> None:
    steps = [
        {"step": 0, "ops": [alloc("a", 1), alloc("b", 2)]},
        {"step": 1, "ops": [release("a", 2)]},
    ]
    with pagedkv_sql.connect(":memory:") as db:
        every = db.replay(table(steps), keep_going=True)
        first = db.replay(table(steps))
    assert every.counts == {"double_free": 1} and len(every.findings) == 1
    text = render.text_report(every)
    assert text.splitlines()[-1] == "1 finding(s): double_free 1; first at step 1"
    assert text.splitlines()[1].split() == [
        "where",
        "invariant",
        "check",
        "requests",
        "blocks",
        "message",
    ]
    assert text.splitlines()[2].split()[:6] == ["step", "1", "double_free", "double_free", "a", "2"]
    assert render.text_report(first).splitlines()[1:] == [
        "step 1: double_free: request a releases block 2 which it does not hold (1 holder(s))",
        "  double_free (replay): request a; block 2; event 4; op release; expected request "
        "holds block 2; found 1 holder(s), not this request",
    ]


def test_the_json_report_is_indented_by_two() -> None:
    steps = [{"step": 0, "ops": [alloc("a", 1)]}]
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(table(steps))
    assert render.json_report(report) == json.dumps(report.to_dict(), indent=2)
    assert render.json_report(report).splitlines()[1].startswith('  "')
    assert not render.json_report(report).splitlines()[1].startswith("   ")


def test_until_keeps_the_findings_of_its_step_and_before() -> None:
    steps = [
        {"step": 0, "ops": [alloc("a", 1), alloc("b", 2)]},
        {"step": 1, "ops": [release("a", 2)]},
        {"step": 3, "ops": [release("b", 1)]},
    ]
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(table(steps), keep_going=True)
    assert [f.step for f in report.findings] == [1, 3]
    assert [f.step for f in render.until(report, 1).findings] == [1]
    assert render.until(report, 1).counts == {"double_free": 1}
    assert [f.step for f in render.until(report, 3).findings] == [1, 3]
    assert render.until(report, 0).findings == []
