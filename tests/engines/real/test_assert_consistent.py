"""`assert_consistent` and the pytest plugin's `kv_consistency` fixture on the real vLLM
0.32.0 and SGLang 0.5.21 managers: silent on healthy states, an
AssertionError naming request and block ids on a broken one, and the fixture checking a
registered manager at the end of a test that used it (in a pytest run of its own, the
plugin loaded through its installed entry point)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pagedkv_sql.engines import sglang, vllm

from .sglang_driver import Scheduler as SGLang
from .vllm_driver import Scheduler as VLLM

ROOT = Path(__file__).resolve().parents[3]


def test_vllm_healthy_and_a_double_free() -> None:
    e = VLLM(num_blocks=8, block_size=4)
    e.admit("a", [1, 2, 3, 4])  # 5 tokens on 1 block: the sampled token not computed yet
    vllm.assert_consistent(e.manager, e.requests)
    vllm.assert_consistent(e.manager)  # without requests: every slot a token
    e.admit("b", [9, 8, 7, 6, 5])
    held = list(e.manager.coordinator.single_type_managers[0].req_to_blocks["b"])
    e.pool.free_blocks(held[-1:])  # b's last block back to the free queue while b holds it
    with pytest.raises(AssertionError) as info:
        vllm.assert_consistent(e.manager, e.requests)
    text = str(info.value)
    assert text.startswith("vLLM KV cache is inconsistent: 2 finding(s)\n")
    assert (
        f"diag_engine_held_free_block: request b holds block {held[-1].block_id}, which is "
        f"in the free queue at position" in text
    )
    assert f"[request b; block {held[-1].block_id}]" in text


def test_vllm_a_state_that_cannot_be_mapped() -> None:
    e = VLLM(num_blocks=8, block_size=4)
    e.admit("a", [1, 2, 3])
    e.requests["a"].num_computed_tokens = 6
    with pytest.raises(AssertionError, match="vLLM KV cache state cannot be mapped") as info:
        vllm.assert_consistent(e.manager, e.requests)
    assert "request 'a': num_computed_tokens 6 but it holds 1 block(s) of 4 slots" in str(
        info.value
    )


def test_sglang_healthy_and_a_leaked_page() -> None:
    e = SGLang(num_pages=8, rows=4, page_size=4)
    e.schedule("a", [*range(8), 100])
    e.cache_prefix("a", 8)
    args = (e.rtt, e.allocator, e.tree)
    sglang.assert_consistent(*args, seq_lens=e.seq_lens(), request_ids=e.request_ids())
    r = e.running.pop("a")
    e.tree.dec_lock_ref(r.node)
    e.rtt.free_rows([r.row])  # its last page never freed
    with pytest.raises(AssertionError) as info:
        sglang.assert_consistent(*args, seq_lens=e.seq_lens(), request_ids=e.request_ids())
    page = int(r.slots[8]) // 4
    assert f"diag_engine_page_conservation: page {page} is neither free" in str(info.value)
    assert f"[block {page}]" in str(info.value)


PLUGIN_TESTS = """
from tests.engines.real.vllm_driver import Scheduler
from tests.engines.real.sglang_driver import Scheduler as SGLang


def test_healthy(kv_consistency):
    e = Scheduler(num_blocks=8, block_size=4)
    kv_consistency.vllm(e.manager, e.requests)
    e.admit("a", [1, 2, 3, 4])
    e.step("a")


def test_freed_while_held(kv_consistency):
    e = Scheduler(num_blocks=8, block_size=4)
    kv_consistency.vllm(e.manager, e.requests)
    e.admit("a", [1, 2, 3, 4, 5])
    held = e.manager.coordinator.single_type_managers[0].req_to_blocks["a"]
    e.pool.free_blocks(held[-1:])


def test_sglang_leak(kv_consistency):
    e = SGLang(num_pages=8, rows=4, page_size=4)
    kv_consistency.sglang(
        e.rtt, e.allocator, e.tree, seq_lens=e.seq_lens, request_ids=e.request_ids
    )
    e.schedule("q", [1, 2, 3, 4, 5])
    e.running.pop("q")  # forgotten: its row and pages are never freed


def test_no_manager():
    pass
"""


def test_the_fixture_checks_each_manager_after_its_test(tmp_path: Path) -> None:
    (tmp_path / "test_engine.py").write_text(PLUGIN_TESTS)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:randomly",
            "-p",
            "no:cacheprovider",
            "-q",
            "-W",
            "ignore::DeprecationWarning",
            "-W",
            "ignore::FutureWarning",
            "test_engine.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    assert "4 passed, 2 errors" in out, out
    assert "ERROR at teardown of test_freed_while_held" in out
    assert "diag_engine_held_free_block: request a holds block 2" in out
    assert "ERROR at teardown of test_sglang_leak" in out
    assert "diag_engine_page_conservation: page 1 is neither free" in out  # row q's page
