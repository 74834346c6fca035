"""--memory-limit / PAGEDKV_MEMORY_LIMIT, and the temp directory that spilling uses."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

import pagedkv_sql
from pagedkv_sql import database as database_module
from pagedkv_sql import spill
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
    real = database_module.connect

    def spy(*args: Any, **kwargs: Any) -> pagedkv_sql.Database:
        db = real(*args, **kwargs)
        seen.append(settings(db)[0])
        return db

    monkeypatch.setattr(database_module, "connect", spy)  # cli.common.open_db calls it
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


# =================================================================================================
# Moved from the mutation runs' files (issue 24, tests by subject): each test pins a
# boundary or a branch a mutant of `make mutate` moved (docs/mutation.md); its comment
# names the run and the file it was first written in.
# =================================================================================================


# -- spill.py: whose temp directory, and when it goes --------------------------------------
# (from tests/test_mutation_kills_readers.py)


# killed a mutant of spill.py (mutation run, 2026-11-30)
def test_a_spill_directory_sits_beside_its_file_or_in_the_temp_directory(tmp_path: Path) -> None:
    """``DB.<pid>.tmp`` beside a file; ``pagedkv-<pid>-<8 hex digits>.tmp`` in the system's
    temp directory for any ``:memory:`` database (named ones too), a fresh one each time."""
    pid = os.getpid()
    file = tmp_path / "x.duckdb"
    assert spill.spill_directory(str(file)) == f"{file}.{pid}.tmp"
    made = set()
    for memory in (":memory:", ":memory:", ":memory:named"):
        directory = Path(spill.spill_directory(memory))
        assert directory.parent == Path(tempfile.gettempdir())
        assert re.fullmatch(rf"pagedkv-{pid}-[0-9a-f]{{8}}\.tmp", directory.name), directory
        made.add(directory)
    assert len(made) == 3


# killed a mutant of spill.py (mutation run, 2026-11-30)
def test_a_spill_directory_is_removed_by_the_last_of_its_users(tmp_path: Path) -> None:
    path = str(tmp_path / "x.duckdb")
    first, second = spill.acquire(path), spill.acquire(path)
    assert first == second
    Path(first).mkdir()
    spill.release(first)
    assert Path(first).is_dir()  # the other open still uses it
    spill.release(second)
    assert not Path(first).exists()
    Path(first).mkdir()  # a directory no open holds goes at its release
    spill.release(first)
    assert not Path(first).exists()
    spill.release(None)


# killed a mutant of spill.py (mutation run, 2026-11-30)
def test_asking_whether_a_process_lives_sends_it_no_signal() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        assert spill._dead(str(child.pid)) is False
    finally:
        assert child.stdin is not None
        child.stdin.close()
        code = child.wait()
    assert code == 0  # it ended by itself, at the end of its input: no signal reached it


# killed a mutant of spill.py (mutation run, 2026-11-30)
def test_a_process_that_cannot_be_asked_about_counts_as_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert spill._dead("9" * 30) is False  # beyond any pid: OverflowError
    assert spill._dead("x1") is False
    assert spill._dead(str(os.getpid())) is False

    def refused(pid: int, sig: int) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")  # another user's

    monkeypatch.setattr(os, "kill", refused)
    assert spill._dead("12345") is False


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# killed a mutant of spill.py (mutation run, 2026-11-30)
def test_the_sweep_goes_on_past_a_directory_it_cannot_remove(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    left = [f"a.duckdb.{pid}.tmp" for pid in sorted({_dead_pid(), _dead_pid()})]
    assert len(left) == 2
    for name in left:
        (tmp_path / name).mkdir()
    real, calls = spill.remove, []

    def remove(directory: str | None) -> None:
        calls.append(directory)
        if len(calls) == 1:  # whichever comes first
            raise PermissionError(errno.EACCES, "Permission denied")
        real(directory)

    monkeypatch.setattr(spill, "remove", remove)
    removed = spill.sweep(str(tmp_path / f"a.duckdb.{os.getpid()}.tmp"))
    assert len(calls) == 2
    kept = [p.name for p in tmp_path.iterdir()]
    assert len(kept) == 1 and sorted([*kept, *removed]) == left


# killed a mutant of spill.py (mutation run, 2026-11-30)
def test_the_sweep_looks_past_every_name_it_keeps(tmp_path: Path) -> None:
    """The database file, a live process's directory (pid 1) and the opener's own sort
    before the dead processes' directories: each is passed over, not the end of the sweep."""
    dead = sorted({_dead_pid(), _dead_pid()})
    own = tmp_path / f"a.duckdb.{os.getpid()}.tmp"
    (tmp_path / "a.duckdb").write_bytes(b"")
    kept = ["a.duckdb", "a.duckdb.1.tmp", own.name]
    left = [f"a.duckdb.{pid}.tmp" for pid in dead]
    for name in [*kept[1:], *left]:
        (tmp_path / name).mkdir()
    assert spill.sweep(str(own)) == left
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


# killed a mutant of spill.py (mutation run, 2026-11-30)
def test_a_memory_databases_sweep_reads_the_pid_before_the_tag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pagedkv-<pid>-<tag>.tmp``: the pid is the part before the first dash. A temp
    directory of the test's own: other processes sweep the system's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = _dead_pid()
    stale, alive = f"pagedkv-{dead}-0badcafe.tmp", "pagedkv-1-0badcafe.tmp"
    for name in (stale, alive):
        (tmp_path / name).mkdir()
    own = spill.spill_directory(":memory:")
    assert Path(own).parent == tmp_path
    assert spill.sweep(own) == [stale]
    assert [p.name for p in tmp_path.iterdir()] == [alive]


# -- load.py: what a load reports, its stages, and what it refuses -------------------------
# (from tests/test_mutation_kills_readers.py)


# killed a mutant of load.py (mutation run, 2026-11-30)
def test_the_sweep_does_not_follow_a_symlink_named_like_a_spill_directory(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")
    (tmp_path / f"x.duckdb.{dead.pid}.tmp").symlink_to(target)
    assert spill.sweep(str(tmp_path / f"x.duckdb.{os.getpid()}.tmp")) == []
    assert (target / "keep").exists()


# killed a mutant of load.py (mutation run, 2026-11-30)
def test_a_given_temp_directory_replaces_the_own_one(tmp_path: Path) -> None:
    mine = str(tmp_path / "spill")
    with pagedkv_sql.connect(config={"temp_directory": mine}) as db:
        assert db.sql("SELECT current_setting('temp_directory')").fetchall() == [(mine,)]
    with pagedkv_sql.connect() as db:
        (temp,) = db.sql("SELECT current_setting('temp_directory')").fetchall()[0]
        assert Path(temp).name.startswith(f"pagedkv-{os.getpid()}-")
