"""What `watch --db` keeps (live/watchstore.py): one step log, never replacing one, every
other said; the lines read up to one that cannot be read; and, under a second SIGINT while
the step log is stored (a real signal to a real process), every event committed stays and
the message says exactly what was stored."""

from __future__ import annotations

import io
import json
import signal
import time
from pathlib import Path

import duckdb
import pytest

import pagedkv_sql
from pagedkv_sql.errors import UsageError
from pagedkv_sql.live.watch import Watch, WatchOptions, WatchSummary

from .faults import cli, no_strays, step_log

HEADER = {"pagedkv_step_log": 1, "block_size": 4, "num_gpu_blocks": 16, "reserved_blocks": [0]}


def _log(path: Path, steps: int, fault: bool = False) -> Path:
    lines = [json.dumps(HEADER)]
    for n in range(steps):
        ops = [{"op": "allocate", "req": f"r{n}", "blocks": [1 + n % 8]}]
        if n:
            ops.insert(0, {"op": "free", "req": f"r{n - 1}"})
        lines.append(json.dumps({"step": n, "ops": ops}))
    if fault:  # r(steps-1) holds block 1 + (steps-1) % 8; a fresh allocation of it
        lines.append(json.dumps({"step": steps, "ops": [
            {"op": "allocate", "req": "x", "blocks": [1 + (steps - 1) % 8]}]}))  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def _watch(db_path: Path, sources: list[str], stdin: bytes = b"") -> tuple[WatchSummary, list[str]]:
    notes: list[str] = []
    with pagedkv_sql.connect(str(db_path)) as db:
        summary = Watch(
            WatchOptions(sources, duration=120), io.StringIO(), notes.append, db=db,
            stdin=io.BytesIO(stdin),
        ).run()  # fmt: skip
    return summary, notes


def _stored_steps(db_path: Path) -> int:
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        return int(con.execute("SELECT steps FROM replay_log").fetchall()[0][0])
    finally:
        con.close()


def test_two_step_log_files_or_one_beside_a_stored_log_are_refused_before_anything(
    tmp_path: Path,
) -> None:
    a, b = _log(tmp_path / "a.jsonl", 5), _log(tmp_path / "b.jsonl", 5)
    db = tmp_path / "w.duckdb"
    with pytest.raises(UsageError, match=r"--db stores one step log, and 2 sources are step logs"):
        _watch(db, [str(a), str(b)])
    with pagedkv_sql.connect(str(db)) as d:
        d.replay(str(a))
    before = db.read_bytes()
    with pytest.raises(UsageError, match="holds a step log already; watch --db never replaces"):
        _watch(db, [str(b)])
    assert _stored_steps(db) == 5 and db.read_bytes() == before


def test_one_step_log_is_stored_and_another_met_later_is_checked_and_said_not_stored(
    tmp_path: Path,
) -> None:
    a = _log(tmp_path / "a.jsonl", 7)
    other = _log(tmp_path / "b.jsonl", 3, fault=True).read_bytes()
    summary, notes = _watch(tmp_path / "w.duckdb", [str(a), "-"], stdin=other)
    assert summary.findings == {"fresh_while_held": 1}  # the second log is checked
    assert summary.stored is not None
    stored = summary.stored
    logs = {stored.log} | set(stored.not_stored)
    first, second = (
        (str(a), "<stdin>") if stored.log and str(a) in stored.log else ("<stdin>", str(a))
    )
    assert stored.log == f"the step log of {first} ({8 if first == str(a) else 5} line(s))"
    assert stored.not_stored == [
        f"the step log of {second} ({5 if second == '<stdin>' else 8} line(s)) was checked, "
        "not stored: the database holds one step log"
    ]
    assert len(logs) == 2 and summary.problems == 1
    assert any(n.startswith("--db: the step log of") for n in notes)
    assert _stored_steps(tmp_path / "w.duckdb") == (7 if first == str(a) else 4)
    no_strays(tmp_path, {"a.jsonl", "b.jsonl", "w.duckdb"})


def test_a_step_log_cut_off_is_stored_up_to_its_unreadable_line(tmp_path: Path) -> None:
    log = _log(tmp_path / "cut.jsonl", 6)
    with log.open("ab") as f:
        f.write(b'{"step": 6, "ops": [{"op": "allo')
    summary, _ = _watch(tmp_path / "w.duckdb", [str(log)])
    assert summary.problems == 1
    assert summary.stored is not None
    assert summary.stored.log == (
        f"the step log of {log} (7 line(s)) (up to {log}:8, which cannot be read)"
    )
    assert _stored_steps(tmp_path / "w.duckdb") == 6


def test_a_second_sigint_while_the_step_log_is_stored_keeps_what_was_committed(
    tmp_path: Path,
) -> None:
    big = step_log(tmp_path / "big.jsonl", 6000)
    events = tmp_path / "ev.jsonl"
    events.write_text(
        "".join(json.dumps({"event_id": i, "data": {"type": "created"}}) + "\n" for i in range(50))
    )
    for attempt, gap in enumerate((0.05, 0.3)):
        db = tmp_path / f"w{attempt}.duckdb"
        proc = cli(["watch", "-F", str(events), str(big), "--db", str(db)], tmp_path, tmp_path)
        deadline = time.monotonic() + 300
        while _spooled(tmp_path) < big.stat().st_size:  # every line checked: the watch idles
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        time.sleep(1)
        proc.send_signal(signal.SIGINT)  # the watch ends: events committed, the log stored...
        time.sleep(gap)
        proc.send_signal(signal.SIGINT)  # ... which this one stops
        _, err = proc.communicate(timeout=300)
        assert "Traceback" not in err, err
        con = duckdb.connect(str(db), read_only=True)
        rows = con.execute("SELECT count(*) FROM engine_kv_event").fetchall()[0][0]
        tables = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        con.close()
        assert rows == 50 and "replay_log" not in tables, err  # what was committed stays
        assert proc.returncode == 130, err
        assert err.splitlines()[-3:] == [
            f"--db: the step log of {big} (6001 line(s)) was checked, not stored: "
            + ("stopped by a second SIGINT" if "stopped by" in err else
               "interrupted while it was stored"),
            f"stored 50 event row(s) in {db} (engine_kv_event)",
            "Error: interrupted (SIGINT) while the watch stored what it watched: the step "
            f"log was not stored (said above); the 50 event row(s) stored in {db} stay",
        ]  # fmt: skip
        assert not _spooled(tmp_path)  # no spool left behind


def _spooled(directory: Path) -> int:
    """The bytes of the step log spooled (checked) so far; 0 when no spool is left."""
    return sum(p.stat().st_size for p in directory.glob(".pagedkv-watch-*/*"))
