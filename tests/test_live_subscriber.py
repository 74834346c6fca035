"""`watch`'s ZeroMQ source against real sockets on 127.0.0.1 (live/subscriber.py): a watch
of flooding publishers stops at once; a frame over the bound is refused by ZeroMQ, counted,
named, and the source reads on; a replay socket that answers without end is read within
its bounds; a publisher nothing connects to is said, then a problem."""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import pytest

from pagedkv_sql.live import sources, subscriber
from pagedkv_sql.live.publisher import BlockStored, Publisher
from pagedkv_sql.live.watch import Watch, WatchOptions, WatchSummary

zmq = pytest.importorskip("zmq")
GUARD_S = 120  # a hang guard, never a figure a test checks


def S(h: int) -> BlockStored:
    return BlockStored([h], None, list(range(16)), 16, None, "GPU", None)


class Running:
    """A watch in a thread of its own, stopped as a signal would stop it."""

    def __init__(self, opts: WatchOptions) -> None:
        self.out = io.StringIO()
        self.notes: list[str] = []
        self.watch = Watch(opts, self.out, self.notes.append)
        self.summary: WatchSummary | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.summary = self.watch.run()

    def wait_for(self, pred: Any) -> None:
        deadline = time.monotonic() + GUARD_S
        while not pred():
            assert self.thread.is_alive() and time.monotonic() < deadline, self.notes
            time.sleep(0.01)

    def stop(self) -> WatchSummary:
        self.watch.stop.set()
        self.thread.join(GUARD_S)
        assert self.summary is not None
        return self.summary


def test_a_watch_of_four_flooding_publishers_stops_at_once() -> None:
    pubs = [Publisher(replay=False) for _ in range(4)]
    done = threading.Event()

    def flood(pub: Publisher) -> None:
        h = 0
        while not done.is_set():
            pub.publish([S(h)], keep=False)
            h += 1

    floods = [threading.Thread(target=flood, args=(p,), daemon=True) for p in pubs]
    run = Running(WatchOptions([p.endpoint for p in pubs], duration=GUARD_S))
    try:
        for t in floods:
            t.start()
        run.wait_for(lambda: run.watch.checker.batches > 10_000)
        asked = time.monotonic()
        summary = run.stop()
        took = time.monotonic() - asked
    finally:
        done.set()
        for t in floods:
            t.join(GUARD_S)
        for p in pubs:
            p.close()
    assert summary.stopped_by == "stopped" and summary.total == 0
    assert not any(s.is_alive() for s in run.watch.sources)
    # a generous bound against a hang (bench/live.py gives the figure: well under 1 s)
    assert took < 30, took


def test_a_frame_over_the_bound_is_refused_named_and_the_source_reads_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(subscriber, "MAX_MESSAGE_BYTES", 4096)
    pub = Publisher(replay=False)
    run = Running(WatchOptions([pub.endpoint], duration=GUARD_S, fmt="jsonl"))
    try:
        source = run.watch.sources
        run.wait_for(lambda: source and source[0].connected)  # type: ignore[attr-defined]
        pub.wait_for_subscriber()
        pub.publish([S(1)])
        run.wait_for(lambda: run.watch.checker.batches == 1)
        pub.publish_raw([b"", (1).to_bytes(8, "big"), b"\x00" * 100_000])
        run.wait_for(lambda: run.watch.problems == 1)

        def reconnected() -> bool:  # the publisher's batches arrive again
            pub.publish([S(100 + pub.seq)])
            time.sleep(0.05)
            return run.watch.checker.batches > 1

        run.wait_for(reconnected)
        summary = run.stop()
    finally:
        pub.close()
    assert run.watch.sources[0].refused == 1  # type: ignore[attr-defined]
    assert summary.problems == 1
    assert [n for n in summary.notes if "refused" in n] == [
        f"{pub.endpoint}: a message over 4,096 bytes (or not ZeroMQ's protocol) was refused and "
        "dropped the connection; connecting again (what it held is a gap)"
    ]


def test_a_replay_socket_answering_without_end_is_read_within_its_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(subscriber, "REPLAY_MAX_BYTES", 1 << 20)
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    pub = Publisher(replay=False)
    stop = threading.Event()

    def answer_without_end() -> None:
        while not stop.is_set():
            if router.poll(50):
                client, _, _ = router.recv_multipart()
                seq = 0
                while not stop.is_set():  # never the end (-1)
                    frames = [client, b"", b"", seq.to_bytes(8, "big"), b"\x90" * 65536]
                    try:
                        router.send_multipart(frames, zmq.NOBLOCK)
                    except zmq.Again:
                        time.sleep(0.001)
                    seq += 1

    server = threading.Thread(target=answer_without_end, daemon=True)
    server.start()
    opts = WatchOptions(
        [pub.endpoint], replay_endpoints=[f"zmq://127.0.0.1:{port}"], duration=GUARD_S
    )
    run = Running(opts)
    try:
        run.wait_for(lambda: any("passed" in n for n in run.notes))
        summary = run.stop()
    finally:
        stop.set()
        server.join(GUARD_S)
        router.close(0)
        pub.close()
    assert (
        f"{pub.endpoint}: replay from tcp://127.0.0.1:{port} passed 1,048,576 bytes; the rest "
        "is not read" in summary.notes
    )


def test_a_publisher_nothing_connects_to_is_said_then_a_problem(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(subscriber, "QUIET_NOTE_S", 0.2)
    monkeypatch.setattr(sources, "QUIET_NOTE_S", 0.2)
    s = zmq.Context.instance().socket(zmq.PUB)
    port = s.bind_to_random_port("tcp://127.0.0.1")
    s.close(0)  # a port nothing listens on
    endpoint = f"zmq://127.0.0.1:{port}"
    run = Running(WatchOptions([endpoint], duration=GUARD_S))
    run.wait_for(lambda: len(run.notes) == 1)
    summary = run.stop()
    assert summary.notes == [
        f"{endpoint}: no connection yet after 0 s; still waiting",
        f"{endpoint}: no connection was made: nothing was read (is the publisher running, "
        "on this port?)",
    ]
    assert summary.problems == 1 and summary.unread == [summary.notes[1]]


def test_jsonl_is_valid_json_for_a_timestamp_that_is_not_finite() -> None:
    import json

    import msgspec

    from pagedkv_sql.live.publisher import BlockRemoved, EventBatch

    pub = Publisher(replay=False)
    run = Running(WatchOptions([pub.endpoint], duration=GUARD_S, fmt="jsonl"))
    try:
        source = run.watch.sources
        run.wait_for(lambda: source and source[0].connected)  # type: ignore[attr-defined]
        pub.wait_for_subscriber()
        for seq, ts in enumerate((float("nan"), float("inf"))):
            payload = msgspec.msgpack.encode(EventBatch(ts, [BlockRemoved([7 + seq], "GPU")], 0))
            pub.publish_raw([b"", seq.to_bytes(8, "big"), payload])
        run.wait_for(lambda: run.watch.checker.batches == 2)
        run.stop()
    finally:
        pub.close()
    findings = [
        json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
        for line in run.out.getvalue().splitlines()
    ]
    assert [(f["check"], f["ts"]) for f in findings] == [
        ("unknown_removal", None),
        ("unknown_removal", None),
    ]
