"""pytest_pagedkv.py in the main tier: the plugin is loaded through its entry point, its
fixture works without an engine, and either of its names disables it (the fixture on real
managers: tests/engines/real/test_pytest_pagedkv.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

USES_THE_FIXTURE = """
def test_it(kv_consistency):
    kv_consistency.check()  # no manager registered: nothing to check
"""


def _pytest(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_fixture.py").write_text(USES_THE_FIXTURE)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    "options", [[], ["-p", "pytest_pagedkv"], ["-p", "no:pytest_pagedkv", "-p", "pytest_pagedkv"]]
)
def test_the_fixture_is_there_by_default_and_when_named(tmp_path: Path, options: list[str]) -> None:
    """`-p pytest_pagedkv` loads it once more by the module's name: no 'Plugin already
    registered' error."""
    run = _pytest(tmp_path, *options)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout.splitlines()[-1]


@pytest.mark.parametrize("name", ["pagedkv_sql", "pytest_pagedkv", "pagedkv"])
def test_either_name_disables_the_plugin(tmp_path: Path, name: str) -> None:
    """The entry point's name, the module's, or the module's without pytest's prefix."""
    run = _pytest(tmp_path, "-p", f"no:{name}")
    assert run.returncode == 1
    assert "fixture 'kv_consistency' not found" in run.stdout
