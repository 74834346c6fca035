"""`make clean` removes what make and the tests create: every venv the Makefile makes
(the tiers' too), caches, build output; a database stays (it is data)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAKEFILE = (ROOT / "Makefile").read_text()


def made_venvs() -> set[str]:
    """Every directory the Makefile runs `python -m venv` into, its variables expanded."""
    assigned = dict(re.findall(r"^(\w+)\s*[?:]?=\s*(\S+)\s*$", MAKEFILE, re.M))
    names = set()
    for target in re.findall(r"-m venv (\S+)", MAKEFILE):
        variable = re.fullmatch(r"\$\((\w+)\)", target)
        names.add(assigned[variable.group(1)] if variable else target)
    return names


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_clean_removes_every_venv_and_cache_and_keeps_the_database(tmp_path: Path) -> None:
    venvs = made_venvs()
    assert {".venv", ".venv-engines", ".venv-mutate", ".venv-min", ".venv-new"} <= venvs
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    made = [*venvs, ".images", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis"]
    made += [".mutate"]  # make mutate's history and last report
    made += ["dist", "build", "pagedkv_sql/__pycache__", "tests/engines/__pycache__"]
    for name in made:
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "file").write_text("x")
    (tmp_path / "pagedkv.duckdb").write_text("data")
    subprocess.run(["make", "-s", "clean"], cwd=tmp_path, check=True, capture_output=True)
    assert [n for n in made if (tmp_path / n).exists()] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "Makefile",
        "pagedkv.duckdb",
        "pagedkv_sql",
        "tests",
    ]
