"""What a command imports before it works (docs/performance.md, "Start-up")."""

from __future__ import annotations

import subprocess
import sys

import pytest

LAZY = ("pyarrow.compute", "pagedkv_sql.engines", "pagedkv_sql.replay", "pagedkv_sql.report")


# the core (database.py and what it imports) too: it imports a capability only inside
# Database's delegations (tests/test_layering.py reads the sources for the same rule)
@pytest.mark.parametrize("module", ["pagedkv_sql", "pagedkv_sql.cli", "pagedkv_sql.database"])
def test_importing_leaves_out_what_only_some_commands_use(module: str) -> None:
    code = f"import sys, {module}; print(' '.join(m for m in {LAZY!r} if m in sys.modules))"
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert found == []
