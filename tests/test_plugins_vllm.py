"""The vLLM plugin is inert unless PAGEDKV_STEP_LOG is set (it is loaded in
every vLLM process, the API server's too), names one log per engine process, makes what
pagedkv_sql logs reach the server's output once (vLLM configures only its own logger), and
reads its settings strictly. Its work inside a real engine is tested by the serving tier
(tests/serving)."""

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


# vLLM configures its own logger only (vllm/logger.py: a StreamHandler on stdout, propagate
# False); the root logger keeps no handler. This is that configuration, then the plugin.
VLLM_LOGGING = """
import logging, sys
vllm = logging.getLogger("vllm")
handler = logging.StreamHandler(sys.stdout)
handler.setFormatter(logging.Formatter("VLLM %(levelname)s [%(filename)s] %(message)s"))
vllm.addHandler(handler)
vllm.setLevel(logging.INFO)
vllm.propagate = False
"""
SAY = """
from pagedkv_sql.plugins import vllm as plugin
plugin.heard(); plugin.heard()  # twice: still one handler
logging.getLogger("pagedkv_sql.record").error("pagedkv-sql: the recorder stopped")
logging.getLogger("pagedkv_sql.plugins.vllm").info("pagedkv-sql: recording to x")
"""


def said(setup: str) -> tuple[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", "import logging\n" + setup + SAY],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout, done.stderr


def test_inside_vllm_a_record_reaches_the_servers_log_once_in_its_format() -> None:
    out, err = said(VLLM_LOGGING)
    assert out.count("pagedkv-sql: the recorder stopped") == 1, out
    assert "VLLM ERROR [<string>] pagedkv-sql: the recorder stopped" in out
    assert "VLLM INFO [<string>] pagedkv-sql: recording to x" in out
    assert err == ""


def test_a_host_that_configured_logging_gets_each_record_once_and_only_there() -> None:
    out, err = said(VLLM_LOGGING + "logging.basicConfig(format='HOST %(message)s')\n")
    assert err.count("pagedkv-sql: the recorder stopped") == 1, err
    assert "HOST pagedkv-sql: the recorder stopped" in err
    assert "pagedkv-sql" not in out


def test_with_no_logging_configured_an_error_still_reaches_stderr_once() -> None:
    out, err = said("")
    assert err.count("pagedkv-sql: the recorder stopped") == 1, err
    assert out == ""


def test_without_the_plugin_the_library_stays_silent() -> None:
    code = "import logging, pagedkv_sql\nlogging.getLogger('pagedkv_sql.record').error('x')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@pytest.mark.parametrize(
    ("text", "steps"), [("", 0), ("  ", 0), ("0", 0), ("25", 25), (" 2 ", 2), ("007", 7)]
)
def test_a_steps_setting_is_a_whole_number(
    monkeypatch: pytest.MonkeyPatch, text: str, steps: int
) -> None:
    monkeypatch.setenv("PAGEDKV_SNAPSHOT_EVERY", text)
    assert vllm_plugin.number_setting("PAGEDKV_SNAPSHOT_EVERY", 0, "steps") == steps


@pytest.mark.parametrize("text", ["abc", "1.5", "-1", "1e3", "+3", "2 5", "9" * 19, "٣"])
def test_anything_else_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv("PAGEDKV_SNAPSHOT_EVERY", text)
    with pytest.raises(vllm_plugin.BadSetting) as e:
        vllm_plugin.number_setting("PAGEDKV_SNAPSHOT_EVERY", 0, "steps")
    assert str(e.value) == (
        f"PAGEDKV_SNAPSHOT_EVERY={text.strip()!r} is not a whole number of steps (0, 1, 2 ...)"
    )


@pytest.mark.parametrize(("text", "size"), [("", 16 << 20), ("4096", 4096), ("65536", 65536)])
def test_the_buffer_setting_is_bytes_a_page_at_least(
    monkeypatch: pytest.MonkeyPatch, text: str, size: int
) -> None:
    monkeypatch.setenv("PAGEDKV_STEP_LOG_BUFFER", text)
    assert vllm_plugin.buffer_setting(16 << 20) == size


@pytest.mark.parametrize(
    ("text", "why"),
    [("0", "=0 is less than 4096 bytes"), ("16M", "='16M' is not a whole number of bytes")],
)
def test_a_smaller_or_spelt_buffer_is_refused(
    monkeypatch: pytest.MonkeyPatch, text: str, why: str
) -> None:
    monkeypatch.setenv("PAGEDKV_STEP_LOG_BUFFER", text)
    with pytest.raises(vllm_plugin.BadSetting, match=why):
        vllm_plugin.buffer_setting(16 << 20)
