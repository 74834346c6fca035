"""The README and the docs are tested: their console sessions are run and their output
compared, their Python examples are executed, every command is documented, and the tests'
own comments state behaviour rather than the history of the project."""

from __future__ import annotations

import ast
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path
from types import ModuleType

import pytest

from pagedkv_sql import invariants
from pagedkv_sql.cli import app

from .helpers import DATA, ROOT, console_blocks

README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent
# docs/cli.md and docs/invariants.md are generated (`make docs`); every other page is prose
GENERATED = {"cli.md", "invariants.md"}
PAGES = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in GENERATED)


def test_readme_opens_with_the_two_setup_commands() -> None:
    first = re.search(r"```sh\n(.*?)```", README, re.S)
    assert first is not None and README.index(first.group(0)) < README.index("\n## ")
    commands = [line.split("#")[0].strip() for line in first.group(1).splitlines()]
    assert commands == ["make run", "make check"]


def _run_sessions(text: str, where: Path) -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PAGEDKV_DB", None)
    for block in console_blocks(text):
        for command, expected in block:
            run = subprocess.run(
                command + " 2>&1",
                shell=True,
                cwd=where,
                env=env,
                capture_output=True,
                text=True,
            )
            assert run.stdout == expected, command


def _needs_duckdb_cli() -> None:
    if shutil.which("duckdb", path=str(BIN)) is None:
        pytest.skip("duckdb-cli is not installed")


def test_readme_sessions_run_as_shown(tmp_path: Path) -> None:
    _needs_duckdb_cli()
    # data/ is written by the session's own first command, `pagedkv-sql example data`
    _run_sessions(README, tmp_path)


def _where_the_readme_session_ran(where: Path) -> None:
    """The directory a docs page's sessions start from: the example data written and
    loaded into pagedkv.duckdb, as the README's session leaves it."""
    for argv in (["example", "data"], ["load", "data/"]):
        subprocess.run(
            [str(BIN / "pagedkv-sql"), *argv], cwd=where, check=True, capture_output=True
        )


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_the_docs_sessions_run_as_shown(page: Path, tmp_path: Path) -> None:
    text = page.read_text(encoding="utf-8")
    if not console_blocks(text):
        return
    _needs_duckdb_cli()
    _where_the_readme_session_ran(tmp_path)
    _run_sessions(text, tmp_path)


def test_the_moved_sessions_are_still_run() -> None:
    """The sessions the README once held live in these pages; each keeps its own."""
    for name in ("usage.md", "check.md", "shell.md", "engines.md", "replay.md", "watch.md"):
        assert console_blocks((ROOT / "docs" / name).read_text(encoding="utf-8")), name


def _python_blocks(text: str) -> list[str]:
    # ```python is run; ```python sketch (objects the reader holds: an engine's scheduler)
    # and ```python engines (run by the engines tier) are not
    return re.findall(r"```python\n(.*?)```", text, re.S)


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_the_python_examples_run(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(DATA, tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    for snippet in _python_blocks(page.read_text(encoding="utf-8")):
        exec(compile(snippet, page.name, "exec"), {})


def test_the_python_api_page_has_a_runnable_example() -> None:
    assert _python_blocks((ROOT / "docs" / "python.md").read_text(encoding="utf-8"))


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


def test_the_docs_name_no_path_outside_the_repository() -> None:
    """A reader has the clone and nothing beside it: a `../` path must stay inside it."""
    for page in [ROOT / "README.md", *PAGES]:
        text = page.read_text(encoding="utf-8")
        for path in re.findall(r"(?:\.\./)+[\w./-]*", text):
            inside = (page.parent / path).resolve().is_relative_to(ROOT)
            assert inside, (page.name, path)
        assert re.findall(r"/work/\w+", text) == [], page.name


def test_the_docs_relative_links_lead_to_files() -> None:
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if not target.startswith(("https://", "http://")):
                assert (page.parent / target).exists(), (page.name, target)


# What a test comment must not cite: the project's own issue numbers, the codes of a review
# and its rounds, or a findings file that is not in the repository. A comment says the
# behaviour it pins; an upstream bug stays by its public name (vLLM #37076).
JOURNAL = re.compile(
    r"\b[Ii]ssues? #?\d+"
    r"|reliability-\d|findings/\w|\.\./shared|shared/spec"
    r"|\b(?:SW|DL|[TUH])\d{1,2}\b|\bR\d+-\w"
    r"|[Hh]elper \"\w+\"|\bround (?:one|two|three|four|five|six|\d+)\b|\breview of\b"
)


def journal_references(source: str) -> list[str]:
    """The comments and docstrings of a module that cite the project's history."""
    texts = [
        tok.string
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
            texts.append(ast.get_docstring(node) or "")
    return [text for text in texts if JOURNAL.search(text)]


def test_a_journal_reference_is_found() -> None:
    planted = '"""Replay refuses the log."""\n\n# issue 28, SW9: ids merged\nx = 1\n'
    assert journal_references(planted) == ["# issue 28, SW9: ids merged"]
    upstream = "# a block handed out while held (vLLM #37076)\nx = 1\n"
    assert journal_references(upstream) == []


def test_the_tests_comments_state_behaviour() -> None:
    found = {
        str(path.relative_to(ROOT)): refs
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if (refs := journal_references(path.read_text(encoding="utf-8")))
    }
    assert found == {}


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
