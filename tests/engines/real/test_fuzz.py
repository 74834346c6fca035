"""pagedkv_sql.fuzz on the real vLLM KVCacheManager and the real SGLang allocator,
ReqToTokenPool and RadixCache: the unmodified engines are clean and
reach prefix hits, preemptions and evictions; each planted bug is found and shrunk, with a
fixed seed and budget; `pagedkv-sql fuzz` writes the shrunk schedule as a step log that
`replay` reads, naming the step the fuzzer failed at."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pagedkv_sql import invariants
from pagedkv_sql.cli import fuzz as cli_fuzz
from pagedkv_sql.fuzz import core
from pagedkv_sql.fuzz import sglang as fuzz_sglang
from pagedkv_sql.fuzz import vllm as fuzz_vllm

from ...helpers import Cli
from .helpers import STANDINS, engine_modules

engine_modules("vllm.v1.core.kv_cache_manager", "sglang.srt.mem_cache.radix_cache", "hypothesis")


ENGINES = {"vllm": fuzz_vllm, "sglang": fuzz_sglang}


# the plants of KV-cache kinds (a window's manager, the null block) have tests of their own
KIND_PLANTS = {"window_free_inside", "null_block_handed", "swa_free_inside_window"}
CASES = [
    (name, bug)
    for name, module in ENGINES.items()
    for bug in module.PLANTS
    if bug not in KIND_PLANTS
]


@pytest.mark.parametrize("engine", ENGINES)
def test_unmodified_engine_is_clean(engine: str) -> None:
    out = ENGINES[engine].fuzz(examples=50, steps=20, seconds=300, seed=1)
    assert out.kind is None, out.message
    assert out.stats.examples >= 50
    for counter in core.COVERAGE:  # deep enough to mean something
        assert out.stats.counts[counter], (counter, out.stats.line())


@pytest.mark.parametrize("engine", ENGINES)
def test_chunked_prefill_and_lookahead_are_clean(engine: str) -> None:
    out = ENGINES[engine].fuzz(examples=50, steps=20, seconds=300, seed=1, chunk=3, lookahead=2)
    assert out.kind is None, out.message
    for counter in ("prefill chunks", "decodes", "prefix hits", "preemptions"):
        assert out.stats.counts[counter], (counter, out.stats.line())


# a stale prefix-cache entry needs a small pool of small blocks, a block cached, evicted,
# reused and hit again: random draws reach it in some runs only (the same seed explored
# otherwise inside the whole tier), so these knobs are those of its stored schedule
# (fuzz/vllm.py's STORED), tried first: found every time
KNOBS: dict[tuple[str, str], dict[str, Any]] = {
    ("vllm", "stale_hash_entry"): {"num_blocks": 8, "block_size": 2},
}


@pytest.mark.parametrize(("engine", "bug"), CASES)
def test_planted_bug_is_found_shrunk_and_replayed_at_its_step_as_its_idea(
    tmp_path: Path, engine: str, bug: str
) -> None:
    """The shrunk schedule's step log witnesses what the in-memory check saw: replay's
    first finding is at the step the check failed, and is the planted idea (the check's
    own idea, or a cause the catalogue gives it: a double free behind a ref_cnt)."""
    log = tmp_path / "shrunk.jsonl"
    knobs: dict[str, Any] = {"seconds": 300, **KNOBS.get((engine, bug), {})}
    out = ENGINES[engine].fuzz(examples=600, steps=15, seed=1, plant=bug, log=log, **knobs)
    assert out.kind == "finding", (bug, out.kind, out.message)
    # 2-4 steps, but a stale entry needs a block cached, evicted, reused and hit again
    longest = 15 if out.cut_short or bug == "stale_hash_entry" else 6
    assert 1 <= len(out.schedule) <= longest, out.schedule
    assert out.log_step is not None and log.exists()
    planted = invariants.planted_by("plant", bug, engine).name
    assert out.replayed is not None, out.message
    assert (out.replayed.step, out.replayed.idea) == (out.log_step, planted), (
        out.replayed,
        out.message,
    )
    assert out.same_step and out.same_idea, (out.ideas, out.replayed)
    assert out.stored == (bug == "stale_hash_entry"), out.stored


def test_a_stored_schedule_finds_only_its_plant() -> None:
    """The stale entry's stored schedule runs clean on the unmodified engine (what it finds
    is the plant's), and with other knobs it is not tried: random draws alone."""
    ((knobs, (schedule,)),) = fuzz_vllm.STORED.items()
    plant, _, num_blocks, block_size, chunk, lookahead = knobs
    calls = [core.Call(rule, rule, dict(args)) for rule, args in schedule]

    def make(stats: core.Stats) -> Any:
        return fuzz_vllm.machine(num_blocks, block_size, chunk, lookahead, stats)

    assert core.run_stored(make, calls, core.Stats()) is None
    out = fuzz_vllm.fuzz(examples=1, steps=2, seconds=300, seed=1, plant=plant,
                         num_blocks=num_blocks + 1, block_size=block_size)  # fmt: skip
    assert not out.stored and out.stats.examples == 1, out.message


def test_time_bounds_the_run_and_the_shrinking_and_the_cut_is_reported(tmp_path: Path) -> None:
    """--time ends the run, shrinking included: 100,000 examples stop at the deadline
    (checked at every step of a schedule); when the stale entry is found (it needs a block
    cached, evicted, reused and hit again, and shrinks for minutes), the schedule as shrunk
    by then is reported, its step log replayed. A pool of 9 blocks has no stored schedule:
    whether random draws get there within 30 s is not fixed (the machine's load, the
    process's state): the deadline holds either way."""
    seconds = 30
    t0 = time.perf_counter()
    run = Cli(tmp_path)(
        *("fuzz", "vllm", "--plant", "stale_hash_entry", "--pool-blocks", "9"),
        *("--block-size", "2", "--steps", "15", "--examples", "100000", "--seed", "1"),
        *("--time", str(seconds), "-o", "cut.jsonl"),
    )
    elapsed = time.perf_counter() - t0
    assert elapsed < seconds + 30, elapsed  # the deadline, then the log written and replayed
    err = run.stderr  # type: ignore[attr-defined]
    if run.exit_code == 0:  # type: ignore[attr-defined]
        assert f"no failure: examples ran until --time {seconds} was spent" in err, err
        assert not (tmp_path / "cut.jsonl").exists()
        return
    assert run.exit_code == 1, run.output  # type: ignore[attr-defined]
    assert f"FAILED: finding, cut short by --time {seconds} with" in err, err
    assert "not fully shrunk" in err
    assert "`pagedkv-sql replay` finds prefix_hash at step" in err, err
    assert "the in-memory check's step and idea" in err
    assert (tmp_path / "cut.jsonl").exists()


def test_time_is_the_time_given_and_examples_end_it_only_when_given(tmp_path: Path) -> None:
    """Without --examples a clean run goes on until --time is spent (hundreds of examples
    a second here would end any fixed count first); with it, the run says that the count,
    not the time, ended it."""
    seconds = 12
    t0 = time.perf_counter()
    run = Cli(tmp_path)("fuzz", "vllm", "--steps", "5", "--seed", "1", "--time", str(seconds))
    elapsed = time.perf_counter() - t0
    err = run.stderr  # type: ignore[attr-defined]
    assert run.exit_code == 0, err  # type: ignore[attr-defined]
    assert elapsed >= seconds, (elapsed, err)
    assert f"no failure: examples ran until --time {seconds} was spent" in err, err
    run = Cli(tmp_path)(
        *("fuzz", "vllm", "--steps", "5", "--seed", "1", "--time", "120", "--examples", "30")
    )
    err = run.stderr  # type: ignore[attr-defined]
    assert run.exit_code == 0, err  # type: ignore[attr-defined]
    assert int(re.findall(r"^fuzz vllm: (\d+) examples,", err, re.M)[0]) >= 30, err
    assert "no failure: the 30 examples of --examples ran before --time 120 was spent" in err


def test_a_window_free_is_judged_against_the_tokens_at_that_moment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An engine that frees a sliding window's blocks one token early (it calls
    ``remove_skipped_blocks`` with one computed token more than the request holds): by
    the end of the step the window has moved past the block, so only a check at the free
    itself sees it, as the catalogue's unresolved token."""
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager

    remove = SlidingWindowManager.remove_skipped_blocks

    def early(self: Any, request_id: str, processed: int, *args: Any, **kwargs: Any) -> None:
        remove(self, request_id, processed + 1, *args, **kwargs)

    monkeypatch.setattr(SlidingWindowManager, "remove_skipped_blocks", early)
    out = fuzz_vllm.fuzz(examples=600, steps=15, seconds=120, seed=1, kind="sliding")
    assert out.kind == "finding", (out.kind, out.message)
    assert out.ideas == ("unresolved_token",), out.message
    assert "right after a window free of request" in out.message, out.message


def test_the_cli_knows_each_engines_plants() -> None:
    assert [b.value for b in cli_fuzz.VLLMBug] == list(fuzz_vllm.PLANTS)
    assert [b.value for b in cli_fuzz.SGLangBug] == list(fuzz_sglang.PLANTS)
    assert [k.value for k in cli_fuzz.VLLMKind] == list(fuzz_vllm.KINDS)
    assert set(KIND_PLANTS) <= set(fuzz_vllm.PLANTS) | set(fuzz_sglang.PLANTS)


@pytest.mark.parametrize("kind", [k for k in fuzz_vllm.KINDS if k != "full"])
def test_each_kv_cache_kind_is_clean_under_the_real_coordinator(kind: str) -> None:
    """The in-memory check is silent on the unmodified managers of each kind, with prefix
    hits, preemptions and (each kind but full attention has them) window frees reached."""
    out = fuzz_vllm.fuzz(examples=50, steps=20, seconds=300, seed=1, kind=kind)
    assert out.kind is None, out.message
    for counter in ("prefix hits", "preemptions", "window frees"):
        assert out.stats.counts[counter], (counter, out.stats.line())


# (plant, kind, what replay finds first at the failing step: None where replay refuses the
# kind's log). The null block in the free queue is outside_pool in memory; replay reads it
# as one free block too many (free_count) at that step.
KIND_CASES = [
    ("window_free_inside", "sliding", "unresolved_token"),
    ("window_free_inside", "hybrid", "unresolved_token"),
    ("null_block_handed", "full", "free_count"),
    ("null_block_handed", "chunked", "free_count"),
    ("null_block_handed", "mamba", None),
]


@pytest.mark.parametrize(("bug", "kind", "replay_idea"), KIND_CASES)
def test_a_kind_plant_is_found_and_shrunk_and_its_log_replayed_or_refused(
    tmp_path: Path, bug: str, kind: str, replay_idea: str | None
) -> None:
    # the bound only ends a run that would not finish: a loaded machine shrinks slowly
    log = tmp_path / "shrunk.jsonl"
    out = fuzz_vllm.fuzz(examples=600, steps=15, seconds=180, seed=1, kind=kind, plant=bug, log=log)
    assert out.kind == "finding" and not out.cut_short, (out.kind, out.message)
    assert 1 <= len(out.schedule) <= 6, out.schedule
    assert out.ideas == (invariants.planted_by("plant", bug, "vllm").name,), out.message
    if replay_idea is None:  # replay refuses the kind's groups: no log, and why
        assert out.unreplayable and "KV-cache group" in out.unreplayable, out.unreplayable
        assert out.replayed is None and not log.exists()
        return
    assert out.unreplayable is None and log.exists()
    assert out.replayed is not None, out.message
    assert (out.replayed.step, out.replayed.idea) == (out.log_step, replay_idea), out.replayed


def test_a_kind_plant_needs_its_kind_and_the_cli_says_when_a_log_cannot_be_replayed(
    tmp_path: Path,
) -> None:
    run = Cli(tmp_path)("fuzz", "vllm", "--plant", "window_free_inside", "--time", "5")
    assert run.exit_code == 2, run.output  # type: ignore[attr-defined]
    assert "--kind sliding or --kind hybrid" in run.output  # type: ignore[attr-defined]
    run = Cli(tmp_path)(
        *("fuzz", "vllm", "--kind", "mamba", "--plant", "null_block_handed", "--seed", "1"),
        *("--steps", "15", "--time", "60", "-o", "mamba.jsonl"),
    )
    assert run.exit_code == 1, run.output  # type: ignore[attr-defined]
    err = run.stderr  # type: ignore[attr-defined]
    assert re.search(r"^fuzz vllm \(mamba\) with null_block_handed planted: ", err, re.M), err
    assert "no step log written: `pagedkv-sql replay` cannot replay this engine's log" in err
    assert "replay` finds" not in err, err
    assert not (tmp_path / "mamba.jsonl").exists()


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The installed command, as a user runs it (the torchvision stand-in on the path for
    SGLang's imports, as in the tier's conftest)."""
    env = {**os.environ, "PYTHONPATH": str(STANDINS), "TRITON_INTERPRET": "1"}
    command = [str(Path(sys.executable).with_name("pagedkv-sql")), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_a_clean_run_prints_its_coverage(tmp_path: Path) -> None:
    run = cli("fuzz", "sglang", "--examples", "10", "--steps", "10", "--seed", "2", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    # (SGLang 0.5.23's import logs that vllm._C is missing first: the engine's own line)
    assert re.search(r"^fuzz sglang: \d+ examples, \d+ states", run.stderr, re.M), run.stderr
    for counter in core.COVERAGE:
        assert f"{counter} " in run.stderr
    assert not (tmp_path / "fuzz-sglang.jsonl").exists()


def test_a_run_that_ran_no_example_says_nothing_was_checked(tmp_path: Path) -> None:
    """A --time the engine's set-up uses up runs no example: never "no failure"."""
    run = Cli(tmp_path)("fuzz", "vllm", "--time", "0.001")
    assert run.exit_code == 2, run.output  # type: ignore[attr-defined]
    assert "no example ran within --time 0.001" in run.output  # type: ignore[attr-defined]
    assert "nothing was checked" in run.output and "no failure" not in run.output  # type: ignore[attr-defined]
