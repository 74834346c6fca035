"""Every extra-gated command names the extra to install when its modules are missing,
never a traceback (such as `ModuleNotFoundError: sqlglot` from `pagedkv-sql spark ...`
without the spark extra). Each case hides the modules with a meta-path blocker in
a subprocess of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BLOCKER = """
import runpy, sys
blocked = set(sys.argv[1].split(","))
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Blocker())
sys.argv = ["pagedkv-sql", *sys.argv[2:]]
runpy.run_module("pagedkv_sql", run_name="__main__")
"""


@pytest.mark.parametrize(
    ("hidden", "command", "extra"),
    [
        ("pyspark,sqlglot", ["spark", "resolve", "--input", ".", "-o", "out"], "spark"),
        ("sqlglot", ["spark", "check", "--input", "."], "spark"),
        ("matplotlib,plotly", ["map", "-o", "m.png", "--db", ":memory:"], "report"),
        ("msgspec,msgpack", ["kv-events", "e.msgpack"], "events"),
        ("msgspec,msgpack", ["watch", "e.msgpack"], "events"),
        ("safetensors", ["import", "vllm", "s.safetensors"], "engines"),
        ("hypothesis", ["fuzz", "vllm"], "fuzz"),
        ("hypothesis", ["fuzz", "sglang", "--plant", "leak_page"], "fuzz"),
    ],
)
def test_a_missing_extra_is_named_not_a_traceback(
    tmp_path: Path, hidden: str, command: list[str], extra: str
) -> None:
    (tmp_path / "e.msgpack").write_bytes(b"\x93\x01\x90\xc0")  # [1, [], nil]: a batch
    (tmp_path / "s.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKER, hidden, *command],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("Error: ")
    assert f"pip install 'pagedkv-sql[{extra}]'" in proc.stderr


def test_export_parquet_needs_no_spark_extra(tmp_path: Path) -> None:
    # writing Parquet is DuckDB's: the spark extra's sqlglot is imported only for --partition
    command = ["export", "parquet", "out", "--db", ":memory:"]
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKER, "pyspark,sqlglot", *command],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "pagedkv_settings").is_dir()


@pytest.mark.parametrize(
    ("engine", "fix"), [("vllm", "pip install vllm"), ("sglang", "pip install sglang")]
)
def test_fuzz_without_the_engine_names_it(tmp_path: Path, engine: str, fix: str) -> None:
    # `pagedkv-sql fuzz ENGINE` drives the real engine: without it, what to install, exit 2
    # (a missing dependency of a command, as a missing extra is everywhere)
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKER, "vllm,sglang", "fuzz", engine],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"Error: pagedkv-sql fuzz needs {engine}")
    assert f"Fix: {fix}" in proc.stderr
    assert not list(tmp_path.iterdir())  # no step log written
