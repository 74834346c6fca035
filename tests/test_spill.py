"""--memory-limit / PAGEDKV_MEMORY_LIMIT, and the temp directory that spilling uses."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import pagedkv_sql
from pagedkv_sql import spill

from .helpers import settings

# a sort of 4M random rows (64 MB of data) under a 32 MB limit must spill
SPILLING_SORT = "SELECT * FROM (SELECT i, hash(i) AS h FROM range(4000000) t(i)) ORDER BY h"


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
        assert sorted(os.listdir(temp)) == [spill.MARKER]  # made and marked at the open
        assert stat.S_IMODE(os.stat(temp).st_mode) == 0o700


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


# -- the sweep removes only what pagedkv provably made -----------------------------------


CHILD = """
import os, signal, sys
import pagedkv_sql
db = pagedkv_sql.connect(sys.argv[1], read_only=sys.argv[2] == "hold")
temp = db.sql("SELECT current_setting('temp_directory')").fetchall()[0][0]
print(temp, flush=True)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.read()
"""


def child(path: str, how: str) -> tuple[subprocess.Popen[str], Path]:
    """A real process that opens ``path`` and either dies by SIGKILL with its spill
    directory in place (``kill``) or keeps it open until its stdin closes (``hold``)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, path, how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    temp = Path(proc.stdout.readline().strip())
    if how == "kill":
        proc.wait()
        finish(proc, -9)
    assert (temp / spill.MARKER).is_file()
    return proc, temp


def finish(proc: subprocess.Popen[str], code: int = 0) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    proc.stdout.close()
    assert proc.wait() == code


def test_a_killed_processs_directory_is_swept_at_the_next_open(tmp_path: Path) -> None:
    """A process killed with SIGKILL leaves its marked directory (and its spill files);
    the next open of the same file removes it, and a symlink inside is not followed."""
    path = tmp_path / "x.duckdb"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    _, left = child(str(path), "kill")
    (left / "duckdb_temp_storage-0.tmp").write_bytes(b"x" * 100)
    (left / "link").symlink_to(victim)
    with pagedkv_sql.connect(path):
        assert not left.exists()
    assert (victim / "keep").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim", "x.duckdb"]


def test_a_killed_memory_databases_directory_is_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the child's temp directory
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # and this process's
    _, left = child(":memory:", "kill")
    assert left.parent == tmp_path
    with pagedkv_sql.connect():
        assert not left.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_live_process_keeps_its_directory_whatever_its_pid_says(tmp_path: Path) -> None:
    """The lock, not the pid, says who is alive: a process in another PID namespace has a
    pid that names nobody (or a stranger) here. Its directory, renamed to a pid that does
    not run here, is kept while it holds the lock, and swept once it is gone."""
    path = tmp_path / "x.duckdb"
    pagedkv_sql.connect(path).close()
    proc, temp = child(str(path), "hold")
    try:
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        token = temp.name.rsplit(".", 2)[1]
        foreign = temp.with_name(f"x.duckdb.{gone.pid}.{token}.tmp")
        temp.rename(foreign)  # what the same process looks like from outside its namespace
        with pagedkv_sql.connect(path, read_only=True):
            assert (foreign / spill.MARKER).is_file()
        assert foreign.exists()
        foreign.rename(temp)
    finally:
        finish(proc)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.duckdb"]


def unmarked(tmp_path: Path, dead: int) -> dict[str, str]:
    """Directories named like spill directories that pagedkv did not make (or cannot
    prove it made), each with a file in it: name -> why it must stay."""
    token = "0123456789abcdef"
    return {
        f"x.duckdb.{dead}.tmp": "an older pagedkv's name, or anyone's",
        f"x.duckdb.{dead}.{token}.tmp": "no marker",
        f"x.duckdb.{dead}.fedcba9876543210.tmp": "a marker copied from another directory",
        f"x.duckdb.{dead}.00000000000000aa.tmp": "a marker that is a symlink",
        f"x.duckdb.{dead}.00000000000000bb.tmp": "a marker that is a directory",
        f"x.duckdb.{dead}.00000000000000cc.tmp": "a marker that says something else",
        f"x.duckdb.{dead}.00000000000000dd.tmp": "a marker of another uid",
        f"y.duckdb.{dead}.{token}.tmp": "another file's",
        f"x.duckdb.{dead}x.{token}.tmp": "not a pid",
    }


def test_directories_it_cannot_prove_its_own_are_never_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a temp directory of the test's own: pagedkv processes of older versions sharing /tmp
    # (other checkouts) would sweep the stray below themselves
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    names = unmarked(tmp_path, gone.pid)
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text("mine")
    d = {n[len(f"x.duckdb.{gone.pid}.") : -4]: tmp_path / n for n in names}
    good = spill._marker_text("0123456789abcdef")
    (d["fedcba9876543210"] / spill.MARKER).write_bytes(good)  # a token of another name
    real = tmp_path / "elsewhere"
    real.write_bytes(spill._marker_text("00000000000000aa"))
    (d["00000000000000aa"] / spill.MARKER).symlink_to(real)
    (d["00000000000000bb"] / spill.MARKER).mkdir()
    (d["00000000000000cc"] / spill.MARKER).write_text("pagedkv-sql spill directory, honest\n")
    other_uid = spill._marker_text("00000000000000dd").replace(
        f"uid={os.geteuid()}".encode(), f"uid={os.geteuid() + 1}".encode()
    )
    (d["00000000000000dd"] / spill.MARKER).write_bytes(other_uid)
    with pagedkv_sql.connect(tmp_path / "x.duckdb"):
        pass
    for name, why in names.items():
        assert (tmp_path / name / "notes.txt").read_text() == "mine", why
    stray = Path(tempfile.gettempdir()) / f"pagedkv-{gone.pid}-mine.tmp"
    stray.mkdir()
    try:
        with pagedkv_sql.connect():
            pass
        assert stray.is_dir()
    finally:
        stray.rmdir()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")
def test_another_users_leftover_is_never_removed_even_by_root(tmp_path: Path) -> None:
    """A real leftover (killed process, valid marker), then given to another user (the
    directory, or only its marker): root's sweep keeps it."""
    path = tmp_path / "x.duckdb"
    kept = []
    for part in ("directory", "marker"):
        _, left = child(str(path), "kill")
        os.chown(left if part == "directory" else left / spill.MARKER, 65534, 65534)
        kept.append(left)
    with pagedkv_sql.connect(path):
        pass
    assert all((left / spill.MARKER).is_file() for left in kept)


def test_a_symlink_named_like_a_leftover_is_not_followed(tmp_path: Path) -> None:
    """A symlink to a real leftover (marker and all) beside the file: the link is not a
    directory pagedkv made here, and what it points to is not looked into."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _, left = child(str(elsewhere / "x.duckdb"), "kill")
    (tmp_path / left.name).symlink_to(left)
    with pagedkv_sql.connect(tmp_path / "x.duckdb"):
        pass
    assert (left / spill.MARKER).is_file() and (tmp_path / left.name).is_symlink()


def test_an_open_that_cannot_make_its_directory_still_opens(tmp_path: Path) -> None:
    """A read-only directory: no spill directory can be made beside the file; the
    database still opens read-only, and closing removes nothing."""
    path = tmp_path / "ro" / "x.duckdb"
    path.parent.mkdir()
    pagedkv_sql.connect(path).close()
    path.parent.chmod(0o555)
    try:
        if os.access(path.parent, os.W_OK):
            pytest.skip("root writes into a read-only directory")
        with pagedkv_sql.connect(path, read_only=True) as db:
            assert db.sql("SELECT 1").fetchall() == [(1,)]
    finally:
        path.parent.chmod(0o755)
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.duckdb"]


def test_two_threads_opening_one_file_share_one_locked_directory(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "x.duckdb"
    pagedkv_sql.connect(path).close()
    got: list[str] = []

    def take() -> None:
        got.append(spill.acquire(str(path)))

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 1
    assert spill.sweep(spill.spill_directory(str(path)) + "x") == []
    fd = os.open(Path(got[0]) / spill.MARKER, os.O_RDONLY)
    try:
        import fcntl

        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    for directory in got:
        spill.release(directory)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.duckdb"]


def test_a_given_temp_directory_replaces_the_own_one(tmp_path: Path) -> None:
    mine = str(tmp_path / "spill")
    with pagedkv_sql.connect(config={"temp_directory": mine}) as db:
        assert db.sql("SELECT current_setting('temp_directory')").fetchall() == [(mine,)]
    with pagedkv_sql.connect() as db:
        (temp,) = db.sql("SELECT current_setting('temp_directory')").fetchall()[0]
        assert Path(temp).name.startswith(f"pagedkv-{os.getpid()}-")
