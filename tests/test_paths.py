"""paths.py: writing outputs, reading sources, the standard streams and database paths."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

import pagedkv_sql
from pagedkv_sql import UsageError, paths
from pagedkv_sql.errors import DatabaseError, PagedKVError
from pagedkv_sql.paths import database_io_error
from pagedkv_sql.synth import SynthConfig, synthesize


@pytest.mark.parametrize(
    "message",
    ["IO Error: No space left on device", "Disk full", "File too large (errno 27)"],
)
def test_each_spelling_of_a_full_disk_gets_the_free_space_hint(message: str) -> None:
    error = database_io_error("x.duckdb", OSError(message), "write")
    assert error.hint == "free some space (or point --db at another disk) and retry"
    assert str(database_io_error("x.duckdb", OSError("Permission denied"), "write").hint)
    assert database_io_error("x.duckdb", OSError("something else"), "write").hint == ""


@pytest.mark.parametrize("code", ["EOPNOTSUPP", "EISDIR", "EINVAL"])
def test_output_falls_back_to_a_named_temp_file_without_o_tmpfile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    """A file system that refuses O_TMPFILE (each way the kernel says so) still gets the
    output whole, through a named temporary file beside it, and no leftover."""
    import errno
    import os

    from pagedkv_sql import paths

    real_open = os.open

    def no_tmpfile(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", no_tmpfile)
    target = tmp_path / "out.tsv"
    with paths.atomic_output(target) as f:
        f.write(b"1\t2\n")
    assert target.read_bytes() == b"1\t2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tsv"]


def test_output_refused_for_another_reason_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    import os

    from pagedkv_sql import paths
    from pagedkv_sql.errors import PagedKVError

    real_open = os.open

    def denied(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_TMPFILE == os.O_TMPFILE:
            raise OSError(errno.EACCES, "Permission denied")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    with (
        pytest.raises(PagedKVError, match=r"cannot write .*: Permission denied"),
        paths.atomic_output(tmp_path / "out.tsv") as f,
    ):
        f.write(b"x")
    assert list(tmp_path.iterdir()) == []


def test_a_reader_that_goes_away_is_not_an_error(tmp_path: Path) -> None:
    """`pagedkv-sql resolve | head -1`: the pipe closes under a long output; exit 0,
    nothing on stderr (the reader went away on purpose)."""
    from pagedkv_sql.synth import write

    write(synthesize(SynthConfig(sequences=40, mean_length=1000)), tmp_path / "w")
    command = [sys.executable, "-m", "pagedkv_sql", "--db", "w.duckdb"]
    assert subprocess.run([*command, "load", "w", "-q"], cwd=tmp_path).returncode == 0
    proc = subprocess.Popen(
        [*command, "resolve"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().count(b"\t") == 2
    proc.stdout.close()  # `head -1` is done
    stderr = proc.stderr.read()
    proc.stderr.close()
    assert (proc.wait(), stderr) == (0, b"")


def test_a_write_that_fails_midway_keeps_the_old_file_and_says_why(tmp_path: Path) -> None:
    target = tmp_path / "out.csv"
    target.write_text("old\n")
    with pytest.raises(PagedKVError) as e, paths.atomic_output(target) as f:
        f.write(b"new, partly\n")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert str(e.value) == f"cannot write {target}: No space left on device"
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]


def test_a_source_spelling_holds_one_descriptor_until_closed(tmp_path: Path) -> None:
    source = tmp_path / "a[1].facts"
    source.write_text("1\t2\n")
    before = sorted(os.listdir("/proc/self/fd"))
    spelling = paths.DuckDBPath(source)
    text = str(spelling)
    assert text.startswith("/proc/self/fd/") and Path(text).read_text() == "1\t2\n"
    fd = int(text.rsplit("/", 1)[1])
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC  # no child process inherits it
    assert str(spelling) == text  # opened once
    spelling.close()
    spelling.close()  # twice is harmless
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_a_database_path_that_names_nothing_yet_is_not_there(tmp_path: Path) -> None:
    assert paths.check_database_path(str(tmp_path / "new.duckdb")) is False
    assert paths.check_database_path(":memory:") is False
    pagedkv_sql.connect(tmp_path / "made.duckdb").close()
    assert paths.check_database_path(str(tmp_path / "made.duckdb")) is True


def test_an_unreadable_database_file_is_named_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(Root reads any file: the refusal a user meets on a file of mode 000 is simulated.)"""
    made = tmp_path / "x.duckdb"
    made.write_bytes(b"\0" * 64)

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(paths, "open", refused, raising=False)
    with pytest.raises(DatabaseError) as e:
        paths.check_database_path(str(made))
    assert str(e.value) == f"cannot open {made}: Permission denied"


_STREAMS_PROBE = r"""
import json, os, sys
from pagedkv_sql import paths
saved = {fd: os.dup(fd) for fd in (0, 1, 2)}
names = ("stdin", "stdout", "stderr")
originals = [getattr(sys, n) for n in names]
found = []
for closed in ([0], [1], [2], [0, 1, 2]):
    for fd in closed:
        os.close(fd)
    paths.reserve_standard_streams()
    seen = {"closed": sorted(paths.CLOSED_STREAMS)}
    for fd, name in enumerate(names):
        stream = getattr(sys, name)
        seen[name] = [
            stream is not originals[fd], stream.fileno(),
            getattr(stream.buffer, "raw", stream.buffer).closefd,
            os.readlink(f"/proc/self/fd/{fd}") == os.devnull,
        ]
    found.append(seen)
    replaced = [getattr(sys, n) for n in names]  # kept alive: a closefd=True would close
    for fd, name in enumerate(names):
        os.dup2(saved[fd], fd)
        setattr(sys, name, originals[fd])
    paths.CLOSED_STREAMS.clear()
with open(sys.argv[1], "w") as out:
    json.dump(found, out)
"""


def test_closed_standard_streams_get_dev_null_each_on_its_own_descriptor(tmp_path: Path) -> None:
    result = tmp_path / "found.json"
    run = subprocess.run(
        [sys.executable, "-c", _STREAMS_PROBE, str(result)],
        input="",  # all three are pipes, not /dev/null, to begin with
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(result.read_text())

    def expected(closed: list[int]) -> dict[str, Any]:
        seen: dict[str, Any] = {"closed": closed}
        for fd, name in enumerate(("stdin", "stdout", "stderr")):
            # a closed one: a new stream on the same descriptor, which it does not own
            seen[name] = [fd in closed, fd, False, fd in closed]
        return seen

    assert found == [expected([0]), expected([1]), expected([2]), expected([0, 1, 2])]


def test_an_output_is_nameless_while_written_and_gets_the_usual_mode(tmp_path: Path) -> None:
    """Nothing of a write in progress shows in the directory (a SIGKILL then leaves
    nothing behind); the finished file has mode 0o666 less the umask, like any new file."""
    target = tmp_path / "out.csv"
    old = os.umask(0o022)
    try:
        with paths.atomic_output(target) as f:
            f.write(b"x\n")
            assert list(tmp_path.iterdir()) == []
    finally:
        os.umask(old)
    assert target.read_bytes() == b"x\n"
    assert target.stat().st_mode & 0o777 == 0o644


def test_a_database_path_through_a_file_is_named_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    inside = tmp_path / "file" / "x.duckdb"
    with pytest.raises(DatabaseError) as e:
        pagedkv_sql.connect(inside)
    assert str(e.value) == f"cannot open {inside}: Not a directory"


def test_a_failed_rename_leaves_no_part_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out.csv"

    def refused(src: str, dst: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "replace", refused)
    with pytest.raises(PagedKVError) as e, paths.atomic_output(target) as f:
        f.write(b"x\n")
    assert str(e.value) == f"cannot write {target}: Permission denied"
    assert list(tmp_path.iterdir()) == []


_SILENCE_PROBE = r"""
import os, sys
from pagedkv_sql import paths
paths.silence_stdout()
print(os.readlink("/proc/self/fd/1") == os.devnull, os.readlink("/proc/self/fd/2") == os.devnull,
      file=sys.stderr)
"""


def test_a_failed_stdout_is_pointed_at_dev_null_and_stderr_left_alone() -> None:
    run = subprocess.run(
        [sys.executable, "-c", _SILENCE_PROBE], capture_output=True, text=True, check=False
    )
    assert (run.returncode, run.stdout, run.stderr) == (0, "", "True False\n")


@pytest.mark.parametrize(
    "message",
    [
        "IO Error: The file is not a valid DuckDB database file!",
        "IO Error: Corrupt database file: block checksum mismatch",
    ],
)
def test_either_corrupt_file_message_gets_the_database_file_hint(message: str) -> None:
    """paths.py: DuckDB says 'not a valid DuckDB database' or 'corrupt database file':
    each alone gets the hint (``and`` would ask for both)."""
    error = paths.database_io_error("x.duckdb", duckdb.IOException(message), "open")
    assert error.hint == "is it a DuckDB database file?"


def test_protect_output_refuses_inputs_and_hard_links(tmp_path: Path) -> None:
    from pagedkv_sql.paths import protect_output

    source = tmp_path / "in.facts"
    source.write_text("1\t2\n")
    os.link(source, tmp_path / "hard")
    with pytest.raises(UsageError, match="it is an input of this command"):
        protect_output(tmp_path / "hard", None, [source])
    protect_output(tmp_path / "other", str(tmp_path / "db"), [source])  # fine


def test_a_failed_output_leaves_no_partial_file(tmp_path: Path) -> None:
    from pagedkv_sql.errors import PagedKVError
    from pagedkv_sql.paths import atomic_output

    out = tmp_path / "out.tsv"
    out.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_output(out) as f:
        f.write(b"half")
        raise RuntimeError("writer failed")
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tsv"]
    with (
        pytest.raises(PagedKVError, match=r"cannot write .*: No such file or directory"),
        atomic_output(tmp_path / "missing" / "x"),
    ):
        pass


def test_a_spool_has_no_name_in_the_file_system() -> None:
    import io

    spool = paths.Spool(io.BytesIO(b"1\t2\n"))
    try:
        assert str(spool.path).startswith("/proc/self/fd/")
        assert spool.path.read_bytes() == b"1\t2\n"
    finally:
        spool.close()


# -- atomic_output: durable, and the umask read, never set -------------------------------


def test_the_umask_is_read_without_being_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """os.umask sets the mask for every thread; reading it must not call it at all."""
    calls: list[int] = []
    real = os.umask

    def spy(mask: int) -> int:
        calls.append(mask)
        return real(mask)

    old = real(0o027)
    try:
        monkeypatch.setattr(os, "umask", spy)
        assert paths.umask() == 0o027
        real(0o002)
        assert paths.umask() == 0o002
    finally:
        real(old)
    assert calls == []


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077, 0o002])
def test_a_written_file_gets_the_mode_of_a_new_file(tmp_path: Path, mask: int) -> None:
    target = tmp_path / "out.csv"
    old = os.umask(mask)
    try:
        with paths.atomic_output(target) as f:
            f.write(b"x\n")
        with paths.atomic_output(tmp_path / "again.csv") as f:  # over nothing, then over it
            f.write(b"y\n")
        with paths.atomic_output(target) as f:
            f.write(b"z\n")
    finally:
        os.umask(old)
    assert target.read_bytes() == b"z\n"
    assert target.stat().st_mode & 0o777 == 0o666 & ~mask


def test_the_file_and_its_directory_are_synced_before_and_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order that survives a power cut: data fsynced while nameless, renamed over the
    target, then the directory fsynced (else the rename may be lost, or name a file of
    zeros)."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    target = tmp_path / "out.csv"

    def fsync(fd: int) -> None:
        link = os.readlink(f"/proc/self/fd/{fd}")
        events.append("fsync dir" if link == str(tmp_path) else "fsync file")
        real_fsync(fd)

    def replace(a: Any, b: Any) -> None:
        events.append("rename")
        real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    with paths.atomic_output(target) as f:
        f.write(b"x" * 100_000)
    assert events == ["fsync file", "rename", "fsync dir"]
