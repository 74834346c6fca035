"""Memory and spilling: DuckDB's ``memory_limit``, and a temp directory of one open's own.

A database opened by pagedkv spills (sorts, hash tables, joins larger than the memory
limit) to a directory that belongs to that one open: beside the database file
(``DB.<pid>-<random>.tmp``), or for ``:memory:`` in the system's temp directory. DuckDB
creates it only when something spills and deletes it when the connection closes;
``remove`` deletes it too, for the cases DuckDB leaves it (an error on close). Each open
has its own, so two processes reading one file never delete each other's spill files.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ENV_MEMORY_LIMIT = "PAGEDKV_MEMORY_LIMIT"


def spill_directory(path: str) -> str:
    """A fresh, not yet existing temp directory for one open of the database ``path``."""
    tag = f"{os.getpid()}-{os.urandom(4).hex()}"
    if path == ":memory:" or path.startswith(":memory:"):
        import tempfile  # only here: it costs start-up time (docs/performance.md)

        return str(Path(tempfile.gettempdir()) / f"pagedkv-{tag}.tmp")
    return f"{Path(path).absolute()}.{tag}.tmp"


def remove(directory: str | None) -> None:
    """Delete a spill directory and whatever is left in it (nothing if it is not there)."""
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)
