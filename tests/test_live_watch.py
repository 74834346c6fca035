"""`watch` against real ZeroMQ sockets on 127.0.0.1: a synthetic publisher that
speaks vLLM's wire protocol (PUB frames and the ROUTER replay), bounded in count and time;
planted faults found live, naming their source and event; step logs followed like tail -F."""

from __future__ import annotations

import io
import json
import os
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

import pagedkv_sql
from pagedkv_sql.live.publisher import AllBlocksCleared, BlockRemoved, BlockStored, Publisher
from pagedkv_sql.live.watch import Watch, WatchOptions, WatchSummary

pytest.importorskip("zmq")
# every bound on time below is a guard against a hang, never a figure a test checks
GUARD_S = 120


def S(h: int, parent: int | None = None) -> BlockStored:
    return BlockStored([h], parent, list(range(16)), 16, None, "GPU", None)


def R(h: int) -> BlockRemoved:
    return BlockRemoved([h], "GPU")


class Run:
    def __init__(self, opts: WatchOptions, db: Any = None, stdin: Any = None) -> None:
        self.out = io.StringIO()
        self.notes: list[str] = []
        self.watch = Watch(opts, self.out, self.notes.append, db=db, stdin=stdin)
        self.summary: WatchSummary | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.summary = self.watch.run()
        except BaseException as e:
            self.error = e

    def start(self) -> Run:
        self.thread.start()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not self.watch.sources:
            time.sleep(0.01)
        for s in self.watch.sources:
            ready = getattr(s, "ready", None)
            if ready is not None:
                ready.wait(5)
        time.sleep(0.3)  # the SUB socket's subscription reaches the publisher
        return self

    def wait_for(self, pred: Callable[[], bool], timeout: float = GUARD_S) -> None:
        """Wait until ``pred()`` holds; fail if the watch ends first, or after ``timeout``
        (a hang guard, not a timing: a step log's check is a replay in DuckDB, seconds on a
        loaded machine, and the next one waits twice as long as the last took)."""
        deadline = time.monotonic() + timeout
        while not pred():
            if not self.thread.is_alive():
                assert pred(), "the watch ended first"
                return
            assert time.monotonic() < deadline, f"not reached in {timeout} s"
            time.sleep(0.01)

    def stop(self) -> WatchSummary:
        self.watch.stop.set()
        self.thread.join(10)
        if self.error is not None:
            raise self.error
        assert self.summary is not None
        return self.summary

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.getvalue().splitlines() if line]

    def findings(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if r["type"] == "finding"]


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    pub = Publisher()
    yield pub
    pub.close()


def _opts(pub: Publisher, **kw: Any) -> WatchOptions:
    replay = [pub.replay_endpoint] if pub.replay_endpoint else []
    base: dict[str, Any] = {"replay_endpoints": replay, "fmt": "jsonl", "duration": GUARD_S}
    return WatchOptions([pub.endpoint], **{**base, **kw})


def _published(run: Run, n: int) -> None:
    run.wait_for(lambda: run.watch.checker.batches >= n)


def test_a_clean_stream_is_clean(publisher: Publisher) -> None:
    run = Run(_opts(publisher)).start()
    for i in range(1, 201):
        publisher.publish([S(i, i - 1 if i > 1 else None)])
        if i % 3 == 0:
            publisher.publish([R(i - 1)])
    _published(run, 266)
    summary = run.stop()
    assert summary.total == 0 and summary.batches == 266 and summary.gaps == 0
    assert run.findings() == []


def test_planted_faults_are_found_live_naming_source_and_event(publisher: Publisher) -> None:
    run = Run(_opts(publisher)).start()
    publisher.publish([S(1), S(2, 1)])  # seq 0
    publisher.publish([R(99)])  # seq 1: removal of an unknown hash
    run.wait_for(lambda: len(run.findings()) == 1)
    (first,) = run.findings()  # found before anything else is published
    assert first["check"] == "unknown_removal" and first["source"] == publisher.endpoint
    assert first["seq"] == 1 and first["position"] == 2
    assert first["where"] == f"{publisher.endpoint}#1"
    publisher.publish([R(2)], send=False)  # seq 2: lost on the wire, kept for replay
    publisher.publish([S(5)])  # seq 3
    publisher.publish([S(3)], send=False, keep=False)  # seq 4: gone for good
    publisher.publish([AllBlocksCleared()])  # seq 5
    publisher.publish([S(4, 1)])  # seq 6: parent dropped by the clear
    _published(run, 6)
    summary = run.stop()
    assert [(f["check"], f["seq"]) for f in run.findings()] == [
        ("unknown_removal", 1),
        ("sequence_gap", 5),
        ("after_clear", 6),
    ]
    gap = run.findings()[1]
    assert "sequence number 5 follows 3" in gap["message"]
    notes = [r["message"] for r in run.records() if r["type"] == "note"]
    assert any("replay of 2..2" in n and "1 recovered" in n for n in notes)
    assert any("replay of 4..4" in n and "1 no longer kept" in n for n in notes)
    assert summary.batches == 6 and summary.findings == {
        "unknown_removal": 1,
        "sequence_gap": 1,
        "after_clear": 1,
    }


def test_a_gap_without_a_replay_endpoint_is_a_finding() -> None:
    pub = Publisher(replay=False)
    try:
        run = Run(_opts(pub)).start()
        pub.publish([S(1)])
        pub.publish([S(2)], send=False)
        pub.publish([R(1)])
        _published(run, 2)
        run.stop()
        assert [(f["check"], f["seq"]) for f in run.findings()] == [("sequence_gap", 2)]
    finally:
        pub.close()


def test_joining_late_replays_from_the_start_and_finds_nothing_false(publisher: Publisher) -> None:
    for i in range(1, 6):
        publisher.publish([S(i)])  # before any subscriber: only the replay buffer has them
    run = Run(_opts(publisher)).start()
    for i in range(1, 6):
        publisher.publish([R(i)])  # removals of what was stored before the watch started
    _published(run, 10)
    run.stop()
    assert run.findings() == []
    assert any(": 0..4 read" in r["message"] for r in run.records() if r["type"] == "note")


def test_joining_late_without_replay_does_not_guess(publisher: Publisher) -> None:
    pub = Publisher(replay=False)
    try:
        for i in range(1, 6):
            pub.publish([S(i)])
        run = Run(_opts(pub)).start()
        for i in range(1, 6):
            pub.publish([R(i)])
        pub.publish([AllBlocksCleared()])
        pub.publish([R(77)])  # after a clear the state is known: a finding again
        _published(run, 7)
        summary = run.stop()
        assert [f["message"] for f in run.findings()] == ["BlockRemoved of 77, which is not stored"]
        assert summary.unverifiable == 5
    finally:
        pub.close()


def test_a_restarted_publisher_starts_a_new_cache(publisher: Publisher) -> None:
    run = Run(_opts(publisher)).start()
    publisher.publish([S(1)])
    publisher.publish([S(2)])
    _published(run, 2)
    publisher.seq = 0  # the engine came back: numbering starts again, the cache is empty
    publisher.publish([S(5)])
    publisher.publish([R(5)])
    _published(run, 4)
    run.stop()
    assert run.findings() == []
    assert any("started again" in r["message"] for r in run.records() if r["type"] == "note")


def test_two_data_parallel_ranks_each_finding_names_its_source() -> None:
    a, b = Publisher(), Publisher()
    try:
        opts = WatchOptions(
            [a.endpoint, b.endpoint],
            replay_endpoints=[str(a.replay_endpoint), str(b.replay_endpoint)],
            fmt="jsonl",
            duration=GUARD_S,
        )
        run = Run(opts).start()
        a.publish([S(1)], rank=0)
        b.publish([S(1)], rank=1)
        a.publish([R(1)], rank=0)
        b.publish([R(1), R(1)], rank=1)  # rank 1 removes twice
        _published(run, 4)
        run.stop()
        (f,) = run.findings()
        assert (f["source"], f["stream"], f["check"]) == (b.endpoint, "dp 1", "unknown_removal")
    finally:
        a.close()
        b.close()


def test_a_message_that_is_not_msgpack_is_named_and_the_watch_goes_on(
    publisher: Publisher,
) -> None:
    run = Run(_opts(publisher)).start()
    publisher.publish([S(1)])
    publisher.publish_raw([b"", (1).to_bytes(8, "big"), b"\xc1"])
    publisher.publish_raw([b"", (2).to_bytes(8, "big"), b"\x91" * 100_000])
    publisher.publish_raw([b"", b"\x01" * 3000, b""])
    publisher.seq = 3
    publisher.publish([R(1)])
    _published(run, 2)
    run.wait_for(lambda: run.watch.problems >= 3)  # each said before the watch stops
    summary = run.stop()
    problems = [r["message"] for r in run.records() if r["type"] == "problem"]
    assert len(problems) == 3 and summary.problems == 3
    assert problems[0].startswith("seq 1: not msgpack")
    assert "8 bytes, not 3000" in problems[2]
    assert run.findings() == []


def test_exit_on_finding_stops_at_the_first(publisher: Publisher) -> None:
    run = Run(_opts(publisher, exit_on_finding=True)).start()
    publisher.publish([R(1)])
    run.thread.join(10)
    assert run.summary is not None and run.summary.stopped_by == "finding"
    publisher.publish([R(2)])
    assert len(run.findings()) == 1


def test_metrics_are_served_for_prometheus(publisher: Publisher) -> None:
    run = Run(_opts(publisher, metrics_port=0)).start()
    publisher.publish([S(1), S(2)])
    publisher.publish([R(9)])
    _published(run, 2)
    port = run.watch.metrics.port
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    run.stop()
    src = publisher.endpoint
    assert f'pagedkv_watch_events_total{{source="{src}"}} 3.0' in text
    assert f'pagedkv_watch_batches_total{{source="{src}"}} 2.0' in text
    assert f'pagedkv_watch_findings_total{{invariant="unknown_removal",source="{src}"}} 1.0' in text
    assert "pagedkv_watch_lag_seconds" in text


def test_what_was_watched_is_committed_to_the_database(
    publisher: Publisher, tmp_path: Path
) -> None:
    db = pagedkv_sql.connect(tmp_path / "w.duckdb")
    run = Run(_opts(publisher), db=db).start()
    publisher.publish([S(1), S(2, 1)])
    publisher.publish([R(2)])
    _published(run, 2)
    run.stop()
    db.close()
    back = duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True)
    rows = back.sql(
        "SELECT seq, event, kind, block_hash, parent_hash FROM engine_kv_event ORDER BY event"
    ).fetchall()
    assert rows == [
        (0, 0, "stored", "1", None),
        (0, 1, "stored", "2", "1"),
        (1, 2, "removed", "2", None),
    ]


# -- stdin and files, step logs followed --------------------------------------------------
def test_stdin_is_a_source() -> None:
    import msgspec

    data = b"".join(
        msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": [h]}], 0])
        for h in (1, 2)
    )
    run = Run(WatchOptions(["-"], fmt="jsonl", duration=GUARD_S), stdin=io.BytesIO(data))
    run.thread.start()
    run.thread.join(10)
    assert run.summary is not None and run.summary.stopped_by == "end of input"
    assert [f["where"] for f in run.findings()] == ["<stdin>@0", f"<stdin>@{len(data) // 2}"]


def _notes(run: Run) -> list[str]:
    return [r["message"] for r in run.records() if r["type"] == "note"]


def _step(n: int, ops: list[dict[str, Any]]) -> str:
    return json.dumps({"step": n, "ops": ops}) + "\n"


def test_a_growing_step_log_is_checked_as_it_grows_through_rotation_and_truncation(
    tmp_path: Path,
) -> None:
    log = tmp_path / "steps.jsonl"
    log.write_text(_step(0, [{"op": "allocate", "req": "a", "blocks": [1]}]))
    run = Run(WatchOptions([str(log)], follow=True, fmt="jsonl", duration=GUARD_S))
    run.thread.start()
    run.wait_for(lambda: run.watch.steplogs.get(str(log)) is not None)
    with log.open("a") as f:  # a fresh allocation of a held block: fresh_while_held
        f.write(_step(1, [{"op": "allocate", "req": "b", "blocks": [1]}]))
    run.wait_for(lambda: len(run.findings()) == 1)
    assert [(f["check"], f["step"]) for f in run.findings()] == [("fresh_while_held", 1)]
    os.rename(log, tmp_path / "steps.jsonl.1")  # rotated: a new file at the path
    log.write_text(_step(0, [{"op": "allocate", "req": "c", "blocks": [2]}]))
    run.wait_for(lambda: any("replaced" in n for n in _notes(run)))
    # the note comes before the new file is read: wait for its line too
    run.wait_for(lambda: sum(x.lines for x in run.watch.steplogs.values()) == 3)
    summary = run.stop()
    assert summary.step_lines == 3
    assert any("replaced" in n for n in _notes(run))


def test_a_truncated_step_log_is_read_again_from_the_start(tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    log.write_text(_step(0, [{"op": "allocate", "req": "a", "blocks": [1]}]) * 1)
    run = Run(WatchOptions([str(log)], follow=True, fmt="jsonl", duration=GUARD_S))
    run.thread.start()
    run.wait_for(lambda: run.watch.steplogs.get(str(log)) is not None)
    log.write_text("")
    run.wait_for(lambda: any("truncated" in n for n in _notes(run)))
    run.stop()
    assert any("truncated" in n for n in _notes(run))


def test_a_growing_file_of_json_events_is_followed(tmp_path: Path) -> None:
    def ev(n: int, data: Any) -> str:
        return json.dumps({"worker_id": 3, "event": {"event_id": n, "data": data}}) + "\n"

    path = tmp_path / "events.jsonl"
    stored = {"stored": {"parent_hash": None, "blocks": [{"block_hash": 5}]}}
    path.write_text(ev(0, stored))
    run = Run(WatchOptions([str(path)], follow=True, fmt="jsonl", duration=GUARD_S))
    run.thread.start()
    run.wait_for(lambda: run.watch.checker.batches == 1)
    with path.open("a") as f:
        f.write(ev(1, {"removed": {"block_hashes": [5]}}))
        f.write(ev(2, {"removed": {"block_hashes": [5]}}))  # twice
        f.write('{"worker_id": 3, "event": {"event_id": 3.0, "data": "cleared"}}\n')
        f.write(ev(4, "cleared"))
    run.wait_for(lambda: run.watch.checker.batches == 4)
    summary = run.stop()
    assert [(f["check"], f["where"]) for f in run.findings()] == [
        ("unknown_removal", f"{path}:3"),
        ("sequence_gap", f"{path}:5"),  # line 4's event number is refused, so 3 is missing
    ]
    problems = [r["message"] for r in run.records() if r["type"] == "problem"]
    assert problems == [f"{path}:4: Expected `int`, got `float` - at `$.event_id`"]
    assert summary.problems == 1


def test_a_followed_json_event_naming_a_key_twice_is_a_problem_not_its_last_value(
    tmp_path: Path,
) -> None:
    # a followed file (live/sources.py) refuses a key named twice: event 1 is never dropped for
    # event 2
    path = tmp_path / "events.jsonl"
    path.write_text(
        '{"worker_id": 3, "event": {"event_id": 0, "data": "cleared"}}\n'
        '{"worker_id": 3, "event": {"event_id": 1, "data": "cleared"},'
        ' "event": {"event_id": 2, "data": "cleared"}}\n'
    )
    run = Run(WatchOptions([str(path)], follow=True, fmt="jsonl", duration=20))
    run.thread.start()
    run.wait_for(lambda: any(r["type"] == "problem" for r in run.records()))
    summary = run.stop()
    problems = [r["message"] for r in run.records() if r["type"] == "problem"]
    assert problems == [
        f"{path}:2: duplicate key 'event' in one object (JSON would keep only the last one)"
    ]
    assert summary.problems == 1 and run.watch.checker.batches == 1
