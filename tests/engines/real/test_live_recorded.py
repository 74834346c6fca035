"""KV-cache events from the real vLLM BlockPool (enable_kv_cache_events=True,
take_events()), encoded by vLLM's own KVEventBatch with msgspec, read and checked by
`pagedkv_sql.live.recorded`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pagedkv_sql.live.recorded import check_kv_events, read_kv_events

from .helpers import PREFIX, engine_module
from .vllm_driver import Engine

msgspec: Any = engine_module("msgspec")
kv_events: Any = engine_module("vllm.distributed.kv_events")


def run(tmp_path: Path, drop_first: bool = False) -> Path:
    """a stores its prefix blocks, finishes; c's allocation evicts them (BlockRemoved)."""
    e = Engine(num_blocks=10)
    batches = []
    e.schedule("a", [*PREFIX, *range(100, 120)])
    batches.append(e.manager.take_events())
    e.finish("a")
    e.schedule("c", list(range(500, 644)))  # reuses every free block: evicts a's
    batches.append(e.manager.take_events())
    assert any(isinstance(ev, kv_events.BlockRemoved) for ev in batches[-1])
    if drop_first:
        batches = batches[1:]
    encoder = msgspec.msgpack.Encoder()
    path = tmp_path / "events.msgpack"
    with path.open("wb") as f:
        for events in batches:
            f.write(encoder.encode(kv_events.KVEventBatch(ts=time.time(), events=events)))
    return path


def test_events_of_the_real_block_pool_check_clean(tmp_path: Path) -> None:
    events = read_kv_events(run(tmp_path))
    report = check_kv_events(events)
    assert report.ok, report.findings
    assert report.stored >= 1 and report.removed >= 1


def test_a_lost_batch_shows_as_removals_of_unknown_hashes(tmp_path: Path) -> None:
    report = check_kv_events(read_kv_events(run(tmp_path, drop_first=True)))
    assert not report.ok
    assert {f.check for f in report.findings} == {"unknown_removal"}, report.findings
