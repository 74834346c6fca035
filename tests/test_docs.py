"""The README is tested: its console sessions are run and their output compared, its
Python example is executed, and every command is documented."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pagedkv_sql import invariants
from pagedkv_sql.cli import app

from .helpers import DATA, ROOT, console_blocks

README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent


def test_readme_opens_with_the_two_setup_commands() -> None:
    first = re.search(r"```sh\n(.*?)```", README, re.S)
    assert first is not None and README.index(first.group(0)) < README.index("\n## ")
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert commands == ["make run", "make check"]


def test_readme_sessions_run_as_shown(tmp_path: Path) -> None:
    if shutil.which("duckdb", path=str(BIN)) is None:
        pytest.skip("duckdb-cli is not installed")
    # data/ is written by the first session's `pagedkv-sql example data` (issue 29)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PAGEDKV_DB", None)
    for block in console_blocks(README):
        for command, expected in block:
            run = subprocess.run(
                command + " 2>&1",
                shell=True,
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
            )
            assert run.stdout == expected, command


def test_readme_python_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(DATA, tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    code = re.findall(r"```python\n(.*?)```", README, re.S)
    assert code
    for snippet in code:
        exec(compile(snippet, "README.md", "exec"), {})


def test_every_command_is_documented() -> None:
    for command in app.registered_commands:
        name = command.name or (command.callback.__name__ if command.callback else "")
        assert f"`pagedkv-sql {name}" in README, name
        assert command.callback is not None and command.callback.__doc__, name


# The README is the wheel's long description (PyPI shows it): a relative link there leads
# nowhere, so every link is absolute, under the project's home in pyproject.toml.
def test_the_readme_links_only_absolute_urls_under_the_project_home() -> None:
    tomllib = pytest.importorskip("tomllib")  # the 3.10 tier has none
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert {"Homepage", "Documentation", "Changelog"} <= set(urls)
    home = urls["Homepage"]
    targets = re.findall(r"\]\(([^)]+)\)", README)
    assert targets and all(t.startswith("https://") for t in targets), targets
    for page in ("docs/cli.md", "CHANGELOG.md"):
        assert f"{home}/blob/main/{page}" in targets, page


def test_the_docs_name_no_internal_issue_number() -> None:
    # the history (with its issue numbers) is CHANGELOG.md; docs/cli.md is generated from
    # the help
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        if page.name == "cli.md":
            continue
        found = re.findall(r".*\b[Ii]ssues? \d+.*", page.read_text(encoding="utf-8"))
        assert found == [], (page.name, found)


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "tools/cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_command_reference_is_the_cli_help_now() -> None:
    expected = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert _generator().render() == expected, "docs/cli.md is stale: run `make docs`"


def test_the_reference_has_a_section_for_every_command_of_the_golden_help() -> None:
    reference = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    golden = (ROOT / "tests" / "cli_help.txt").read_text(encoding="utf-8")
    for title in (line[4:-7] for line in golden.splitlines() if line.endswith(" --help")):
        assert f"\n## {title}\n" in reference, title


def test_the_tables_of_invariants_are_the_catalogues_now() -> None:
    """docs/invariants.md and the tables in docs/replay.md and docs/engines.md are made
    from pagedkv_sql/invariants.py and the checks' doc lines by `make docs`."""
    spec = importlib.util.spec_from_file_location(
        "catalogue_tables", ROOT / "tools" / "catalogue_tables.py"
    )
    assert spec is not None and spec.loader is not None
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    for path, text in tables.rendered().items():
        assert path.read_text(encoding="utf-8") == text, f"{path.name} is stale: run `make docs`"
    page = (ROOT / "docs" / "invariants.md").read_text(encoding="utf-8")
    assert all(f"`{inv.name}`" in page for inv in invariants.CATALOGUE)
