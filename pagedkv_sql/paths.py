"""Paths the user names, taken literally and never at the cost of their data.

- An output never lands on the database file, its write-ahead log or an input of the same
  command (`protect_output`), and it is written beside its target and renamed into place
  only when complete, so a failure leaves no partial file (`atomic_output`); a set of
  files is written into a draft directory and moved into place as one
  (filesets.py's `file_set`).
- DuckDB's readers expand globs (`[ ] * ? {}`) and a leading `~`; `duckdb_path` gives
  them a spelling that names exactly the file the user gave.
- A database path must name a regular DuckDB file (or nothing yet): `check_database_path`
  refuses FIFOs, devices, directories and other formats before DuckDB can hang on them or
  try to fetch an extension for them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from .errors import DatabaseError, PagedKVError, UsageError

_GLOB = frozenset("*?[]{}~")
_DUCKDB_MAGIC = b"DUCK"  # bytes 8-11 of every DuckDB database file
_SQLITE_MAGIC = b"SQLite format 3\x00"
MEMORY = ":memory:"
# the CLI's database file and its variable (the library's default is ":memory:"); here,
# not in database.py, so that --help needs no DuckDB
DEFAULT_DB = "pagedkv.duckdb"
ENV_DB = "PAGEDKV_DB"


def wal_of(database: str) -> str:
    return database + ".wal"


def _same(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def protect_output(
    output: str | os.PathLike[str],
    database: str | None = None,
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> None:
    """Refuse an output path that is the database, its WAL, one of the inputs, or any
    DuckDB database file (no output of ours is one: `synth-log pagedkv.duckdb --steps 5`, with
    no --db to compare, wrote a step log over the default database)."""
    protected: list[tuple[str, str]] = []
    if database and database != MEMORY:
        protected += [(database, "the database"), (wal_of(database), "the database's WAL")]
    protected += [(str(p), "an input of this command") for p in inputs]
    for path, what in protected:
        if _same(output, path):
            raise UsageError(
                f"refusing to write {output}: it is {what} ({path})",
                hint="choose another --output path",
            )
    if _is_duckdb_file(output):
        raise UsageError(
            f"refusing to write {output}: it is a DuckDB database",
            hint="choose another output path (outputs are never databases)",
        )


def check_writable(output: str | os.PathLike[str], option: str = "--output") -> None:
    """Refuse, before any work is done for it, an output file that could not be written:
    a directory, a missing parent directory, or one where this user cannot create a file
    (tried: an anonymous file, gone at once). A device or FIFO (/dev/stdout) is written
    as it is, and not tried."""
    target = Path(output)
    try:
        mode = os.stat(target).st_mode
    except OSError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise UsageError(
            f"{option} {output}: it is a directory; nothing was done",
            hint=f"name a file in it ({target / 'NAME'})",
        )
    if mode is not None and not stat.S_ISREG(mode):
        return
    parent = target.parent
    if not parent.is_dir():
        raise UsageError(
            f"{option} {output}: no directory {parent}; nothing was done",
            hint="create the directory first, or name a file in one that exists",
        )
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        raise UsageError(
            f"{option} {output}: cannot create a file in {parent}: {e.strerror or e}; "
            "nothing was done",
            hint="name a file in a directory you can write",
        ) from None


def _is_duckdb_file(path: str | os.PathLike[str]) -> bool:
    """A regular file (or a link to one) that starts as DuckDB's database files do."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        with open(path, "rb") as f:
            return f.read(12)[8:12] == _DUCKDB_MAGIC
    except OSError:
        return False


def _is_regular_or_absent(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except FileNotFoundError:
        return True


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """Write ``path`` completely or not at all. A regular file (or a new one) is written to
    a temporary file beside it and renamed into place on success; a device or FIFO
    (``/dev/stdout``, a pipe) is written directly. OSError becomes a PagedKVError."""
    target = Path(path)
    try:
        if not _is_regular_or_absent(target):
            with target.open("wb") as f:
                yield f
            return
        anonymous = _anonymous_file(target.parent)
        if anonymous is None:  # pragma: no cover - no O_TMPFILE here
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
        else:
            fd, tmp = anonymous, ""
    except OSError as e:
        raise PagedKVError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if tmp:  # mkstemp made it 0600: the mode a new file gets, without os.umask
                os.fchmod(f.fileno(), 0o666 & ~umask())
            os.fsync(f.fileno())  # the data is on disk before any name points at it
            if not tmp:  # give the complete file a name only now, then move it in place
                name = f".{target.name}.{secrets.token_hex(6)}.part"
                _link_anonymous(f.fileno(), target.parent, name)
                tmp = str(target.parent / name)
        os.replace(tmp, target)
        tmp = ""
        fsync(target.parent)  # and the rename survives a crash
    except OSError as e:
        raise PagedKVError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def fsync(path: Path | str, flags: int = os.O_DIRECTORY) -> None:
    """A directory (or, with ``flags`` 0, a file) on disk."""
    fd = os.open(path, os.O_RDONLY | flags | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _link_anonymous(fd: int, directory: Path, name: str) -> None:
    """Name an O_TMPFILE file: linkat(AT_SYMLINK_FOLLOW) through /proc/self/fd (CPython
    uses plain link(), which would link the /proc symlink itself, unless a dir_fd is given)."""
    # (read-only: O_RDONLY is 0; Python opens every descriptor close-on-exec, PEP 446)
    dir_fd = os.open(directory, os.O_DIRECTORY)
    try:
        os.link(f"{_FD_DIR}/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
    finally:
        os.close(dir_fd)


def _anonymous_file(directory: Path) -> int | None:
    """A file with no name yet in ``directory`` (Linux O_TMPFILE): a write interrupted even
    by SIGKILL leaves nothing behind. None where that is not supported."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or not os.path.isdir(_FD_DIR):  # pragma: no cover - not Linux
        return None
    try:
        return os.open(directory, flag | os.O_WRONLY | os.O_CLOEXEC, 0o666)  # umask applied
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None
        raise


def umask() -> int:
    """The process's umask now, read without changing it (os.umask would set it, for
    every thread, for a moment): Linux shows it in /proc/self/status (``Umask:``).
    Elsewhere, the umask of import time (read there with os.umask, once)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):  # pragma: no cover - not Linux
        pass
    return _IMPORT_UMASK  # pragma: no cover - not Linux


if os.path.exists("/proc/self/status"):
    _IMPORT_UMASK = 0o022  # unused: read from /proc each time
else:  # pragma: no cover - not Linux
    _IMPORT_UMASK = os.umask(0o022)
    os.umask(_IMPORT_UMASK)

_FD_DIR = "/proc/self/fd"  # where Linux names an open file: opened by path, no glob in it


class DuckDBPath:
    """A spelling of a source file that DuckDB reads literally. On Linux the file is
    opened here and DuckDB reads ``/proc/self/fd/N``: exactly that file, even if the name
    is replaced meanwhile, and nothing to clean up after a SIGKILL. Elsewhere: the absolute
    path, or, when it holds a glob character, a symlink to it in a private directory."""

    def __init__(self, path: Path) -> None:
        self.path = path.absolute()
        self._tmpdir: str | None = None
        self._fd: int | None = None
        self._spelling: str | None = None

    def __str__(self) -> str:
        if self._spelling is None:
            text = str(self.path)
            if os.path.isdir(_FD_DIR):
                self._fd = os.open(text, os.O_RDONLY)  # close-on-exec: PEP 446
                text = f"{_FD_DIR}/{self._fd}"
            elif _GLOB.intersection(text):  # pragma: no cover - not Linux
                self._tmpdir = tempfile.mkdtemp(prefix="pagedkv-src-")
                link = os.path.join(self._tmpdir, "source" + self.path.suffix.lower())
                os.symlink(text, link)
                text = link
            self._spelling = text
        return self._spelling

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._tmpdir is not None:  # pragma: no cover - not Linux
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
        self._spelling = None


class Spool:
    """A stream's bytes in a temporary file that can be read by path, as often as needed,
    while the spool is open. On Linux the file has no name at all (O_TMPFILE, read as
    /proc/self/fd/N): nothing is left behind, even after a SIGKILL."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._file: IO[bytes] | None = None
        self._named: str | None = None
        if os.path.isdir(_FD_DIR):
            self._file = tempfile.TemporaryFile(prefix="pagedkv-spool-")  # noqa: SIM115
            self.path = Path(f"{_FD_DIR}/{self._file.fileno()}")
        else:  # pragma: no cover - not Linux
            self._file = tempfile.NamedTemporaryFile(prefix="pagedkv-spool-", delete=False)  # noqa: SIM115
            self._named = self._file.name
            self.path = Path(self._named)
        try:
            shutil.copyfileobj(stream, self._file)
            self._file.flush()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._named is not None:  # pragma: no cover - not Linux
            with contextlib.suppress(OSError):
                os.unlink(self._named)
            self._named = None


def check_database_path(path: str) -> bool:
    """Refuse a --db path that is not a DuckDB file; return whether the file exists."""
    if path == "":
        raise UsageError(
            "--db is empty (an unset variable?)",
            hint="give a database file, or ':memory:' for a throwaway database",
        )
    if path == MEMORY:
        return False
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    except OSError as e:
        raise DatabaseError(f"cannot open {path}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise DatabaseError(
            f"cannot open {path}: it is a directory, not a database file",
            hint=f"give --db (or $PAGEDKV_DB) a file, e.g. {os.path.join(path, 'kv.duckdb')}",
        )
    if not stat.S_ISREG(st.st_mode):
        raise DatabaseError(
            f"cannot open {path}: it is not a regular file (a FIFO, socket or device)",
            hint="a database is a regular file; give a path that names one or none yet",
        )
    if st.st_size == 0:
        raise DatabaseError(
            f"cannot open {path}: it is an empty file, not a DuckDB database",
            hint="remove it to start afresh, or point --db at another file",
        )
    try:
        with open(path, "rb") as f:
            head = f.read(len(_SQLITE_MAGIC))  # the longer magic; DuckDB's is at 8-11
    except OSError as e:
        raise DatabaseError(f"cannot open {path}: {e.strerror}") from None
    if head[8:12] != _DUCKDB_MAGIC:
        kind = "a SQLite database" if head.startswith(_SQLITE_MAGIC) else "not a DuckDB database"
        raise DatabaseError(
            f"cannot open {path}: it is {kind}",
            hint="point --db at a pagedkv-sql database, or at a new file to create one",
        )
    return True


def remove_new_database(path: str) -> None:
    """A database this process failed to create leaves no empty file (or WAL) behind,
    which would later read as 'not a valid DuckDB database'."""
    for p in (path, wal_of(path)):
        with contextlib.suppress(OSError):
            os.unlink(p)


def database_io_error(path: str, error: Exception, doing: str) -> DatabaseError:
    """DuckDB failed to write or read ``path``: say why in one line, with the usual fix."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    lower = text.lower()
    if "no space left" in lower or "disk full" in lower or "file too large" in lower:
        hint = "free some space (or point --db at another disk) and retry"
    elif "permission denied" in lower or "read-only file system" in lower:
        hint = (
            "DuckDB writes the database and a .wal file beside it: the file and its "
            "directory must be writable"
        )
    elif "corrupt database file" in lower or "not a valid duckdb database" in lower:
        hint = "is it a DuckDB database file?"  # DuckDB 1.5 says so as an IO error
    else:
        hint = ""
    return DatabaseError(f"cannot {doing} {path}: {text}", hint=hint)


CLOSED_STREAMS: set[int] = set()  # standard descriptors that were closed at start


def reserve_standard_streams() -> None:
    """Give a closed stdin, stdout or stderr /dev/null, remembering which were closed.

    Otherwise the next file opened (the database!) takes descriptor 0, 1 or 2 and whatever
    is written to stdout or stderr lands in it."""
    import sys

    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            CLOSED_STREAMS.add(fd)
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:  # pragma: no cover - the lowest free descriptor is taken
                os.dup2(null, fd)
                os.close(null)
    if CLOSED_STREAMS:
        if 0 in CLOSED_STREAMS:
            sys.stdin = open(0, closefd=False)  # noqa: SIM115
        if 1 in CLOSED_STREAMS:
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        if 2 in CLOSED_STREAMS:
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115


def silence_stdout() -> None:
    """After stdout failed (a full disk, a closed pipe): point descriptor 1 at /dev/null so
    that the final flush at exit neither fails again nor prints a traceback."""
    import sys

    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stdout.flush()
