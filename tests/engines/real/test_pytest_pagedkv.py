"""pytest_pagedkv.py: the plugin's `kv_consistency` fixture checks a registered real
manager at the end of the test that used it (in a pytest run of its own, the plugin
loaded through its installed entry point)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


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
    assert "use_after_free (diag_engine_held_free_block): request a holds block 2" in out
    assert "ERROR at teardown of test_sglang_leak" in out
    assert "leak (diag_engine_leak): page 1 is neither free" in out  # row q's page
