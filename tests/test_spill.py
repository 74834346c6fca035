"""--memory-limit / PAGEDKV_MEMORY_LIMIT, and the temp directory that spilling uses."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql import cli as cli_module
from tests.conftest import Cli

# a sort of 4M random rows (64 MB of data) under a 32 MB limit must spill
SPILLING_SORT = "SELECT * FROM (SELECT i, hash(i) AS h FROM range(4000000) t(i)) ORDER BY h"


def settings(db: pagedkv_sql.Database) -> tuple[str, str]:
    row = db.sql(
        "SELECT current_setting('memory_limit'), current_setting('temp_directory')"
    ).fetchall()[0]
    return str(row[0]), str(row[1])


def spilled(db: pagedkv_sql.Database, temp: str) -> bool:
    """Run the sort, read its first rows and see whether it wrote to ``temp``."""
    cursor = db.con.cursor()
    try:
        assert len(cursor.execute(SPILLING_SORT).fetchmany(3)) == 3
        return Path(temp).is_dir() and any(Path(temp).iterdir())
    finally:
        cursor.close()


def test_memory_limit_and_temp_directory_beside_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x.duckdb"
    with pagedkv_sql.connect(path, config={"memory_limit": "300MB"}) as db:
        limit, temp = settings(db)
        assert limit == "286.1 MiB"  # DuckDB's 300 MB, in its own units
        assert Path(temp).parent == tmp_path
        assert Path(temp).name.startswith("x.duckdb.") and temp.endswith(".tmp")
        assert not Path(temp).exists()  # made by DuckDB only when something spills


def test_spilled_files_are_removed_on_close(tmp_path: Path) -> None:
    path = tmp_path / "x.duckdb"
    with pagedkv_sql.connect(path, config={"memory_limit": "32MB", "threads": 1}) as db:
        _, temp = settings(db)
        assert spilled(db, temp), "the sort did not spill: the test proves nothing"
    assert not Path(temp).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.duckdb"]


def test_two_opens_of_one_file_in_one_process_share_it(tmp_path: Path) -> None:
    """DuckDB refuses a second open of a file whose settings differ: both opens must get
    the same spill directory, and it stays until the last one closes."""
    path = tmp_path / "x.duckdb"
    pagedkv_sql.connect(path).close()
    first = pagedkv_sql.connect(path, read_only=True, config={"memory_limit": "32MB"})
    with pagedkv_sql.connect(path, read_only=True, config={"memory_limit": "32MB"}) as second:
        assert settings(first)[1] == settings(second)[1]
    _, temp = settings(first)
    assert spilled(first, temp)  # the second close left the first's directory alone
    first.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.duckdb"]


def test_in_memory_spills_to_a_private_temp_directory(tmp_path: Path) -> None:
    with pagedkv_sql.connect(config={"memory_limit": "32MB", "threads": 1}) as db:
        _, temp = settings(db)
        assert Path(temp).parent == Path(tempfile.gettempdir())
        assert spilled(db, temp)
        with pagedkv_sql.connect() as other:
            assert settings(other)[1] != temp  # one directory per open
    assert not Path(temp).exists()


def test_a_temp_directory_given_is_used_and_left_alone(tmp_path: Path) -> None:
    mine = tmp_path / "spill"
    mine.mkdir()
    (mine / "keep").write_text("x")
    with pagedkv_sql.connect(config={"temp_directory": str(mine)}) as db:
        assert settings(db)[1] == str(mine)
    assert (mine / "keep").exists()


def test_a_failed_open_leaves_no_temp_directory(tmp_path: Path) -> None:
    with pytest.raises(pagedkv_sql.UsageError, match=r"(?i)memory"):
        pagedkv_sql.connect(tmp_path / "x.duckdb", config={"memory_limit": "lots"})
    assert list(tmp_path.iterdir()) == []


def opened_limits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the memory_limit of every database the CLI opens."""
    seen: list[str] = []
    real = cli_module.connect

    def spy(*args: Any, **kwargs: Any) -> pagedkv_sql.Database:
        db = real(*args, **kwargs)
        seen.append(settings(db)[0])
        return db

    monkeypatch.setattr(cli_module, "connect", spy)
    return seen


def test_cli_memory_limit_option(cli: Cli, seed_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGEDKV_MEMORY_LIMIT", raising=False)
    seen = opened_limits(monkeypatch)
    result: Any = cli("--memory-limit", "300MB", "load", str(seed_dir), "-q")
    assert result.exit_code == 0, result.output
    result = cli("resolve")
    assert result.exit_code == 0, result.output
    assert seen[0] == "286.1 MiB" and seen[1] != "286.1 MiB"  # only where it was given
    assert sorted(p.name for p in cli.cwd.iterdir()) == ["pagedkv.duckdb"]


def test_cli_memory_limit_from_the_environment(
    cli: Cli, seed_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAGEDKV_MEMORY_LIMIT", "200MB")
    seen = opened_limits(monkeypatch)
    result: Any = cli("load", str(seed_dir), "-q")
    assert result.exit_code == 0, result.output
    assert seen == ["190.7 MiB"]


def test_cli_bad_memory_limit(cli: Cli, seed_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PAGEDKV_MEMORY_LIMIT", raising=False)
    result: Any = cli("--memory-limit", "lots", "load", str(seed_dir))
    assert result.exit_code != 0
    assert "memory" in result.output.lower() and "Traceback" not in result.output
    assert list(cli.cwd.iterdir()) == []


def dead_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_directories_of_killed_processes_are_swept_at_the_next_open(tmp_path: Path) -> None:
    """A process killed before it closed leaves its spill directory: the next open of the
    file removes it, and leaves alone those of live processes and of other files."""
    import os

    path = tmp_path / "x.duckdb"
    dead, alive = dead_pid(), os.getppid()
    left = tmp_path / f"x.duckdb.{dead}.tmp"
    left.mkdir()
    (left / "duckdb_temp_storage-0.tmp").write_bytes(b"x" * 100)
    kept = [f"x.duckdb.{alive}.tmp", f"y.duckdb.{dead}.tmp", f"x.duckdb.{dead}x.tmp"]
    for name in kept:
        (tmp_path / name).mkdir()
    with pagedkv_sql.connect(path):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["x.duckdb", *kept])

    stale = Path(tempfile.gettempdir()) / f"pagedkv-{dead}-0badcafe.tmp"
    stale.mkdir(exist_ok=True)
    with pagedkv_sql.connect():
        pass
    assert not stale.exists()
