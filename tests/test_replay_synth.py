"""The synthetic step log: sound without faults, and each planted fault found at its step."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql.errors import UsageError
from pagedkv_sql.replay import log as steplog
from pagedkv_sql.replay import synth
from pagedkv_sql.replay.log import Builder

from .helpers import Cli

FAULT_STEPS = {name: 120 + 30 * i for i, name in enumerate(synth.FAULTS)}


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
        "cache",
    ):
        assert ops[op] > 0, op
    # the hits on the shared prompts ask for the hashes their blocks are cached under
    shares = [
        v
        for o, v in zip(
            table.column("op").to_pylist(), table.column("value").to_pylist(), strict=True
        )
        if o == "share"
    ]
    assert sum(v is not None for v in shares) > len(shares) // 2
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(table, keep_going=True)
    assert report.findings == []
    assert report.steps == 600


def test_each_planted_fault_is_found_at_its_step() -> None:
    faults = tuple(FAULT_STEPS.items())
    table = events(synth.StepSynthConfig(steps=600, faults=faults))
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(table, keep_going=True)
    found = {(f.check, f.step) for f in report.findings}
    for name, step in faults:
        assert (name, step) in found, name
    # nothing else breaks before the first fault; what follows a fault is its own echo
    assert min(f.step for f in report.findings) == min(FAULT_STEPS.values())
    names = {f.check for f in report.findings}
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


def test_cli_synth_log_then_replay(cli: Cli) -> None:
    result: Any = cli("synth-log", "run.jsonl", "--steps", "300", "--fault", "double_free@200")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == "wrote run.jsonl: 300 steps, double_free@200\n"
    lines = (cli.cwd / "run.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["pagedkv_step_log"] == 2 and len(lines) == 301
    result = cli("replay", "run.jsonl")
    assert result.exit_code == 1
    assert result.stdout.splitlines()[1].startswith("step 200: double_free: request ")
    assert cli("synth-log", "run.parquet", "--steps", "300").exit_code == 0
    assert cli("replay", "run.parquet").exit_code == 0
    bad: Any = cli("synth-log", "x.jsonl", "--steps", "10", "--fault", "meteor@3")
    assert bad.exit_code == 2 and "bad --fault 'meteor@3'" in bad.stderr
    assert not (cli.cwd / "x.jsonl").exists()


def test_cli_synth_log_defaults_are_the_configs(cli: Cli) -> None:
    result: Any = cli("synth-log", "run.jsonl")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == "wrote run.jsonl: 1000 steps, no faults\n"
    expected = cli.cwd / "expected.jsonl"
    synth.write(synth.StepSynthConfig(), expected)
    assert (cli.cwd / "run.jsonl").read_bytes() == expected.read_bytes()


def test_the_old_spelling_synth_steps_writes_the_same_log_with_a_note(cli: Cli) -> None:
    old: Any = cli("synth", "old.jsonl", "--steps", "30", "--fault", "double_free@20")
    assert old.exit_code == 0, old.stderr
    assert old.stderr == (
        "note: 'synth --steps' is now 'synth-log'; the old spelling will keep working\n"
        "wrote old.jsonl: 30 steps, double_free@20\n"
    )
    new: Any = cli("synth-log", "new.jsonl", "--steps", "30", "--fault", "double_free@20")
    assert new.stderr == "wrote new.jsonl: 30 steps, double_free@20\n"
    assert (cli.cwd / "old.jsonl").read_bytes() == (cli.cwd / "new.jsonl").read_bytes()
    quiet: Any = cli("-q", "synth", "quiet.jsonl", "--steps", "3")
    assert quiet.exit_code == 0 and quiet.stderr == "wrote quiet.jsonl: 3 steps, no faults\n"
    bad: Any = cli("synth", "x.jsonl", "--steps", "10", "--fault", "meteor@3")
    assert bad.exit_code == 2 and bad.stderr.startswith("note: 'synth --steps' is now")
    assert "Error: bad --fault 'meteor@3'" in bad.stderr


def test_parse_fault() -> None:
    assert synth.parse_fault("evict_held@7") == ("evict_held", 7)
    assert synth.parse_fault("ref_cnt_mismatch@7") == ("refcount_mismatch", 7)  # its old name
    old = synth.StepSynthConfig(steps=10, faults=(("block_outside_pool", 3),))
    assert old.faults == (("outside_pool", 3),)
    with pytest.raises(UsageError):
        synth.parse_fault("evict_held")


def test_jsonl_and_event_table_agree(tmp_path: Path) -> None:
    cfg = synth.StepSynthConfig(steps=200, seed=5)
    synth.write(cfg, tmp_path / "a.jsonl")
    synth.write(cfg, tmp_path / "a.parquet")
    from pagedkv_sql.replay.log import read_log

    assert read_log(tmp_path / "a.jsonl").equals(read_log(tmp_path / "a.parquet"))


def test_synth_observes_every_observe_every_steps() -> None:
    cfg = synth.StepSynthConfig(steps=45, observe_every=10)
    assert [s["step"] for s in synth.steps(cfg) if "observed" in s] == [0, 10, 20, 30, 40]


# a fault's own echoes: a block handed out or evicted under its holders leaves their tokens
# stale; an append a block too early is followed by its block, a step late; a block leaked
# is one free block fewer than replay counts, from its step on
_ECHOES = {
    "leak": {("free_count", True), ("free_count", False)},
    "fresh_while_held": {("stale_token", True)},
    "evict_held": {("stale_token", True)},
    "unresolved_token": {("stale_token", False)},
}


@pytest.mark.parametrize("name", synth.FAULTS)
def test_each_fault_alone_breaks_its_invariant_at_its_step_and_nothing_else(name: str) -> None:
    cfg = synth.StepSynthConfig(steps=160, faults=((name, 100),))
    builder = steplog.Builder(synth.header(cfg))
    for step in synth.steps(cfg):
        builder.step(step)
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(builder.table(), keep_going=True)
    found = {(f.check, f.step == 100) for f in report.findings}
    assert found == {(name, True)} | _ECHOES.get(name, set())
    assert min(f.step for f in report.findings) == 100


def test_the_swap_of_an_unaligned_cpu_address_fault_keeps_the_simulator_s_block_table_true() -> (
    None
):
    # the fault swaps the victim's block 0 out to an unaligned address and back in to a fresh
    # block: the simulator's own table must say so, or its later steps free the wrong block
    cfg = synth.StepSynthConfig(steps=101, faults=(("unaligned_cpu_address", 100),))
    engine = synth._Engine(cfg)
    for n in range(101):
        out = engine.step(n)
    swap_out, swap_in = (o for o in out["ops"] if o["op"] in ("swap_out", "swap_in"))
    assert swap_out["cpu"][0] % 256 != 0 and swap_in["indices"] == [0]
    victim = engine.reqs[swap_in["req"]]
    assert len(victim.blocks) > 1  # so that a fresh block put at another index shows
    assert victim.blocks[0] == swap_in["blocks"][0]
    assert swap_out["blocks"][0] not in victim.blocks


def test_synth_arrivals_follow_the_rate_exactly_when_it_is_whole() -> None:
    # a whole rate: that many arrivals a step, never one more (no forks, a pool with room)
    for rate, each in ((1.0, 1), (0.0, 0)):
        cfg = synth.StepSynthConfig(
            steps=20, arrival_rate=rate, num_gpu_blocks=4096, fork_fraction=0.0
        )
        arrived = [len(s.get("new_requests", [])) for s in synth.steps(cfg)]
        assert arrived == [each] * 20, rate


def test_synth_prompts_have_about_the_configured_length_and_share_only_the_prefix() -> None:
    cfg = synth.StepSynthConfig(steps=60, num_gpu_blocks=4096, fork_fraction=0.0)
    new = [n for s in synth.steps(cfg) for n in s.get("new_requests", [])]
    prompts = [n["num_computed_tokens"] + n["num_scheduled_tokens"] for n in new]
    own = [p - cfg.prefix_tokens for p in prompts]  # each prompt is a shared prefix + its own
    assert len(new) == 60
    assert cfg.prompt_tokens / 3 < sum(own) / len(own) < cfg.prompt_tokens * 3
    # a prefix-cache hit covers at most the shared system prompt's whole blocks
    hits = [n["num_computed_tokens"] for n in new]
    assert max(hits) == cfg.prefix_tokens // cfg.block_size * cfg.block_size


def test_the_request_a_fresh_while_held_fault_plants_starts_with_no_token() -> None:
    cfg = synth.StepSynthConfig(steps=102, faults=(("fresh_while_held", 100),))
    engine = synth._Engine(cfg)
    for n in range(101):
        out = engine.step(n)
    last = out["ops"][-1]  # the fault's allocate comes last in its step
    assert last["op"] == "allocate"
    planted = last["req"]
    rows = [r for r in engine.step(101).get("running", []) if r["req_id"] == planted]
    assert [(r["num_computed_tokens"], r["num_scheduled_tokens"]) for r in rows] == [(0, 1)]


def test_the_late_block_of_an_unresolved_token_fault_goes_only_to_a_running_request() -> None:
    cfg = synth.StepSynthConfig(steps=102, faults=(("unresolved_token", 100),))
    engine = synth._Engine(cfg)
    for n in range(101):
        engine.step(n)
    assert engine.late is not None
    engine.reqs[engine.late].running = False  # swapped out before its block came
    out = engine.step(101)
    assert engine.late is None
    assert not [o for o in out.get("ops", []) if o["op"] == "allocate"]


def test_synth_evicts_the_prefix_cache_only_under_memory_pressure() -> None:
    # short requests: their shared prompts' blocks go back to the prefix cache early
    roomy = synth.StepSynthConfig(
        steps=80, num_gpu_blocks=8192, prompt_tokens=20, output_tokens=4, fork_fraction=0.0
    )
    assert not [o for s in synth.steps(roomy) for o in s.get("ops", []) if o["op"] == "evict"]
    tight = synth.StepSynthConfig(steps=300, num_gpu_blocks=256, fork_fraction=0.0)
    assert [o for s in synth.steps(tight) for o in s.get("ops", []) if o["op"] == "evict"]


def test_the_block_outside_the_pool_is_given_back_when_its_request_finishes() -> None:
    cfg = synth.StepSynthConfig(steps=5000, faults=(("outside_pool", 100),))
    engine = synth._Engine(cfg)
    for n in range(101):
        out = engine.step(n)
    (victim,) = (o["req"] for o in out["ops"] if o.get("blocks") == [cfg.num_gpu_blocks])
    assert engine.ref[cfg.num_gpu_blocks] == 1
    n = 101
    while victim in engine.reqs and n < cfg.steps:
        engine.step(n)
        n += 1
    assert victim not in engine.reqs
    assert cfg.num_gpu_blocks not in engine.ref


def test_synth_runs_at_most_max_running_requests() -> None:
    cfg = synth.StepSynthConfig(
        steps=30, max_running=3, num_gpu_blocks=8192, output_tokens=1000, fork_fraction=0.0
    )
    engine = synth._Engine(cfg)
    live = []
    for n in range(cfg.steps):
        engine.step(n)
        live.append(sum(r.running for r in engine.reqs.values()))
    assert max(live) == 3


# -- synth never writes a log replay refuses, never crashes on a number, never reports a
# fault it did not plant
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--arrival-rate", "nan"], r"--arrival-rate nan is outside \[0\.0, 1000\.0\]"),
        (["--arrival-rate", "inf"], r"--arrival-rate inf is outside"),
        (["--arrival-rate", "-0.5"], r"--arrival-rate -0\.5 is outside"),
        (["--block-size", "0"], r"--block-size 0 is outside \[1, 256\]"),
        (["--block-size", "300"], r"--block-size 300 is outside \[1, 256\]"),
        (["--num-gpu-blocks", "0"], r"--num-gpu-blocks 0 is outside \[2, 2147483647\]"),
        (["--num-gpu-blocks", "-5"], r"--num-gpu-blocks -5 is outside"),
        (["--steps", "-1"], r"--steps -1 is outside \[0, 10000000\]"),
        (["--fault", "double_free@500"], r"--fault double_free@500 is past the log's last step 99"),
        (["--fault", "evict_held@100"], r"--fault evict_held@100 is past the log's last step 99"),
        (["--seed", "-1"], r"--seed -1 is outside"),
        # two faults at one step are refused: only the last would be planted, both reported
        (
            ["--fault", "double_free@5", "--fault", "double_free@5"],
            r"--fault double_free@5: step 5 already has --fault double_free@5",
        ),
        (
            ["--fault", "double_free@5", "--fault", "refcount_mismatch@5"],
            r"--fault refcount_mismatch@5: step 5 already has --fault double_free@5",
        ),
    ],
)
def test_synth_refuses_what_it_cannot_simulate_naming_the_option(
    cli: Cli, args: list[str], message: str
) -> None:
    steps = [] if "--steps" in args else ["--steps", "100"]
    result: Any = cli("synth", "x.jsonl", *steps, *args)
    assert result.exit_code == 2, result.stderr
    assert re.search(message, result.stderr), result.stderr
    assert "Traceback" not in result.stderr
    assert not (cli.cwd / "x.jsonl").exists()


@pytest.mark.parametrize(
    "cfg",
    [
        synth.StepSynthConfig(steps=150, num_gpu_blocks=2),
        synth.StepSynthConfig(steps=150, num_gpu_blocks=17, block_size=1),
        synth.StepSynthConfig(steps=150, block_size=256, prompt_tokens=900),
        synth.StepSynthConfig(steps=150, arrival_rate=0.0),
        synth.StepSynthConfig(steps=150, arrival_rate=1000.0, num_gpu_blocks=300),
        synth.StepSynthConfig(steps=0),
        synth.StepSynthConfig(steps=150, fork_fraction=1.0, fork_width=5, block_size=1),
    ],
)
def test_every_log_synth_accepts_replays_clean(cfg: synth.StepSynthConfig) -> None:
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(events(cfg), keep_going=True)
    assert report.findings == []


def test_a_fault_that_cannot_be_planted_leaves_no_partial_log(tmp_path: Path) -> None:
    cfg = synth.StepSynthConfig(steps=50, num_gpu_blocks=2, faults=(("double_free", 40),))
    with pytest.raises(UsageError, match=r"cannot plant double_free at step 40"):
        synth.write(cfg, tmp_path / "x.jsonl")
    assert list(tmp_path.iterdir()) == []


def test_a_config_of_the_wrong_type_is_refused() -> None:
    for bad in ({"steps": "10"}, {"arrival_rate": True}, {"block_size": 1.5e9}):
        with pytest.raises(UsageError, match=r"must be a number|is outside"):
            synth.StepSynthConfig(**bad)  # type: ignore[arg-type]


def test_every_fault_synth_reports_is_found_at_its_step(tmp_path: Path) -> None:
    # each fault named in "wrote ...: double_free@5, ..." is planted, at its step
    faults = (("double_free", 5), ("refcount_mismatch", 6), ("evict_held", 9))
    path = tmp_path / "f.jsonl"
    synth.write(synth.StepSynthConfig(steps=20, faults=faults), path)
    with pagedkv_sql.connect(":memory:") as db:
        report = db.replay(path, keep_going=True)
    found = {(f.check, f.step) for f in report.findings}
    assert {(name, step) for name, step in faults} <= found
