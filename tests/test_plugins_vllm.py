"""The vLLM plugin is inert unless PAGEDKV_STEP_LOG is set (it is loaded in
every vLLM process, the API server's too), and names one log per engine process. Its work
inside a real engine is tested by the serving tier (tests/serving)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from pagedkv_sql.plugins import vllm as vllm_plugin


def test_the_entry_point_is_registered_for_vllm() -> None:
    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "pagedkv_sql"]
    assert ep.load() is vllm_plugin.register


def test_without_the_variable_the_plugin_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGEDKV_STEP_LOG", raising=False)
    code = (
        "import sys; from pagedkv_sql.plugins import vllm as plugin; plugin.register(); "
        "assert plugin.start(object()) is None; "
        "assert not [m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch', 'duckdb')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pid_in_the_log_path_is_the_process_id() -> None:
    assert vllm_plugin.log_path("/logs/vllm-{pid}.jsonl", pid=42).name == "vllm-42.jsonl"
    assert vllm_plugin.log_path("run.jsonl").name == "run.jsonl"
