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
    """Every directory the Makefile runs `python -m venv` into, its variables expanded; a
    static pattern rule's (`$(A) $(B): .venv-%/.installed: ...`, `-m venv .venv-$*`) names
    each of its targets' directories."""
    assigned = dict(re.findall(r"^(\w+)\s*[?:]?=\s*(\S+)", MAKEFILE, re.M))

    def expand(text: str) -> str:
        while variable := re.search(r"\$\((\w+)\)", text):
            text = text.replace(variable.group(0), assigned[variable.group(1)])
        return text

    names = set()
    for target in re.findall(r"-m venv (\S+)", MAKEFILE):
        if "$*" not in target:
            names.add(expand(target))
            continue
        for targets in re.findall(r"^([^:\n]+):\s*\.venv-%/\.installed:", MAKEFILE, re.M):
            names.update(str(Path(expand(t)).parent) for t in targets.split())
    return names


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_clean_removes_every_venv_and_cache_and_keeps_the_database(tmp_path: Path) -> None:
    venvs = made_venvs()
    assert {".venv", ".venv-engines", ".venv-engines-new", ".venv-mutate", ".venv-min"} <= venvs
    assert {".venv-new", ".venv-serving"} <= venvs
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


def test_every_install_names_a_declared_extra_or_dependency_group() -> None:
    # issue 29: test and dev tools moved from extras to dependency groups (PEP 735); each
    # venv the Makefile makes must still name only what pyproject.toml declares
    # the file, not the Python, is tested: the 3.10 tier (test-min) has no tomllib
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = set(project["project"]["optional-dependencies"])
    groups = set(project["dependency-groups"])
    installs = re.findall(r"pip install (?:[^\n\\]|\\\n)*", MAKEFILE)
    named_extras = {
        e for i in installs for m in re.findall(r"\.\[([\w,-]+)\]", i) for e in m.split(",")
    }
    named_groups = {g for i in installs for g in re.findall(r"--group ([\w-]+)", i)}
    assert named_extras <= extras and named_groups <= groups
    assert {"test", "dev", "report-test", "mutate"} == groups and not groups & extras
    assert named_groups == groups
    # pip learnt --group in 25.1: every venv that installs a group upgrades pip first
    for venv_install in re.findall(r"-m venv [^\n]*\n(?:\t[^\n]*\n)+", MAKEFILE + "\n"):
        if "--group" in venv_install:
            assert "--upgrade pip" in venv_install
