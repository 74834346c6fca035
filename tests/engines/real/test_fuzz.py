"""pagedkv_sql.fuzz on the real vLLM KVCacheManager (issue 27 item 4): the unmodified
engine is clean; each planted bug is found and shrunk, with a fixed seed and budget."""

from __future__ import annotations

import pytest

from pagedkv_sql.fuzz import vllm as fuzz_vllm

from .conftest import engine_modules

engine_modules("vllm.v1.core.kv_cache_manager", "hypothesis")


def test_unmodified_vllm_is_clean() -> None:
    out = fuzz_vllm.fuzz(examples=50, steps=20, seconds=60, seed=1)
    assert out.kind is None, out.message
    assert out.stats.counts["prefix hits"] and out.stats.counts["preemptions"]


@pytest.mark.parametrize("bug", fuzz_vllm.PLANTS)
def test_planted_bug_is_found_and_shrunk(bug: str) -> None:
    out = fuzz_vllm.fuzz(examples=600, steps=30, seconds=120, seed=1, plant=bug)
    assert out.kind == "finding", (bug, out.kind, out.message)
    assert 1 <= len(out.schedule) <= 4, out.schedule
