"""Memory and spilling: DuckDB's ``memory_limit``, and a temp directory of the process's own.

A database opened by pagedkv spills (sorts, hash tables, joins larger than the memory
limit) to a directory that belongs to this process: beside the database file
(``DB.<pid>.tmp``, shared by the process's opens of that file, removed by the last), or
for ``:memory:`` a fresh one in the system's temp directory. DuckDB
creates it only when something spills and deletes it when the connection closes;
``remove`` deletes it too, for the cases DuckDB leaves it (an error on close). Each process
has its own, so two processes reading one file never delete each other's spill files.
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


def acquire(path: str) -> str:
    """``spill_directory(path)``, counted as used by one more open until ``release``."""
    directory = spill_directory(path)
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
