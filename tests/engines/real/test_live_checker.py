"""KV-cache events of vLLM's real KVCacheManager over groups of every kind that caches
(sliding window, chunked local attention, Mamba "align", each beside full attention, and a
sliding window alone), driven through prefix hits, window frees, evictions and preemption
(vllm_groups_driver.py): the events of each step as vLLM publishes them (take_events(), one
KVEventBatch, msgspec msgpack) are checked silent, while they do carry what the checker must
not take for a fault: windowed groups' BlockStored with no hashes and parents never stored,
one hash stored twice in a group and in two groups."""

from __future__ import annotations

import collections
import io
from typing import Any

import pytest

from pagedkv_sql.live import check_stream, checker

from .helpers import engine_module
from .vllm_groups_driver import Driver, manager

msgspec: Any = engine_module("msgspec")
kv_events: Any = engine_module("vllm.distributed.kv_events")

CASES = {
    "sliding": ["sliding"],
    "sliding + full": ["sliding", "full"],
    "chunked local + full": ["chunked", "full"],
    "mamba align + full": ["mamba", "full"],
}
_KIND = {
    "sliding": "sliding_window",
    "chunked": "chunked_local_attention",
    "mamba": "mamba",
    "full": "full_attention",
}


def _stream(kinds: list[str], seed: int, retention: int | None) -> tuple[bytes, list[Any], Driver]:
    driver = Driver(manager(kinds, 14, retention=retention), seed)
    encoder = msgspec.msgpack.Encoder()
    payloads: list[bytes] = []
    events: list[Any] = []

    def each(d: Driver) -> None:
        taken = d.manager.take_events()
        events.extend(taken)
        payloads.append(encoder.encode(kv_events.KVEventBatch(float(len(payloads)), taken)))

    driver.run(150, each)
    return b"".join(payloads), events, driver


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("retention", [0, None])
def test_a_healthy_manager_s_events_check_silent(case: str, seed: int, retention: Any) -> None:
    # retention 0, vLLM's default, and None (every block hashed)
    data, events, driver = _stream(CASES[case], seed, retention)
    report = check_stream(io.BytesIO(data), case)
    assert report.findings == [], [f.message for f in report.findings[:5]]
    stored = [e for e in events if isinstance(e, kv_events.BlockStored)]
    removed = [e for e in events if isinstance(e, kv_events.BlockRemoved)]
    assert report.counts["stored"] == len(stored) and report.counts["removed"] == len(removed)
    assert removed and driver.coverage.preemptions and driver.coverage.hit_tokens
    assert {e.group_idx for e in stored} == set(range(len(CASES[case])))
    # vLLM's take_events() names each group's kind
    assert {e.kv_cache_spec_kind for e in stored} == {_KIND[k] for k in CASES[case]}


@pytest.mark.parametrize("case", ["sliding", "sliding + full", "mamba align + full"])
def test_the_streams_hold_what_the_group_rules_are_for(case: str, monkeypatch: Any) -> None:
    # without the windowed rule, the same healthy streams give unknown_parent findings:
    # the stream above checks what it is meant to
    data, events, _ = _stream(CASES[case], 0, 0)
    windowed = [e for e in events if isinstance(e, kv_events.BlockStored) and e.group_idx == 0]
    assert any(not e.block_hashes for e in windowed)
    # a hash stored again in its group (two blocks, the same tokens), and, in a hybrid, in
    # two groups: counted per group and hash, or its second removal were a false finding
    per = collections.Counter(
        (e.group_idx, h)
        for e in events
        if isinstance(e, kv_events.BlockStored)
        for h in e.block_hashes
    )
    assert max(per.values()) > 1
    if len(CASES[case]) > 1:
        assert {h for g, h in per if g == 0} & {h for g, h in per if g == 1}
    monkeypatch.setattr(checker, "WINDOWED", frozenset())
    report = check_stream(io.BytesIO(data), case)
    assert report.findings_by_check["unknown_parent"] > 0
    assert all(f.message.startswith("group 0 (") for f in report.findings)
