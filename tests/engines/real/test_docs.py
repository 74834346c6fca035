"""The README's sessions on the real engines: `pagedkv-sql fuzz` and the
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
README = (Path(__file__).resolve().parents[3] / "README.md").read_text()
SECTION = README.split("## Fuzzing an engine's KV manager", 1)[1].split("\n## ", 1)[0]


def test_the_readme_session_runs_as_shown(tmp_path: Path) -> None:
    import vllm

    if vllm.__version__ != "0.32.0":
        pytest.skip("the README shows vLLM 0.32.0's run; the fuzz suite covers this one")
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


def test_the_readme_assert_consistent_example(capsys: pytest.CaptureFixture[str]) -> None:
    code = re.search(r"```python engines\n(.*?)```", SECTION, re.S)
    shown = re.search(r"```text\n(.*?)```", SECTION, re.S)
    assert code is not None and shown is not None
    exec(compile(code.group(1), "README.md", "exec"), {})
    assert capsys.readouterr().out == shown.group(1)
