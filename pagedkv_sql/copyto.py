"""Row files written by DuckDB's own ``COPY (query) TO 'file'``: formatted by DuckDB's
threads in parallel, in the query's order (``preserve_insertion_order``, DuckDB's default),
compressed by DuckDB where the name asks (``.gz``, ``.zst``).

Only where DuckDB writes what output.py writes: integer columns with plain names (letters,
digits, ``_``) in facts, tsv, csv, json, jsonl and uncompressed Parquet. There the plain
bytes are the same (tests/test_copyto.py compares them for every format, compression and
command); compressed files are equal once decompressed (DuckDB's gzip and zstd streams are
not Python's byte for byte); DuckDB's Parquet holds the same schema and rows as pyarrow's,
not the same bytes. Everything else (strings, lists, nulls in a report, the table for
people, Arrow, a compressed Parquet file, stdout, a device or a FIFO) goes through
output.py.

The file is written as ``compression.output`` writes it: DuckDB writes a file with no name
yet (``/proc/self/fd/N`` of paths.atomic_output's unnamed file), renamed into place only
complete; an error, Ctrl-C or SIGKILL leaves the old file or none, and nothing beside it.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .compression import strip
from .errors import PagedKVError

if TYPE_CHECKING:
    from .database import Database

# DuckDB's options that give output.py's bytes, for each format DuckDB writes (not Parquet:
# DuckDB marks columns NOT NULL, or not, by its version, where pyarrow's schema never does)
OPTIONS = {
    "facts": "FORMAT csv, DELIMITER '\t', HEADER false",
    "tsv": "FORMAT csv, DELIMITER '\t', HEADER true",
    "csv": "FORMAT csv, HEADER true",
    "json": "FORMAT json, ARRAY true",
    "jsonl": "FORMAT json",
    "ndjson": "FORMAT json",
}
INTEGER_TYPES = frozenset(
    ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT")
)
PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FD_DIR = "/proc/self/fd"


def options(path: str | None, fmt: str) -> str | None:
    """The COPY options that write ``fmt`` to ``path`` as output.py would, or None where
    DuckDB cannot (stdout, a device or FIFO, a format DuckDB does not write (Parquet), a
    system without /proc/self/fd)."""
    if path is None or path == "-" or fmt not in OPTIONS or not os.path.isdir(FD_DIR):
        return None
    kind = strip(path)[1]
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
    except FileNotFoundError:
        pass
    except OSError:
        return None  # the Python writer names the problem
    return f"{OPTIONS[fmt]}, COMPRESSION {kind or 'none'}, USE_TMP_FILE false"


def writes(names: Sequence[str], types: Sequence[Any]) -> bool:
    """Whether DuckDB's writers give output.py's bytes for these columns (a relation's
    ``columns`` and ``types``): integers only, plain names only."""
    return bool(names) and all(
        PLAIN_NAME.fullmatch(n) and str(t) in INTEGER_TYPES
        for n, t in zip(names, types, strict=True)
    )


def copy(cursor: Any, query: str, path: str, fmt: str, copy_options: str) -> int:
    """``COPY (query) TO path`` on ``cursor``, written whole or not at all; the number of
    rows written. An empty JSON array is written as output.py writes it (``[`` and ``]``
    on two lines; DuckDB puts an empty line between)."""
    import duckdb

    from .compression import compressing
    from .paths import atomic_output

    with atomic_output(path) as f:
        try:
            rows = cursor.execute(
                f"COPY ({query.strip().rstrip(';')}) TO '{FD_DIR}/{f.fileno()}' ({copy_options})"
            ).fetchone()[0]
        except duckdb.Error as e:
            if type(e).__name__ == "InterruptException" or "interrupted" in str(e).lower():
                raise KeyboardInterrupt from None
            if isinstance(e, duckdb.IOException):
                raise PagedKVError(f"cannot write {path}: {io_reason(e)}") from None
            raise
        if rows == 0 and fmt == "json":
            f.seek(0)
            f.truncate()
            with compressing(f, strip(path)[1]) as stream:
                stream.write(b"[\n]\n")
    return int(rows)


def io_reason(error: Exception) -> str:
    """The reason of DuckDB's IO error as the OS words it (``No space left on device``):
    from the errno DuckDB attaches, else the end of its message's first line."""
    text = str(error)
    found = re.search(r'"errno":\s*"(\d+)"', text)
    if found:
        return os.strerror(int(found.group(1)))
    return text.splitlines()[0].rstrip().rsplit(": ", 1)[-1] if text else type(error).__name__


def resolve(database: Database, path: str | None, fmt: str) -> int | None:
    """``resolve -o path`` written by DuckDB: the rows written, or None (nothing done)
    where output.py must write them: the format or file is not one DuckDB writes as
    output.py does, or the sorted bag is not proven a set (then only the reader that drops
    neighbouring duplicates gives the spec's rows)."""
    from .sqlfiles import statement

    copy_options = options(path, fmt)
    if path is None or copy_options is None:
        return None
    with database.cursor("resolve") as cur:
        proven = cur.execute(statement("resolve_bag_is_set")).fetchone()
        if proven is None or not proven[0]:
            return None
        return copy(cur, statement("resolve_sorted"), path, fmt, copy_options)


__all__ = ["INTEGER_TYPES", "OPTIONS", "copy", "options", "resolve", "writes"]
