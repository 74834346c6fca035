"""Memory and spilling: DuckDB's ``memory_limit``, and a temp directory of the process's own.

A database opened by pagedkv spills (sorts, hash tables, joins larger than the memory
limit) to a directory that belongs to this process: beside the database file
(``DB.<pid>.tmp``, shared by the process's opens of that file, removed by the last), or
for ``:memory:`` a fresh one in the system's temp directory. DuckDB
creates it only when something spills and deletes it when the connection closes;
``remove`` deletes it too, for the cases DuckDB leaves it (an error on close). Each process
has its own, so two processes reading one file never delete each other's spill files.
A process killed before it could close leaves its directory behind: the next open of the
same file (or the next ``:memory:`` open) removes such directories of processes that no
longer run (``sweep``).
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

ENV_MEMORY_LIMIT = "PAGEDKV_MEMORY_LIMIT"


_LOCK = threading.Lock()
_USERS: dict[str, int] = {}  # spill directory -> opens in this process that use it


def spill_directory(path: str) -> str:
    """The temp directory for an open of the database ``path``: one per process and file
    (DuckDB shares one instance among a process's opens of a file, and refuses a second
    open whose settings differ), a fresh one for each ``:memory:`` database."""
    if path == ":memory:" or path.startswith(":memory:"):
        import tempfile  # only here: it costs start-up time (docs/performance.md)

        tag = f"{os.getpid()}-{os.urandom(4).hex()}"
        return str(Path(tempfile.gettempdir()) / f"pagedkv-{tag}.tmp")
    return f"{Path(path).absolute()}.{os.getpid()}.tmp"


def _dead(pid: str) -> bool:
    """Whether no process with id ``pid`` runs (an unknown answer counts as alive)."""
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)  # pragma: no mutate (another signal would reach strangers' pids)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):
        return False
    return False


def sweep(directory: str) -> list[str]:
    """Remove the spill directories left beside ``directory`` by processes that died
    without closing (``NAME.<pid>.tmp`` of the same file, or ``pagedkv-<pid>-<tag>.tmp``
    in the temp directory); the names removed. Names are compared as strings, never as
    glob patterns, and only directories of dead processes are touched; they are looked at,
    and named, in sorted order."""
    here = Path(directory)
    name = here.name
    in_temp = name.startswith("pagedkv-")
    prefix = "pagedkv-" if in_temp else name[: -len(".tmp")].rsplit(".", 1)[0] + "."
    removed: list[str] = []
    try:
        entries = sorted(os.scandir(here.parent), key=lambda entry: entry.name)
    except OSError:
        return removed
    for entry in entries:
        if not (entry.name.startswith(prefix) and entry.name.endswith(".tmp")):
            continue
        middle = entry.name[len(prefix) : -len(".tmp")]
        pid = middle.partition("-")[0] if in_temp else middle
        if entry.name == name or not _dead(pid):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                remove(entry.path)
                removed.append(entry.name)
        except OSError:
            continue
    return removed


def acquire(path: str) -> str:
    """``spill_directory(path)``, counted as used by one more open until ``release``;
    directories that dead processes left for the same file are removed first."""
    directory = spill_directory(path)
    sweep(directory)
    with _LOCK:
        _USERS[directory] = _USERS.get(directory, 0) + 1
    return directory


def release(directory: str | None) -> None:
    """One open is done with ``directory``; the last one removes it."""
    if directory is None:
        return
    with _LOCK:
        left = _USERS.get(directory, 1) - 1
        if left > 0:
            _USERS[directory] = left
            return
        _USERS.pop(directory, None)
    remove(directory)


def remove(directory: str | None) -> None:
    """Delete a spill directory and whatever is left in it (nothing if it is not there)."""
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
