"""The step recorder on the real vLLM KVCacheManager: its log replays to exactly the
state capture() reads at the end, and the #37076 interleaving is reported at its step."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from typer.testing import CliRunner

import pagedkv_sql
from pagedkv_sql.cli import app
from pagedkv_sql.engines import vllm
from pagedkv_sql.replay.record_vllm import Recorder

from .helpers import PREFIX
from .resolved import grow_then_finish, replayed, resolved_tokens
from .vllm_driver import Engine


def test_the_log_replays_to_the_captured_state(tmp_path: Path) -> None:
    log = tmp_path / "vllm.jsonl"
    e = Engine(num_blocks=16)
    rec = Recorder(e.manager, log)
    e.schedule("a", [*PREFIX, *range(100, 120)])
    rec.step()
    e.schedule("b", [*PREFIX, *range(200, 210)])
    e.schedule("c", [*PREFIX, *range(300, 340)])
    rec.step()
    last = grow_then_finish(e, rec)

    labelled = partial(resolved_tokens, label="pagedkv_request_label")
    after = replayed(log, last, tmp_path / "replayed.duckdb", labelled)
    with pagedkv_sql.connect(":memory:") as db:
        db.load_engine(vllm.capture(e.manager, e.requests))
        captured = resolved_tokens(db)
    assert after == captured
    assert {r for r, _, _ in captured} == {"b", "c"}


def test_the_37076_interleaving_is_reported_at_its_step(tmp_path: Path) -> None:
    """a, then e finish and leave their blocks cached (ref_cnt 0; the free queue is the
    never-used blocks, then a's cached 3, 2, 1, then e's); b's lookup finds blocks 1 and 2;
    before b takes them, in the same step, c's allocation takes the queue up to block 1,
    evicting and reusing 2 and 1; b then takes them, its new block from e's. (A lookup still
    untaken at the end of its step is dropped, as vLLM's scheduler drops it; so is one
    allocate_slots finds no room for: docs/replay.md.)"""
    log = tmp_path / "vllm.jsonl"
    e = Engine(num_blocks=16)
    rec = Recorder(e.manager, log)
    e.schedule("a", [*PREFIX, *range(100, 120)])
    rec.step()
    e.finish("a")
    e.schedule("e", list(range(700, 764)))
    rec.step()
    e.finish("e")
    rec.step()
    b = e.request("b", [*PREFIX, *range(200, 210)])
    hit, num_hit, _ = e.manager.get_computed_blocks(b)  # b's lookup: blocks 1, 2
    assert [blk.block_id for blk in hit.blocks[0]] == [1, 2] and num_hit == 32
    bad_step = rec.step_no
    e.schedule("c", list(range(500, 676)))  # 11 blocks: the queue up to blocks 2 and 1
    assert {1, 2} <= set(e.blocks("c"))
    taken = e.manager.allocate_slots(b, b.num_tokens - num_hit, num_hit, hit)  # b, late
    assert taken is not None
    rec.close()

    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(log, keep_going=True)
    first = report.first
    assert first is not None
    assert first.step == bad_step, first
    assert first.block_id in (1, 2)
    at_step = [f for f in report.findings if f.step == bad_step]
    print(*at_step, sep="\n")
    assert {f.check for f in at_step} >= {"evict_held", "fresh_while_held"}, at_step
    fresh = [f for f in at_step if f.check == "fresh_while_held"]
    assert {(f.request, f.other_requests, f.block_id) for f in fresh} >= {("c", "b", 1)}, fresh
    # and from the shell: `pagedkv-sql replay LOG` names the step and exits 1
    result = CliRunner().invoke(app, ["--db", str(tmp_path / "cli.duckdb"), "replay", str(log)])
    assert result.exit_code == 1, result.output
    assert f"step {bad_step}:" in result.output, result.output
