"""docs/fuzz.md's sessions on the real engines: `pagedkv-sql fuzz` and the
`assert_consistent` example run as shown."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ...helpers import console_blocks
from .helpers import STANDINS, engine_modules

engine_modules("vllm.v1.core.kv_cache_manager", "sglang.srt.mem_cache.radix_cache", "hypothesis")
PAGE = (Path(__file__).resolve().parents[3] / "docs" / "fuzz.md").read_text()
SECTION = PAGE.split("\n## ", 1)[0]  # the page's opening, before its reference sections


def test_the_fuzz_session_runs_as_shown(tmp_path: Path) -> None:
    import vllm

    if vllm.__version__ != "0.32.0":
        pytest.skip("docs/fuzz.md shows vLLM 0.32.0's run; the fuzz suite covers this one")
    (block,) = console_blocks(SECTION, "console engines")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(STANDINS),
        "TRITON_INTERPRET": "1",
    }
    for command, expected in block:
        run = subprocess.run(
            command + " 2>&1", shell=True, cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert run.stdout == expected, command


def test_the_assert_consistent_example(capsys: pytest.CaptureFixture[str]) -> None:
    code = re.search(r"```python engines\n(.*?)```", SECTION, re.S)
    shown = re.search(r"```text\n(.*?)```", SECTION, re.S)
    assert code is not None and shown is not None
    exec(compile(code.group(1), "fuzz.md", "exec"), {})
    assert capsys.readouterr().out == shown.group(1)
