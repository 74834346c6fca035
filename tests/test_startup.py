"""What a command imports before it works (docs/performance.md, "Start-up")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

LAZY = ("pyarrow.compute", "pagedkv_sql.engines", "pagedkv_sql.replay", "pagedkv_sql.report")
# `--help`, `--version` and TAB completion import none of these (~1 s, 641 ms of it these)
HEAVY = ("duckdb", "pyarrow", "numpy")
# and TAB completion is answered from a table without typer (tests/test_completion.py)
TYPER = ("typer", "click", "rich", "pydantic")


# the core (database.py and what it imports) too: it imports a capability only inside
# Database's delegations (tests/test_layering.py reads the sources for the same rule)
@pytest.mark.parametrize("module", ["pagedkv_sql", "pagedkv_sql.cli", "pagedkv_sql.database"])
def test_importing_leaves_out_what_only_some_commands_use(module: str) -> None:
    code = f"import sys, {module}; print(' '.join(m for m in {LAZY!r} if m in sys.modules))"
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert found == []


# the CLI run as the console script runs it, then what it left in sys.modules
PROBE = """
import atexit, sys
sys.argv = ["pagedkv-sql", *sys.argv[1:]]
heavy = [m for m in {heavy!r}]
atexit.register(lambda: print("loaded:", *(m for m in heavy if m in sys.modules), file=sys.stderr))
from pagedkv_sql.__main__ import main
main()
"""
COMPLETIONS = {
    "bash": {
        "_PAGEDKV_SQL_COMPLETE": "complete_bash",
        "COMP_WORDS": "pagedkv-sql ex",
        "COMP_CWORD": "1",
    },
    "zsh": {"_PAGEDKV_SQL_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "pagedkv-sql export "},
    # `import ENGINE` completes
    "engine": {
        "_PAGEDKV_SQL_COMPLETE": "complete_bash",
        "COMP_WORDS": "pagedkv-sql import fl",
        "COMP_CWORD": "2",
    },
}


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--help"], {}, "Usage: pagedkv-sql"),
        (["--version"], {}, "pagedkv-sql "),
        (["export", "--help"], {}, "Usage: pagedkv-sql export"),
        ([], COMPLETIONS["bash"], "explain\nexample\nexport"),
        ([], COMPLETIONS["zsh"], '"flashinfer"'),
        ([], COMPLETIONS["engine"], "flashinfer"),
    ],
    ids=["help", "version", "group-help", "complete-bash", "complete-zsh", "complete-engine"],
)
def test_help_version_and_completion_import_nothing_heavy(
    args: list[str], env: dict[str, str], expected: str
) -> None:
    run = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY + (TYPER if env else ())), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    assert run.returncode == 0, run.stderr
    assert expected in run.stdout
    assert run.stderr.splitlines()[-1] == "loaded:"
