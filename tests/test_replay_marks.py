"""A recorder's marks in a step log (pagedkv_sql/replay/marks.py): a gap or a stop ends what
replay reads; the steps before it are checked, the mark is reported (text, JSON), kept with
the stored log and its event table, and a bad mark is refused naming its line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql.errors import InputError
from pagedkv_sql.replay import read_log, stored_events, write_events
from pagedkv_sql.replay.marks import mark_of

from .helpers import Cli
from .steplogs import BASE, HEADER, alloc, append

GAP = {"gap": 17, "after_step": 2}
STOPPED = {"stopped": "cannot write /logs/vllm-7.jsonl: No space left on device", "after_step": 2}
# after the mark: a step naming a request whose allocation was dropped (would be refused)
AFTER = [{"step": 20, "ops": [append("zz", 4)]}, {"step": 21, "ops": [alloc("b", 5)]}]


def write(path: Path, *objs: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return path


@pytest.mark.parametrize("mark", [GAP, STOPPED])
def test_a_mark_ends_what_is_read_and_the_steps_before_it_are_checked(
    tmp_path: Path, mark: dict[str, Any]
) -> None:
    log = write(tmp_path / "run.jsonl", HEADER, *BASE, mark, *AFTER)
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(log)
    assert report.ok and report.steps == 3
    assert report.mark is not None
    assert (report.mark.kind, report.mark.after_step, report.mark.lines_after) == (
        next(iter(mark)),
        2,
        2,
    )
    assert report.to_dict()["mark"] == report.mark.to_dict()


def test_the_text_report_says_where_the_log_stops_being_checked(cli: Cli) -> None:
    write(cli.cwd / "gap.jsonl", HEADER, *BASE, GAP, *AFTER)
    gap: Any = cli("replay", "gap.jsonl")
    assert gap.exit_code == 0, gap.stderr
    assert gap.stdout.splitlines() == [
        "replayed 3 step(s), 12 event(s), 2 request(s)",
        "the log has a gap after step 2: the recorder dropped 17 step line(s) (its writer fell "
        "behind); checked up to the gap; the 2 line(s) after it are not checked",
        "no invariant broken",
    ]
    write(cli.cwd / "stop.jsonl", HEADER, {**STOPPED, "after_step": None})
    stop: Any = cli("replay", "stop.jsonl", "-f", "json")
    assert json.loads(stop.stdout)["mark"] == {
        "kind": "stopped",
        "after_step": None,
        "dropped": None,
        "reason": STOPPED["stopped"],
        "lines_after": 0,
    }
    text: Any = cli("replay", "stop.jsonl")
    assert text.stdout.splitlines()[1] == (
        "the log stops before its first step: the recorder stopped (cannot write "
        "/logs/vllm-7.jsonl: No space left on device)"
    )


def test_findings_before_the_mark_are_found_and_nothing_after_it_is_read(cli: Cli) -> None:
    bad = {"step": 3, "ops": [alloc("c", 2)]}  # block 2 is a's: fresh_while_held
    stopped = {**STOPPED, "after_step": 3}
    write(cli.cwd / "run.jsonl", HEADER, *BASE, bad, stopped, "not even JSON")  # type: ignore[arg-type]
    result: Any = cli("replay", "run.jsonl")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[1].startswith("the log stops after step 3: the recorder stopped")
    assert lines[1].endswith("; the 1 line(s) after it are not checked")
    assert lines[2].startswith("step 3: use_after_free: block 2 handed to request c")


def test_the_mark_stays_with_the_stored_log_and_its_event_table(tmp_path: Path) -> None:
    log = write(tmp_path / "run.jsonl", HEADER, *BASE, GAP, *AFTER)
    with pagedkv_sql.connect(tmp_path / "r.duckdb") as db:
        first = db.replay(log).mark
        assert db.replay().mark == first  # read back from the database
        events = tmp_path / "events.parquet"
        write_events(stored_events(db), events)
    assert mark_of(read_log(events).schema.metadata, "t") == first
    with pagedkv_sql.connect(":memory:") as db:
        assert db.replay(events).mark == first  # DuckDB scans the Parquet file in place
        arrow = tmp_path / "events.arrow"
        write_events(read_log(log), arrow)
        assert db.replay(arrow).mark == first


@pytest.mark.parametrize(
    ("mark", "why"),
    [
        ({"gap": -1, "after_step": 2}, "mark 'gap' must not be negative"),
        ({"gap": 1, "stopped": "x"}, "one of 'gap' (a count) or 'stopped'"),
        ({"stopped": 5, "after_step": 2}, "mark 'stopped' must be a string"),
        ({"stopped": "x", "after": 2}, "found keys ['after', 'stopped']"),
    ],
)
def test_a_bad_mark_is_refused_naming_its_line(
    tmp_path: Path, mark: dict[str, Any], why: str
) -> None:
    log = write(tmp_path / "run.jsonl", HEADER, *BASE, mark)
    with pytest.raises(InputError) as e:
        read_log(log)
    (problem,) = e.value.problems
    assert problem.line == 5 and why in problem.message, problem


def test_the_published_schema_takes_marks_and_refuses_bad_ones() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    from importlib import resources

    text = (resources.files("pagedkv_sql.replay") / "step-log.schema.json").read_text()
    check = jsonschema.Draft202012Validator(json.loads(text))
    for good in (GAP, STOPPED, {"stopped": "x", "after_step": None}, {"gap": 3}):
        check.validate(good)
    for bad in ({"gap": -1}, {"gap": 1, "stopped": "x"}, {"stopped": 5}, {"stopped": "x", "a": 1}):
        assert not check.is_valid(bad), bad


def test_watch_says_a_mark_once_and_checks_up_to_it(cli: Cli) -> None:
    write(cli.cwd / "gap.jsonl", HEADER, *BASE, GAP, *AFTER)
    result: Any = cli("watch", "gap.jsonl")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.count("gap.jsonl:5: the log has a gap after step 2") == 1, result.stderr
    assert "0 finding(s)" in result.stdout


def test_a_last_line_cut_off_while_written_ends_the_log_there(cli: Cli) -> None:
    """What a recorder leaves on a full disk: the steps before the torn line are checked
    (a finding among them found), and the cut is said as a recorder's stop; a torn line
    that is not the last, or that ends with its newline, is an error of its line."""
    bad = {"step": 3, "ops": [alloc("c", 2)]}  # block 2 is a's: fresh_while_held
    log = write(cli.cwd / "run.jsonl", HEADER, *BASE, bad)
    with log.open("a") as f:
        f.write('{"step": 4, "ops": [{"op": "allo')
    result: Any = cli("replay", "run.jsonl")
    assert result.exit_code == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("the log stops after step 3: the recorder stopped (its last ")
    assert "cut off while written" in lines[1]
    assert lines[2].startswith("step 3: use_after_free: block 2 handed to request c")
    with log.open("a") as f:
        f.write("\n")  # the same line, ended: a line of the log that is no JSON
    ended: Any = cli("replay", "run.jsonl", "--db", "other.duckdb")
    assert ended.exit_code == 1
    assert "line(s) of the step log cannot be read; nothing was loaded" in ended.stderr
    assert not (cli.cwd / "other.duckdb").exists()
