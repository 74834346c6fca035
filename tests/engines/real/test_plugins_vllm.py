"""The vLLM plugin's recorder on the real KVCacheManager of a model's KV-cache groups (the
groups driver in vLLM's scheduler's order: prefix hits, chunked prefill, decode,
preemption):

- a sliding-window model (SlidingWindowSpec): the log names the group, records the window's
  frees (``window_free``) and placeholders (``null``, never block 0), and replays silent;
  the frees left out, or a block freed while the window still needs it, are found;
- a chunked-local-attention model and a hybrid (sliding window + full attention): every
  group recorded (ops name their group) and replayed silent;
- a Mamba hybrid, whose state tables vLLM rewrites in place: not recorded, said once in the
  server's log (and how to check that engine instead), the engine runs on;
- full attention: recorded without groups, replayed silent."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pagedkv_sql.plugins import vllm as plugin
from pagedkv_sql.replay.record_vllm import Recorder
from tests.helpers import Cli

from .vllm_groups_driver import BLOCK_SIZE, WINDOW, Driver, manager

STEPS = 150


@pytest.fixture
def server_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """What the plugin says, as a server's log would show it; the package's logger put back
    afterwards (the plugin hands its records on to the server's logger tree)."""
    package = logging.getLogger("pagedkv_sql")
    handlers, level = list(package.handlers), package.level
    caplog.set_level(logging.INFO, logger="pagedkv_sql")
    yield caplog
    package.handlers[:], package.level = handlers, level


def scheduler_of(m: Any) -> Any:
    return SimpleNamespace(
        kv_cache_manager=m,
        requests={},
        schedule=lambda: None,
        update_from_output=lambda *a: None,
        shutdown=lambda: None,
    )


def serve(kind: str, log: Path, monkeypatch: pytest.MonkeyPatch, seed: int = 3) -> Driver:
    """A scheduler over the real manager of ``kind``'s groups ("+": several; a pool of 14
    blocks: it preempts), recorded as the plugin records a server's (``start``), then shut
    down."""
    monkeypatch.setenv(plugin.STEP_LOG, str(log))
    m = manager(kind.split("+"), num_blocks=14)
    scheduler = scheduler_of(m)
    recorder = plugin.start(scheduler)
    assert isinstance(recorder, Recorder)
    driver = Driver(m, seed=seed, scheduler_order=True)
    driver.run(STEPS, lambda d: None)  # a line a step: it ends at new_step_starts()
    scheduler.shutdown()
    assert recorder.failed is None
    return driver


def ops_of(log: Path) -> list[dict[str, Any]]:
    lines = log.read_text().splitlines()[1:]
    return [op for line in lines for op in json.loads(line).get("ops", [])]


def replay(log: Path) -> Any:
    return Cli(log.parent)("replay", str(log), "--db", "kv.duckdb", "--keep-going")


@pytest.mark.parametrize("seed", [3, 4])
def test_a_sliding_window_is_recorded_and_replays_silent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_log: pytest.LogCaptureFixture, seed: int
) -> None:
    log = tmp_path / "steps.jsonl"
    driver = serve("sliding", log, monkeypatch, seed)
    coverage = driver.coverage
    assert coverage.placeholders > 0 and coverage.hit_tokens > 0
    assert coverage.preemptions > 0 and coverage.finished > 0

    header = json.loads(log.read_text().splitlines()[0])
    sliding = {"kind": "sliding_window", "block_size": BLOCK_SIZE, "sliding_window": WINDOW}
    assert header["groups"] == [sliding]
    assert not [r for r in server_log.records if "not recording" in r.getMessage()]
    ops = ops_of(log)
    assert all(0 not in op.get("blocks", []) for op in ops)  # a placeholder is no block 0
    assert any(op["op"] == "share" and None in op["blocks"] for op in ops)
    assert sum(op["op"] == "window_free" for op in ops) > 10

    r = replay(log)
    assert r.exit_code == 0, r.output
    assert r.output.endswith("no invariant broken\n"), r.output


def test_window_frees_left_out_of_the_log_are_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_log: pytest.LogCaptureFixture
) -> None:
    """The silence above is the window frees' doing: the same run recorded without them
    (the recorder's wrapper passing the call through) is replayed into findings."""
    monkeypatch.setattr(
        Recorder,
        "_remove_skipped_blocks",
        lambda self, group, original, *a, **kw: original(*a, **kw),
    )
    log = tmp_path / "steps.jsonl"
    serve("sliding", log, monkeypatch)
    assert not any(op["op"] == "window_free" for op in ops_of(log))
    r = replay(log)
    assert r.exit_code == 1
    assert "fresh_while_held" in r.output or "ref_cnt" in r.output, r.output


def test_a_block_the_window_still_needs_freed_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_log: pytest.LogCaptureFixture
) -> None:
    """A fault planted in vLLM's sliding-window manager: it counts a block more out of the
    window than there is, freeing a block whose tokens the window still reads."""
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager

    skipped = SlidingWindowManager.get_num_skipped_tokens
    monkeypatch.setattr(
        SlidingWindowManager,
        "get_num_skipped_tokens",
        lambda self, n: skipped(self, n) + BLOCK_SIZE if skipped(self, n) > 0 else 0,
    )
    log = tmp_path / "steps.jsonl"
    serve("sliding", log, monkeypatch)
    r = replay(log)
    assert r.exit_code == 1
    lines = [line for line in r.output.splitlines() if "unresolved_token" in line]
    assert lines and "released block" in lines[0] and "with tokens" in lines[0], r.output


@pytest.mark.parametrize("kind", ["chunked", "sliding+full", "chunked+full"])
def test_every_group_of_a_chunked_or_hybrid_model_is_recorded_and_replays_silent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    log = tmp_path / "steps.jsonl"
    driver = serve(kind, log, monkeypatch)
    assert driver.coverage.placeholders > 0 and driver.coverage.finished > 0
    header = json.loads(log.read_text().splitlines()[0])
    assert len(header["groups"]) == len(kind.split("+"))
    if "+" in kind:  # ops of a log of several groups name theirs
        groups = {op.get("group") for op in ops_of(log) if op["op"] in ("allocate", "share")}
        assert groups == {0, 1}
    r = replay(log)
    assert r.exit_code == 0, r.output
    assert r.output.endswith("no invariant broken\n"), r.output


def test_a_mamba_hybrid_is_not_recorded_and_said_once_with_the_way_to_check_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_log: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "steps.jsonl"
    monkeypatch.setenv(plugin.STEP_LOG, str(log))
    assert plugin.start(scheduler_of(manager(["mamba", "full"], num_blocks=14))) is None
    refusals = [r for r in server_log.records if "not recording" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].levelno == logging.ERROR
    said = refusals[0].getMessage()
    assert "`pagedkv-sql replay` cannot replay its log" in said and "group 0 is mamba" in said
    assert "Fix: check the engine's snapshots instead" in said and "PAGEDKV_SNAPSHOT_EVERY" in said
    assert not log.exists()


def test_full_attention_is_recorded_without_groups_and_replays_silent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_log: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "steps.jsonl"
    serve("full", log, monkeypatch)
    assert "groups" not in json.loads(log.read_text().splitlines()[0])
    assert not [r for r in server_log.records if "not recording" in r.getMessage()]
    r = replay(log)
    assert r.exit_code == 0, r.output
    assert r.output.endswith("no invariant broken\n"), r.output


def test_a_spec_pagedkv_sql_does_not_know_is_refused_by_name_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_log: pytest.LogCaptureFixture
) -> None:
    """vLLM's RSWASpec frees a gap in the middle of a request's tokens: no kind here says
    that, so nothing is recorded (never guessed), said once, naming the class."""
    monkeypatch.setenv(plugin.STEP_LOG, str(tmp_path / "steps.jsonl"))
    scheduler = SimpleNamespace(kv_cache_manager=manager(["rswa"]), requests={})
    assert plugin.start(scheduler) is None
    said = [r.getMessage() for r in server_log.records if r.levelno == logging.ERROR]
    assert len(said) == 1 and "not recording this engine's steps" in said[0], said
    assert "RSWASpec" in said[0] and "Fix: " in said[0]
    assert not list(tmp_path.iterdir())
