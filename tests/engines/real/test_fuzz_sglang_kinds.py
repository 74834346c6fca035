"""``fuzz sglang --kind swa|pure_swa|mamba`` (pagedkv_sql/fuzz/sglang_kinds.py) on SGLang's
real sliding-window allocator and UnifiedRadixCache(FULL, SWA), its all-sliding-window
allocator and PureSWARadixCache, and its Mamba state slots with UnifiedRadixCache(FULL,
MAMBA), through its ScheduleBatch: the unmodified engine is clean
and reaches prefix hits, preemptions, evictions (and window frees); the
swa_free_inside_window plant is found as unresolved_token and shrunk, its log not written
(replay does not model the second pool) and the run says why; a plant, a block size and
--chunk refused on a run that cannot have them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedkv_sql import invariants
from pagedkv_sql.errors import UsageError
from pagedkv_sql.fuzz import sglang as fuzz_sglang

from ...helpers import Cli
from .helpers import engine_modules

engine_modules("sglang.srt.mem_cache.allocator.swa", "hypothesis")

PLANT = "swa_free_inside_window"


def test_the_unmodified_sliding_window_cache_is_clean() -> None:
    out = fuzz_sglang.fuzz(examples=60, steps=20, seconds=300, seed=1, kind="swa")
    assert out.kind is None, out.message
    assert out.stats.examples >= 60
    for counter in ("prefix hits", "preemptions", "evictions", "window frees", "decodes"):
        assert out.stats.counts[counter], (counter, out.stats.line())


def test_the_unmodified_mamba_cache_is_clean() -> None:
    out = fuzz_sglang.fuzz(
        examples=60, steps=20, seconds=300, seed=1, kind="mamba", block_size=1, num_blocks=64
    )
    assert out.kind is None, out.message
    for counter in ("prefix hits", "preemptions", "evictions", "decodes"):
        assert out.stats.counts[counter], (counter, out.stats.line())


def test_the_unmodified_all_sliding_window_cache_is_clean() -> None:
    out = fuzz_sglang.fuzz(
        examples=60, steps=20, seconds=300, seed=1, kind="pure_swa", block_size=1, num_blocks=64
    )
    assert out.kind is None, out.message
    for counter in ("prefix hits", "preemptions", "evictions", "window frees", "decodes"):
        assert out.stats.counts[counter], (counter, out.stats.line())


def test_a_slot_freed_inside_the_all_sliding_window_is_found_and_shrunk(tmp_path: Path) -> None:
    log = tmp_path / "shrunk.jsonl"
    out = fuzz_sglang.fuzz(
        examples=600,
        steps=10,
        seconds=60,
        seed=1,
        kind="pure_swa",
        plant=PLANT,
        block_size=1,
        num_blocks=64,
        log=log,
    )
    assert out.kind == "finding", (out.kind, out.message)
    assert 1 <= len(out.schedule) <= 6, out.schedule
    assert out.ideas == ("unresolved_token",), out.message
    assert "KV-cache group 0 (sliding_window" in out.message
    assert out.unreplayable and "window frees" in out.unreplayable
    assert out.replayed is None and not log.exists()


def test_an_swa_page_freed_inside_the_window_is_found_and_shrunk(tmp_path: Path) -> None:
    log = tmp_path / "shrunk.jsonl"
    out = fuzz_sglang.fuzz(
        examples=600, steps=10, seconds=60, seed=1, kind="swa", plant=PLANT, log=log
    )
    # found within the minute, and shrunk to a few steps by then (SGLang 0.5.21's allocator
    # runs its Triton kernels interpreted on a CPU: on a busy machine the shrinking may not
    # have ended, the schedule is the shortest found)
    assert out.kind == "finding", (out.kind, out.message)
    assert 1 <= len(out.schedule) <= 6, out.schedule
    assert out.ideas == (invariants.planted_by("plant", PLANT, "sglang").name,), out.message
    assert out.ideas == ("unresolved_token",)
    assert "KV-cache group 1 (sliding_window" in out.message
    assert out.unreplayable and "second pool" in out.unreplayable
    assert out.replayed is None and not log.exists()


def test_a_kind_plant_needs_its_kind_and_swa_takes_no_chunk() -> None:
    calls = "the swa and pure_swa caches call, which --kind full never calls"
    with pytest.raises(UsageError, match=calls):
        fuzz_sglang.fuzz(examples=1, steps=1, seconds=5, seed=1, plant=PLANT)
    with pytest.raises(UsageError, match="--chunk and --lookahead are not modelled"):
        fuzz_sglang.fuzz(examples=1, steps=1, seconds=5, seed=1, kind="swa", chunk=2)
    with pytest.raises(UsageError, match="no KV-cache kind 'mamba2'"):
        fuzz_sglang.fuzz(examples=1, steps=1, seconds=5, seed=1, kind="mamba2")
    with pytest.raises(UsageError, match="--kind mamba takes --block-size 1, not 4"):
        fuzz_sglang.fuzz(examples=1, steps=1, seconds=5, seed=1, kind="mamba")
    with pytest.raises(UsageError, match="--kind pure_swa takes --block-size 1, not 4"):
        fuzz_sglang.fuzz(examples=1, steps=1, seconds=5, seed=1, kind="pure_swa")
    with pytest.raises(UsageError, match="--kind swa never calls"):
        fuzz_sglang.fuzz(examples=1, steps=1, seconds=5, seed=1, kind="swa", plant="lock_once")


def test_the_cli_runs_the_kind_and_names_it(tmp_path: Path) -> None:
    run = Cli(tmp_path)(*("fuzz", "sglang", "--kind", "swa", "--examples", "5", "--seed", "1"))
    assert run.exit_code == 0, run.output  # type: ignore[attr-defined]
    err = run.stderr  # type: ignore[attr-defined]
    assert err.startswith("fuzz sglang (swa): 5 examples"), err
    run = Cli(tmp_path)("fuzz", "sglang", "--plant", PLANT, "--time", "5")
    assert run.exit_code == 2, run.output  # type: ignore[attr-defined]
    assert "--kind swa" in run.output  # type: ignore[attr-defined]
