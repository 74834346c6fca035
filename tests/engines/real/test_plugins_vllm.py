"""The vLLM plugin's recorder on the real KVCacheManager of a sliding-window model (one
SlidingWindowSpec group, vLLM's window frees and prefix-hit placeholders): the log's header
names the group, the server's log says once that replay will refuse it (and how to check
that engine instead), the engine runs on, and `pagedkv-sql replay` refuses the log whole,
never replaying it into findings. The same schedule over a full-attention group is
recorded without groups and replayed."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pagedkv_sql.plugins import vllm as plugin
from tests.helpers import Cli

from .vllm_groups_driver import WINDOW, Driver, manager

STEPS = 120


@pytest.fixture
def server_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """What the plugin says, as a server's log would show it; the package's logger put back
    afterwards (the plugin hands its records on to the server's logger tree)."""
    package = logging.getLogger("pagedkv_sql")
    handlers, level = list(package.handlers), package.level
    caplog.set_level(logging.INFO, logger="pagedkv_sql")
    yield caplog
    package.handlers[:], package.level = handlers, level


def serve(kind: str, log: Path, monkeypatch: pytest.MonkeyPatch) -> Driver:
    """A scheduler over the real manager of one ``kind`` group, recorded as the plugin
    records a server's (``start``: a step a ``schedule()``), driven through prefix hits,
    window frees and preemption (a pool of 14 blocks), then shut down."""
    monkeypatch.setenv(plugin.STEP_LOG, str(log))
    m = manager([kind], num_blocks=14)
    scheduler = SimpleNamespace(
        kv_cache_manager=m,
        requests={},
        schedule=lambda: None,
        update_from_output=lambda *a: None,
        shutdown=lambda: None,
    )
    recorder = plugin.start(scheduler)
    assert recorder is not None
    driver = Driver(m, seed=3)
    driver.run(STEPS, lambda d: scheduler.schedule())
    scheduler.shutdown()
    assert recorder.failed is None
    return driver


def test_a_sliding_window_log_is_said_once_and_refused_not_replayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_log: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "steps.jsonl"
    driver = serve("sliding", log, monkeypatch)
    # the run went through what a window does: freed entries and hits padded with nulls
    assert driver.coverage.placeholders > 0 and driver.coverage.hit_tokens > 0
    assert driver.coverage.preemptions > 0 and driver.coverage.finished > 0

    header = json.loads(log.read_text().splitlines()[0])
    sliding = {"kind": "sliding_window", "block_size": 16, "sliding_window": WINDOW}
    assert header["groups"] == [sliding]
    refusals = [r for r in server_log.records if "will refuse the step log" in r.getMessage()]
    assert len(refusals) == 1 and refusals[0].levelno == logging.WARNING
    said = refusals[0].getMessage()
    assert "replay of KV-cache groups other than one full-attention group is not supported" in said
    assert "Fix: check the engine's snapshots instead" in said and "PAGEDKV_SNAPSHOT_EVERY" in said
    # a placeholder is no share of block 0: no op names the null block
    lines = log.read_text().splitlines()[1:]
    ops = [op for line in lines for op in json.loads(line).get("ops", [])]
    assert all(0 not in op.get("blocks", []) for op in ops)
    assert any(None in op.get("blocks", []) for op in ops)

    r: Any = Cli(tmp_path)("replay", str(log), "--db", "kv.duckdb", "--keep-going")
    assert r.exit_code == 1
    assert "finding" not in r.output.lower()
    assert f"{log}, line 1: the step log's header: its KV cache is 1 KV-cache group(s)" in r.output
    assert "Fix: check the engine's snapshots instead" in r.output


def test_the_same_schedule_over_full_attention_is_recorded_and_replayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_log: pytest.LogCaptureFixture
) -> None:
    """The control: one full-attention group is what replay checks; its log has no
    groups (readable as every log before them), nothing is said, replay runs it."""
    log = tmp_path / "steps.jsonl"
    serve("full", log, monkeypatch)
    assert "groups" not in json.loads(log.read_text().splitlines()[0])
    assert not [r for r in server_log.records if "will refuse" in r.getMessage()]
    r: Any = Cli(tmp_path)("replay", str(log), "--db", "kv.duckdb", "--keep-going")
    assert r.output.startswith(f"replayed {STEPS} step(s)"), r.output
    assert "the step log's header" not in r.output
