"""Memory and spilling: DuckDB's ``memory_limit``, and a temp directory of the process's own.

A database opened by pagedkv spills (sorts, hash tables, joins larger than the memory
limit) to a directory that this process made and marks as its own: beside the database
file (``DB.<pid>.<token>.tmp``, shared by the process's opens of that file, removed by
the last), or for ``:memory:`` a fresh one in the system's temp directory
(``pagedkv-<pid>-<token>.tmp``). The token is random, so no two processes share a name,
not even with one pid in two PID namespaces (containers sharing a volume).

Each directory holds a marker file, ``MARKER``, naming the directory's token and its
owner's uid, and locked (``flock``) by the process for as long as it uses the directory.
A process killed before it could close leaves its directory behind; the next open of the
same file (or the next ``:memory:`` open) removes such leftovers (``sweep``) — and only
what is provably one: a real directory (never a symlink), owned by the sweeping user,
with a regular, same-owner marker whose token matches the directory's name, whose lock
nobody holds. The kernel drops a dead process's lock whatever its PID namespace, so a
live process elsewhere keeps its directory; a directory without a marker (another
program's, another user's, an older pagedkv's) is never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import threading
from pathlib import Path

ENV_MEMORY_LIMIT = "PAGEDKV_MEMORY_LIMIT"
MARKER = ".pagedkv-spill"
_MAGIC = "pagedkv-sql spill directory"
_MARKER_LIMIT = 256  # bytes: a marker is one short line; anything longer is not one

_LOCK = threading.Lock()
_MAKING = threading.Lock()
# spill directory -> [opens in this process that use it, the held marker's fd or -1, the
# pid that made it (a forked child inherits the table, not the directories)]
_USERS: dict[str, list[int]] = {}
_AT_EXIT: list[bool] = []  # whether _remove_all is registered
_TOKENS: dict[int, str] = {}  # pid -> this process's token (a forked child draws its own)


def _token() -> str:
    """This process's random token (8 bytes, hex), drawn once per pid."""
    pid = os.getpid()
    with _LOCK:
        if pid not in _TOKENS:
            _TOKENS[pid] = os.urandom(8).hex()
        return _TOKENS[pid]


def spill_directory(path: str) -> str:
    """The temp directory for an open of the database ``path``: one per process and file
    (DuckDB shares one instance among a process's opens of a file, and refuses a second
    open whose settings differ), a fresh one for each ``:memory:`` database."""
    if path == ":memory:" or path.startswith(":memory:"):
        import tempfile  # only here: it costs start-up time (docs/performance.md)

        tag = f"{os.getpid()}-{os.urandom(8).hex()}"
        return str(Path(tempfile.gettempdir()) / f"pagedkv-{tag}.tmp")
    return f"{Path(path).absolute()}.{os.getpid()}.{_token()}.tmp"


_IN_TEMP = re.compile(r"pagedkv-(\d+)-([0-9a-f]{16})\.tmp")
_BESIDE = re.compile(r"(.+)\.(\d+)\.([0-9a-f]{16})\.tmp", re.S)


def _parse(name: str) -> tuple[str | None, str] | None:
    """``(file name, token)`` of a spill directory's name beside a file
    (``NAME.<pid>.<token>.tmp``), ``(None, token)`` of one in the temp directory
    (``pagedkv-<pid>-<token>.tmp``), or None for any other name."""
    if match := _IN_TEMP.fullmatch(name):
        return None, match[2]
    if match := _BESIDE.fullmatch(name):
        return match[1], match[3]
    return None


def _marker_text(token: str, magic: str = _MAGIC) -> bytes:
    return f"{magic} token={token} uid={os.geteuid()} pid={os.getpid()}\n".encode()


def _make(directory: str) -> int | None:
    """Create ``directory`` (mode 0700) with its marker, locked; the marker's fd, held
    for as long as the directory is in use. None if it cannot be made here (a read-only
    mount): DuckDB then fails only if something spills, and nothing is ever removed."""
    parsed = _parse(Path(directory).name)
    try:
        os.mkdir(directory, 0o700)
    except OSError:
        return None
    fd = mark(directory, parsed[1] if parsed else "")
    if fd is None:
        shutil.rmtree(directory, ignore_errors=True)
    return fd


def mark(directory: str, token: str, marker: str = MARKER, magic: str = _MAGIC) -> int | None:
    """Mark the new directory ``directory`` as this process's: a ``marker`` file naming
    ``magic``, ``token`` and the owner, locked (``flock``); its fd, held for as long as the
    directory is in use (a sweep takes a directory whose marker nobody locks for a
    leftover). None when it cannot be marked (then it is never swept either)."""
    # the lock is taken before the marker has its name: a sweep never sees it unlocked
    draft = os.path.join(directory, f"{marker}.new")
    try:
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, _marker_text(token, magic))
        os.rename(draft, os.path.join(directory, marker))
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(draft)
        return None
    return fd


def leftover(
    parent_fd: int, name: str, token: str, marker: str = MARKER, magic: str = _MAGIC
) -> int | None:
    """If ``name`` (in the directory ``parent_fd``, its token ``token``) is a directory
    this user's pagedkv marked (``mark``) and no live process uses, its marker's fd,
    locked; else None."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            return None
        dfd = os.open(name, flags | os.O_DIRECTORY, dir_fd=parent_fd)
    except OSError:
        return None
    try:
        if not os.path.samestat(info, os.fstat(dfd)):
            return None  # swapped between the look and the open
        fd = os.open(marker, flags, dir_fd=dfd)
    except OSError:
        return None
    finally:
        os.close(dfd)
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode) or found.st_uid != os.geteuid():
            raise OSError
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: a live process's
        text = os.read(fd, _MARKER_LIMIT).decode("ascii")
        fields = text.split()
        if text[: len(magic)] != magic or f"token={token}" not in fields:
            raise OSError
        if f"uid={os.geteuid()}" not in fields:
            raise OSError
    except (OSError, UnicodeDecodeError):
        os.close(fd)
        return None
    return fd


def sweep(directory: str) -> list[str]:
    """Remove the spill directories left beside ``directory`` by processes that ended
    without closing (``NAME.<pid>.<token>.tmp`` of the same file, or
    ``pagedkv-<pid>-<token>.tmp`` in the temp directory); the names removed. Names are
    compared as strings, never as glob patterns; only leftovers proven by their marker
    (module docstring) are touched, looked at and named in sorted order."""
    here = Path(directory)
    name = here.name
    own = _parse(name)
    if own is None:
        return []
    removed: list[str] = []
    try:
        parent_fd = os.open(here.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return removed
    try:
        names = sorted(os.listdir(parent_fd))
        for entry in names:
            parsed = _parse(entry)
            if entry == name or parsed is None or parsed[0] != own[0]:
                continue  # not a spill directory of the same file (or of ``:memory:``)
            fd = leftover(parent_fd, entry, parsed[1])
            if fd is None:
                continue
            try:
                remove(str(here.parent / entry))
                removed.append(entry)
            except OSError:
                continue
            finally:
                os.close(fd)
    except OSError:
        pass
    finally:
        os.close(parent_fd)
    return removed


def acquire(path: str) -> str:
    """``spill_directory(path)``, made and marked, counted as used by one more open until
    ``release``; leftovers of ended processes for the same file are removed first."""
    directory = spill_directory(path)
    with _MAKING:  # one thread at a time makes (or finds) a directory
        with _LOCK:
            users = _USERS.get(directory)
            if users is not None:
                users[0] += 1
                return directory
        sweep(directory)
        fd = _make(directory)
        with _LOCK:
            _USERS[directory] = [1, -1 if fd is None else fd, os.getpid()]
            if fd is not None and not _AT_EXIT:
                import atexit

                atexit.register(_remove_all)
                _AT_EXIT.append(True)
    return directory


def _remove_all() -> None:
    """At exit: remove the directories of opens never closed (this process's only)."""
    with _LOCK:
        held = [(d, u[1]) for d, u in _USERS.items() if u[1] >= 0 and u[2] == os.getpid()]
        _USERS.clear()
    for directory, fd in held:
        with contextlib.suppress(OSError):
            remove(directory)
        os.close(fd)


def release(directory: str | None) -> None:
    """One open is done with ``directory``; the last one removes it (only if it made it)."""
    if directory is None:
        return
    with _LOCK:
        users = _USERS.get(directory)
        if users is None:
            return
        users[0] -= 1
        if users[0] > 0:
            return
        del _USERS[directory]
    fd = users[1]
    if fd < 0 or users[2] != os.getpid():
        return  # not made by this process: not removed by it either
    try:
        remove(directory)  # while still locked: no sweep takes it for a leftover meanwhile
    except OSError:
        pass  # left behind, still marked: the next open's sweep removes it
    finally:
        os.close(fd)


def remove(directory: str | None) -> None:
    """Delete a spill directory and whatever is left in it (nothing if it is not there);
    symlinks inside are removed, never followed (``shutil.rmtree`` works by fd)."""
    if directory is not None:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(directory)
