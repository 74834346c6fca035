"""`fleet sim` over real vLLM KVCacheManagers and Dynamo's real RadixTree: the directory
it writes holds to the fleet contract (docs/fleet.md), its step logs replay clean, its
events' hashes are its step logs' hashes (one fold), one seed is one run, and bad
arguments are refused before anything is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pagedkv_sql.fleet.sim import Options, run
from tests.helpers import Cli

from .helpers import batches, cached_hashes, lines, steps, stored_hashes

NAMES = ["r0", "r1", "r2", "r3"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean fleet of 4 replicas over 200 generated requests, written by the CLI."""
    base = tmp_path_factory.mktemp("clean")
    result: Any = Cli(base)(
        "fleet", "sim", "fleet", "--replicas", "4", "--requests", "200", "--seed", "3"
    )
    assert result.exit_code == 0, result.output
    assert "fleet sim: 4 replica(s), 200 request(s)" in result.output
    return base / "fleet"


def test_the_header_names_the_replicas_routers_and_fold(clean: Path) -> None:
    fleet = json.loads((clean / "fleet.json").read_text())
    assert fleet["pagedkv_fleet"] == 1 and fleet["hash"] == "vllm_last8"
    assert [r["name"] for r in fleet["replicas"]] == NAMES
    assert [r["worker_id"] for r in fleet["replicas"]] == [0, 1, 2, 3]
    assert fleet["routers"] == [
        {"name": "dynamo", "kind": "dynamo_radix_tree", "routed": True},
        {"name": "approx", "kind": "approx_lru", "routed": False},
    ]
    assert fleet["groups"] == [{"group": 0, "kind": "full_attention", "block_size": 16}]
    assert fleet["plant"] is None and fleet["plant_detail"] is None
    assert fleet["requests"] == 200 and fleet["stats"]["finished"] == 200
    assert sorted(p.name for p in clean.iterdir()) == [
        "decisions.jsonl",
        "fleet.json",
        "outcomes.jsonl",
        *(f"replica={n}" for n in NAMES),
        "router=approx",
        "router=dynamo",
    ]


def test_every_replica_publishes_numbered_batches_of_the_pool_it_holds(clean: Path) -> None:
    assert sum(bool(batches(clean, n)) for n in NAMES) >= 3  # the router spread the work
    for name in NAMES:
        got = batches(clean, name)
        assert [b["seq"] for b in got] == list(range(len(got)))  # no gap on a clean run
        assert all(b["data_parallel_rank"] == 0 and b["events"] for b in got)
        assert [b["ts"] for b in got] == sorted(b["ts"] for b in got)
        # one fold: every hash an event stored is a hash the step log cached a block under
        assert stored_hashes(clean, name) == cached_hashes(clean, name)
        assert steps(clean, name)[0]["hash"] == "vllm_last8"


@pytest.mark.parametrize("name", NAMES)
def test_each_step_log_replays_silent(clean: Path, name: str) -> None:
    result: Any = Cli(clean)("replay", f"replica={name}/steps.jsonl")
    assert result.exit_code == 0, result.output
    assert "no invariant broken" in result.output


def test_every_request_is_decided_by_both_routers_and_served_once(clean: Path) -> None:
    decisions = lines(clean / "decisions.jsonl")
    outcomes = lines(clean / "outcomes.jsonl")
    assert len(decisions) == 400 and len(outcomes) == 200
    routed = {d["request"]: d["chosen"] for d in decisions if d["routed"]}
    assert {d["router"] for d in decisions if d["routed"]} == {"dynamo"}
    assert routed == {o["request"]: o["replica"] for o in outcomes}
    for d in decisions:
        assert set(d["predicted"]) == set(NAMES) and d["reason"] in ("prefix", "load", "none")
        best = max(d["predicted"].values())
        assert d["predicted"][d["chosen"]] == best
        assert (d["reason"] == "none") == (best == 0)
    # the workload's shared prompts hit: the engines say so, and Dynamo predicted them
    assert sum(o["cached_tokens"] for o in outcomes) > 0
    assert any(d["reason"] == "prefix" for d in decisions if d["router"] == "dynamo")


def test_the_routers_dump_their_index_in_dynamos_shape(clean: Path) -> None:
    for router in ("dynamo", "approx"):
        dumps = lines(clean / f"router={router}" / "index.jsonl")
        assert [d["t"] for d in dumps] == sorted(d["t"] for d in dumps)
        last = dumps[-1]["dump"]
        assert last, router
        for e in last:
            assert e["worker_id"] in (0, 1, 2, 3) and e["event"]["dp_rank"] == 0
            for b in e["event"]["data"]["stored"]["blocks"]:
                assert set(b) == {"block_hash", "tokens_hash", "mm_extra_info"}
    # Dynamo's belief at the end is blocks the engines published
    published = set().union(*(stored_hashes(clean, n) for n in NAMES))
    final = lines(clean / "router=dynamo" / "index.jsonl")[-1]["dump"]
    believed = {b["block_hash"] for e in final for b in e["event"]["data"]["stored"]["blocks"]}
    assert believed and believed <= published


def test_one_seed_is_one_run(tmp_path: Path) -> None:
    files = [
        "fleet.json",
        "decisions.jsonl",
        "outcomes.jsonl",
        "router=dynamo/index.jsonl",
        "router=approx/index.jsonl",
        "replica=r1/events.jsonl",
        "replica=r1/steps.jsonl",
    ]
    a, b, c = (
        run(tmp_path / x, Options(replicas=3, requests=80, seed=s))
        for x, s in (("a", 5), ("b", 5), ("c", 6))
    )
    assert a == b != c
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert (tmp_path / "a" / "decisions.jsonl").read_bytes() != (
        tmp_path / "c" / "decisions.jsonl"
    ).read_bytes()


def test_a_hybrid_fleet_runs_and_replays(tmp_path: Path) -> None:
    fleet = run(tmp_path / "h", Options(replicas=2, requests=60, kind="hybrid"))
    assert [g["kind"] for g in fleet["groups"]] == ["sliding_window", "full_attention"]
    groups = {
        e["group_idx"]
        for b in batches(tmp_path / "h", "r0")
        for e in b["events"]
        if e["type"] == "BlockStored"
    }
    assert groups == {0, 1}
    result: Any = Cli(tmp_path)("replay", "h/replica=r0/steps.jsonl")
    assert result.exit_code == 0 and "no invariant broken" in result.output, result.output


def test_a_mooncake_and_a_bailian_trace_share_prefixes_where_their_hash_ids_do(
    tmp_path: Path,
) -> None:
    mooncake = tmp_path / "mooncake.jsonl"
    mooncake.write_text(
        '{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [7, 8]}\n'
        '{"timestamp": 50, "input_length": 600, "output_length": 5, "hash_ids": [7, 9]}\n'
    )
    bailian = tmp_path / "bailian.jsonl"
    bailian.write_text(
        '{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 40, '
        '"output_length": 3, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]}\n'
        '{"chat_id": 2, "parent_chat_id": 1, "timestamp": 0.5, "input_length": 50, '
        '"output_length": 3, "type": "text", "turn": 2, "hash_ids": [1, 2, 4, 5]}\n'
    )
    for trace, hit in ((mooncake, 512), (bailian, 32)):
        out = tmp_path / trace.stem
        fleet = run(out, Options(replicas=1, requests=10, trace=trace, num_blocks=128))
        assert fleet["trace"] == str(trace) and fleet["requests"] == 2
        outcomes = lines(out / "outcomes.jsonl")
        assert [o["cached_tokens"] for o in outcomes] == [0, hit]


@pytest.mark.parametrize(
    ("args", "message", "fix"),
    [
        (
            ["--plant", "attention_mamba_collision"],
            "--plant attention_mamba_collision is not built yet",
            "one of",
        ),
        (["--plant", "dp_ranks_merged", "--replicas", "1"], "give --replicas 2 or more", None),
        (
            ["--plant", "sliding_window_as_prefix"],
            "which --kind full does not have",
            "--kind hybrid",
        ),
        (["--trace", "missing.jsonl"], "cannot read the trace missing.jsonl", None),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    tmp_path: Path, args: list[str], message: str, fix: str | None
) -> None:
    result: Any = Cli(tmp_path)("fleet", "sim", "out", "--requests", "5", *args)
    assert result.exit_code in (1, 2) and "Traceback" not in result.output
    assert message in result.output
    if fix is not None:
        assert result.exit_code == 2 and f"Fix: {fix}" in result.output
    assert not (tmp_path / "out").exists()


def test_a_directory_with_files_is_not_written_over(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    result: Any = Cli(tmp_path)("fleet", "sim", "out", "--requests", "5")
    assert result.exit_code == 2 and "exists and is not an empty directory" in result.output
    assert "Fix: name a new directory" in result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["keep.txt"]


def test_a_malformed_trace_line_is_refused_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text(
        '{"timestamp": 0, "input_length": 40, "output_length": 2, "hash_ids": [1]}\n'
        '{"timestamp": 5, "input_length": 40, "hash_ids": [1]}\n'
    )
    result: Any = Cli(tmp_path)("fleet", "sim", "out", "--trace", "t.jsonl")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "t.jsonl:2: not a trace record (missing 'output_length')" in result.output
    assert "Fix: one JSON object a line" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [[], ["--router", "approx", "--plant", "clear_ignored"]])
def test_without_dynamo_its_router_and_its_plants_are_refused_with_the_fix(
    tmp_path: Path, args: list[str]
) -> None:
    import subprocess
    import sys

    argv = ["fleet", "sim", "out", "--requests", "5", *args]
    code = (
        "import sys; sys.modules['dynamo'] = None\n"  # as if ai-dynamo-runtime were absent
        f"from pagedkv_sql.cli import app; app({argv!r})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "Error: the Dynamo router needs ai-dynamo-runtime" in done.stderr
    assert "Fix: pip install 'pagedkv-sql[fleet]'" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_small_pool_preempts_and_its_logs_still_replay_silent(tmp_path: Path) -> None:
    fleet = run(tmp_path / "p", Options(replicas=2, requests=150, num_blocks=40, seed=4))
    assert fleet["stats"]["preempted"] > 0 and fleet["stats"]["finished"] == 150
    preempts = [
        op
        for name in ("r0", "r1")
        for s in steps(tmp_path / "p", name)[1:]
        for op in s.get("ops", [])
        if op["op"] == "preempt"
    ]
    assert len(preempts) == fleet["stats"]["preempted"]
    for name in ("r0", "r1"):
        result: Any = Cli(tmp_path)("replay", f"p/replica={name}/steps.jsonl")
        assert result.exit_code == 0 and "no invariant broken" in result.output, result.output
