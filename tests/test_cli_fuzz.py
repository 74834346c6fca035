"""`pagedkv-sql fuzz`'s own refusals, which come before hypothesis or an engine is imported
(so they run in the main tier; the fuzz runs themselves are the engines tier's:
tests/engines/real/test_fuzz.py). The shrunk schedule's log is an output like every other:
never written over a database, whole or not at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from .helpers import Cli


def test_the_step_log_is_never_written_over_a_database(cli: Cli) -> None:
    db = cli.cwd / "pagedkv.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE keep AS SELECT 42 AS x")
    con.close()
    before = db.read_bytes()
    for engine in ("vllm", "sglang"):
        result: Any = cli("fuzz", engine, "-o", "pagedkv.duckdb")
        assert result.exit_code == 2, result.stderr
        assert result.stderr.startswith("Error: "), result.stderr
        assert "database" in result.stderr.splitlines()[0]
        assert "Traceback" not in result.stderr
    assert db.read_bytes() == before
    assert sorted(p.name for p in Path(cli.cwd).iterdir()) == ["pagedkv.duckdb"]


def test_db_before_or_after_the_name_is_refused_saying_fuzz_keeps_no_database(cli: Cli) -> None:
    for args in (["fuzz", "vllm", "--db", "x.duckdb"], ["--db", "x.duckdb", "fuzz", "sglang"]):
        result: Any = cli(*args)
        assert result.exit_code == 2, result.stderr
        assert result.stderr.splitlines() == [
            "Error: fuzz uses no database (--db x.duckdb)",
            "Fix: drop --db: fuzz drives the engine's own manager; a failure's step log "
            "(-o FILE) is stored with `pagedkv-sql replay FILE --db DB`",
        ]
    assert list(Path(cli.cwd).iterdir()) == []
