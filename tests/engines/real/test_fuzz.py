"""pagedkv_sql.fuzz on the real vLLM KVCacheManager and the real SGLang allocator,
ReqToTokenPool and RadixCache (issue 27 item 4): the unmodified engines are clean and
reach prefix hits, preemptions and evictions; each planted bug is found and shrunk, with a
fixed seed and budget; `pagedkv-sql fuzz` writes the shrunk schedule as a step log that
`replay` reads, naming the step the fuzzer failed at."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pagedkv_sql.cli import fuzz as cli_fuzz
from pagedkv_sql.fuzz import core
from pagedkv_sql.fuzz import sglang as fuzz_sglang
from pagedkv_sql.fuzz import vllm as fuzz_vllm

from .conftest import STANDINS, engine_modules

engine_modules("vllm.v1.core.kv_cache_manager", "sglang.srt.mem_cache.radix_cache", "hypothesis")

ENGINES = {"vllm": fuzz_vllm, "sglang": fuzz_sglang}
CASES = [(name, bug) for name, module in ENGINES.items() for bug in module.PLANTS]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("chunk", "lookahead"), [(0, 0), (3, 2)])
def test_unmodified_engine_is_clean(engine: str, chunk: int, lookahead: int) -> None:
    out = ENGINES[engine].fuzz(
        examples=50, steps=20, seconds=120, seed=1, chunk=chunk, lookahead=lookahead
    )
    assert out.kind is None, out.message
    assert out.stats.examples >= 50
    for counter in core.COVERAGE:  # deep enough to mean something
        assert out.stats.counts[counter], (counter, out.stats.line())


@pytest.mark.parametrize(("engine", "bug"), CASES)
def test_planted_bug_is_found_and_shrunk(engine: str, bug: str) -> None:
    out = ENGINES[engine].fuzz(examples=600, steps=30, seconds=120, seed=1, plant=bug)
    assert out.kind == "finding", (bug, out.kind, out.message)
    assert 1 <= len(out.schedule) <= 4, out.schedule


def test_the_cli_knows_each_engines_plants() -> None:
    assert [b.value for b in cli_fuzz.VLLMBug] == list(fuzz_vllm.PLANTS)
    assert [b.value for b in cli_fuzz.SGLangBug] == list(fuzz_sglang.PLANTS)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The installed command, as a user runs it (the torchvision stand-in on the path for
    SGLang's imports, as in the tier's conftest)."""
    env = {**os.environ, "PYTHONPATH": str(STANDINS), "TRITON_INTERPRET": "1"}
    command = [str(Path(sys.executable).with_name("pagedkv-sql")), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


# the planted bugs whose effect a step log carries (ref_cnt and free counts observed,
# blocks handed back twice, pages lost); the others are found by the fuzzer's checks only
REPLAYED = [
    ("vllm", "skip_decrement"),
    ("vllm", "double_free"),
    ("vllm", "touch_keeps_queued"),
    ("sglang", "leak_page"),
    ("sglang", "lock_once"),
]


@pytest.mark.parametrize(("engine", "bug"), REPLAYED)
def test_the_shrunk_schedule_replays_to_its_step(tmp_path: Path, engine: str, bug: str) -> None:
    run = cli("fuzz", engine, "--plant", bug, "--seed", "1", "--examples", "600", cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert "FAILED: finding, shrunk to" in run.stderr
    log = tmp_path / f"fuzz-{engine}.jsonl"
    said = [line for line in run.stderr.splitlines() if line.startswith("step log: ")]
    assert said and "finds nothing" not in said[0], run.stderr
    failed_at = int(said[0].split("(the failure at its step ")[1].split(")")[0])
    replay = cli("replay", str(log), "--db", ":memory:", cwd=tmp_path)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert f"step {failed_at}" in replay.stdout, (failed_at, replay.stdout)


def test_a_clean_run_prints_its_coverage(tmp_path: Path) -> None:
    run = cli("fuzz", "sglang", "--examples", "10", "--steps", "10", "--seed", "2", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stderr.startswith("fuzz sglang: 10 examples, ")
    for counter in core.COVERAGE:
        assert f"{counter} " in run.stderr
    assert not (tmp_path / "fuzz-sglang.jsonl").exists()
