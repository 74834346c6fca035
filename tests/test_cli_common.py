"""cli/common.py: the guard every command runs in (Ctrl-C in a query, exit codes)."""

from __future__ import annotations

from typing import Any

import pytest

from .helpers import DATA, Cli


def test_ctrl_c_in_a_query_is_recognised_as_either_exception() -> None:
    import duckdb

    from pagedkv_sql.cli.common import interrupted as _interrupted

    assert _interrupted(duckdb.InterruptException("INTERRUPT Error: Interrupted!"))
    assert _interrupted(RuntimeError("Query interrupted"))
    assert not _interrupted(RuntimeError("Invalid Input Error: ..."))
    assert not _interrupted(ValueError("interrupted"))


def test_ctrl_c_in_a_query_exits_130_with_nothing_changed(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    import duckdb

    from pagedkv_sql.database import Database

    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")

    monkeypatch.setattr(Database, "resolve", interrupted)
    result: Any = cli("resolve")
    assert (result.exit_code, result.stderr) == (130, "Error: interrupted; nothing was changed\n")
