"""`pagedkv-sql fuzz`'s own refusals, which come before hypothesis or an engine is imported
(so they run in the main tier; the fuzz runs themselves are the engines tier's:
tests/engines/real/test_fuzz.py). The shrunk schedule's log is an output like every other:
never written over a database, whole or not at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

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


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_step_logs_path_is_checked_before_the_run(cli: Cli, engine: str) -> None:
    """-o a directory, or in a directory that is missing: refused before the run, so a
    failure found and shrunk after minutes is never lost to its log's path."""
    (cli.cwd / "fdir").mkdir()
    for out, message in [
        ("fdir", "Error: --output fdir: it is a directory; nothing was done"),
        ("missing/dir/x.jsonl", "Error: --output missing/dir/x.jsonl: no directory missing/dir;"),
    ]:
        result: Any = cli("fuzz", engine, "-o", out)
        assert result.exit_code == 2
        assert result.stderr.startswith(message), result.stderr
    assert sorted(p.name for p in cli.cwd.iterdir()) == ["fdir"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--pool-blocks", "1000000000"], "--pool-blocks 1,000,000,000 of 4 token(s) is beyond"),
        (["--pool-blocks", "2000000", "--block-size", "256"], "--pool-blocks 2,000,000 of 256"),
        (["--block-size", "0"], "--block-size must be a number of tokens in [1, 256]"),
        (["--block-size", "1000000"], "--block-size must be a number of tokens in [1, 256]"),
    ],
)
def test_the_pool_and_block_size_are_bounded_before_anything_runs(
    cli: Cli, options: list[str], message: str
) -> None:
    """No MemoryError, no ZeroDivisionError from the engine, no header refused by replay
    after the run: the option named, exit 2 (the engine is not even imported: the main
    tier has none)."""
    for engine in ("vllm", "sglang"):
        result: Any = cli("fuzz", engine, *options)
        assert result.exit_code == 2
        assert result.stderr.startswith(f"Error: {message}"), result.stderr
        assert "Traceback" not in result.stderr


def test_a_module_the_engine_imports_is_what_the_fix_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang installed without torchvision: 'pip install torchvision', not 'pip install
    sglang' (a real package that imports a module that is not there)."""
    from pagedkv_sql.errors import UsageError
    from pagedkv_sql.fuzz.core import require

    engine = tmp_path / "fakeengine_pagedkv"
    (engine / "srt").mkdir(parents=True)
    (engine / "__init__.py").write_text("")
    (engine / "srt" / "__init__.py").write_text("import torchvision_pagedkv_absent\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UsageError) as e:
        require("fakeengine_pagedkv.srt", "pip install fakeengine_pagedkv")
    assert e.value.hint == (
        "fakeengine_pagedkv is installed but imports torchvision_pagedkv_absent, which is "
        "not: pip install torchvision_pagedkv_absent"
    )
    with pytest.raises(UsageError) as absent:
        require("noengine_pagedkv.srt", "pip install noengine_pagedkv")
    assert absent.value.hint == "pip install noengine_pagedkv"


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
