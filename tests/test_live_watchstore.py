"""What `watch --db` keeps (live/watchstore.py): one step log, never replacing one, every
other said; the lines read up to one that cannot be read; and, under a second SIGINT while
the step log is stored (a real signal to a real process), every event committed stays and
the message says exactly what was stored."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

import pagedkv_sql
from pagedkv_sql.errors import UsageError
from pagedkv_sql.live.watch import Watch, WatchOptions, WatchSummary, summary_text
from pagedkv_sql.live.watchstore import Signals

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
    # counted by the idea, as replay's summary and the finding lines name it
    assert "1 finding(s): use_after_free 1\n" in summary_text(summary) + "\n"
    assert summary.to_dict()["invariants"] == {"use_after_free": 1}
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
    # the second SIGINT lands before the store begins or during it (which, the machine's load
    # decides): either is said, and in both the step log is said checked, not stored
    for attempt, gap in enumerate((0.0, 0.1)):
        db = tmp_path / f"w{attempt}.duckdb"
        proc = cli(["watch", "-F", str(events), str(big), "--db", str(db)], tmp_path, tmp_path)
        deadline = time.monotonic() + 300
        while _spooled(tmp_path) < big.stat().st_size:  # every line checked: the watch idles
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # the watch ends: events committed, the log stored...
        _wait_closed(proc, events)  # the watch saw it: the next one is a second, not the same
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
        why = (
            "stopped by a second SIGINT"
            if "stopped by" in err
            else "interrupted while it was stored"
        )
        assert err.splitlines()[-3:] == [
            f"--db: the step log of {big} (6001 line(s)) was checked, not stored: {why}",
            f"stored 50 event row(s) in {db} (engine_kv_event)",
            "Error: interrupted (SIGINT) while the watch stored what it watched: the step "
            f"log was not stored (said above); the 50 event row(s) stored in {db} stay",
        ]  # fmt: skip
        assert not _spooled(tmp_path)  # no spool left behind


def _wait_closed(proc: Any, path: Path) -> None:
    """Until ``proc`` no longer holds ``path`` open (a followed source closes it at a stop)."""
    fds = Path(f"/proc/{proc.pid}/fd")
    deadline = time.monotonic() + 60
    while True:
        held = False
        for fd in fds.iterdir():
            with contextlib.suppress(OSError):
                held = held or os.readlink(fd) == str(path)
        if not held:
            return
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.005)


@pytest.mark.parametrize(
    ("when", "stored"),
    [("inside a statement", False), ("between statements", False), ("after the COMMIT", True)],
)
def test_a_signal_that_stops_the_step_logs_store_is_said_by_what_the_database_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str, stored: bool
) -> None:
    # the moment a signal lands, held still: DuckDB's "Query interrupted" from a result
    # fetched (a RuntimeError), a KeyboardInterrupt before the store's COMMIT, or one after it
    # and before the store returned
    from pagedkv_sql.live import watchstore

    def storing(self: Any) -> Iterator[None]:
        if when == "inside a statement":
            raise RuntimeError("Query interrupted")
        if when == "between statements":
            raise KeyboardInterrupt
        yield
        self.late("SIGINT")
        raise KeyboardInterrupt

    monkeypatch.setattr(watchstore.Signals, "storing", contextlib.contextmanager(storing))
    log = _log(tmp_path / "a.jsonl", 5)
    summary, notes = _watch(tmp_path / "w.duckdb", [str(log)])
    assert summary.stored is not None
    if stored:
        assert summary.stored.log == f"the step log of {log} (6 line(s))"
        assert summary.stored.not_stored == [] and summary.stored.interrupted == "SIGINT"
        assert _stored_steps(tmp_path / "w.duckdb") == 5
    else:
        line = f"the step log of {log} (6 line(s)) was checked, not stored: interrupted while it"
        line += " was stored"
        assert summary.stored.log is None and summary.stored.not_stored == [line]
        assert f"--db: {line}" in notes
        con = duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True)
        tables = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        con.close()
        assert "replay_log" not in tables


def test_a_second_signal_before_the_watch_saw_the_first_still_counts_as_second() -> None:
    # two signals back to back: the second must not be taken for the first again (the end
    # would then store everything, uninterrupted)
    seen: list[str] = []
    signals = Signals(lambda n: seen.append(f"first {n}"), lambda n: seen.append(f"late {n}"))
    signals.install()
    try:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
    finally:
        signals.restore()
    assert seen == ["first SIGINT", "late SIGTERM"]


def _spooled(directory: Path) -> int:
    """The bytes of the step log spooled (checked) so far; 0 when no spool is left."""
    return sum(p.stat().st_size for p in directory.glob(".pagedkv-watch-*/*"))
