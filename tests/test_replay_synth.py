"""The synthetic step log: sound without faults, and each planted fault found at its step."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql.errors import UsageError
from pagedkv_sql.replay import synth
from pagedkv_sql.replay.log import Builder

from .conftest import Cli

FAULT_STEPS = {name: 120 + 40 * i for i, name in enumerate(synth.FAULTS)}


def events(cfg: synth.StepSynthConfig) -> Any:
    builder = Builder(synth.header(cfg))
    for step in synth.steps(cfg):
        builder.step(step)
    return builder.table()


def test_a_log_without_faults_breaks_nothing_and_has_everything() -> None:
    table = events(synth.StepSynthConfig(steps=600, seed=3))
    ops = collections.Counter(table.column("op").to_pylist())
    for op in (
        "arrive",
        "allocate",
        "share",
        "append",
        "free",
        "swap_out",
        "swap_in",
        "evict",
        "observe_ref",
        "observe_free",
    ):
        assert ops[op] > 0, op
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(table, keep_going=True)
    assert report.findings == []
    assert report.steps == 600


def test_each_planted_fault_is_found_at_its_step() -> None:
    faults = tuple(FAULT_STEPS.items())
    table = events(synth.StepSynthConfig(steps=600, faults=faults))
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(table, keep_going=True)
    found = {(f.invariant, f.step) for f in report.findings}
    for name, step in faults:
        assert (name, step) in found, name
    # nothing else breaks before the first fault; what follows a fault is its own echo
    assert min(f.step for f in report.findings) == min(FAULT_STEPS.values())
    names = {f.invariant for f in report.findings}
    assert names == {*FAULT_STEPS, "stale_token"}


def test_forks_when_prompts_fill_whole_blocks() -> None:
    cfg = synth.StepSynthConfig(
        steps=300,
        block_size=1,
        num_gpu_blocks=4096,
        prompt_tokens=20,
        output_tokens=30,
        prefix_tokens=8,
        fork_fraction=0.5,
    )
    table = events(cfg)
    assert "fork" in table.column("op").to_pylist()
    with pagedkv_sql.connect(":memory:") as db:
        assert db.replay(table, keep_going=True).findings == []


def test_cli_synth_steps_then_replay(cli: Cli) -> None:
    result: Any = cli("synth", "run.jsonl", "--steps", "300", "--fault", "double_free@200")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == "wrote run.jsonl: 300 steps, double_free@200\n"
    lines = (cli.cwd / "run.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["pagedkv_step_log"] == 1 and len(lines) == 301
    result = cli("replay", "run.jsonl")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[1].startswith("step 200: request ")
    assert cli("synth", "run.parquet", "--steps", "300").exit_code == 0
    assert cli("replay", "run.parquet").exit_code == 0
    bad: Any = cli("synth", "x.jsonl", "--steps", "10", "--fault", "meteor@3")
    assert bad.exit_code == 2 and "bad --fault 'meteor@3'" in bad.stderr
    assert not (cli.cwd / "x.jsonl").exists()


def test_parse_fault() -> None:
    assert synth.parse_fault("evict_held@7") == ("evict_held", 7)
    with pytest.raises(UsageError):
        synth.parse_fault("evict_held")


def test_jsonl_and_event_table_agree(tmp_path: Path) -> None:
    cfg = synth.StepSynthConfig(steps=200, seed=5)
    synth.write(cfg, tmp_path / "a.jsonl")
    synth.write(cfg, tmp_path / "a.parquet")
    from pagedkv_sql.replay.log import read_log

    assert read_log(tmp_path / "a.jsonl").equals(read_log(tmp_path / "a.parquet"))
