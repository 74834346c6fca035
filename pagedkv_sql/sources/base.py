"""The Source every format family builds on: how it gives DuckDB a SELECT of its relation's
columns as strictly validated BIGINTs (`scan_sql`), explains a refusal (`diagnose`) and
finds the rows a constraint refused (`locate`)."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

import duckdb

from .. import paths
from ..dbutil import rollback, run
from ..errors import Problem

MAX_PROBLEMS = 1000  # problems kept per load; the total is still counted
source_serial = count()
log = logging.getLogger("pagedkv_sql.sources")
_PAGEDKV_ERROR = re.compile(r"pagedkv: (.*)")


def sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def column_problems(columns: tuple[str, ...], found: list[str]) -> list[str]:
    """What is wrong with the column names a file or an Arrow schema gives for a relation's
    ``columns``: missing, unknown or repeated ones (empty: none)."""
    missing = [c for c in columns if c not in found]
    unknown = [c for c in found if c not in columns]
    dupes = sorted({c for c in found if found.count(c) > 1})
    problems = []
    if missing:
        problems.append(f"missing column(s) {', '.join(missing)}")
    if unknown:
        problems.append(f"unknown column(s) {', '.join(repr(c) for c in unknown)}")
    if dupes:
        problems.append(f"repeated column(s) {', '.join(dupes)}")
    return problems


def problem_from_duckdb(label: str, error: duckdb.Error) -> Problem:
    """Our own error() messages carry 'pagedkv: '; anything else is DuckDB's first line."""
    text = str(error)
    match = _PAGEDKV_ERROR.search(text)
    message = match.group(1) if match else text.splitlines()[0]
    return Problem(label, None, None, message.strip())


@dataclass
class Source:
    relation: str
    label: str
    reusable: bool = True  # can it be scanned twice (to diagnose a refusal)?
    # DuckDB's reader refused what our own grammar accepts (mixed line endings, say), or
    # cannot be trusted with the file (NUL bytes, a line longer than its buffer): the
    # source reads itself in Python instead and hands DuckDB Arrow batches.
    fallback: bool = False
    # files this source made (a spool of stdin, a FIFO or /proc) and paths it handed to
    # DuckDB: removed by close()
    spools: list[paths.Spool] = field(default_factory=list)
    duckdb_paths: list[paths.DuckDBPath] = field(default_factory=list)

    def scan_sql(self, con: duckdb.DuckDBPyConnection) -> str:
        raise NotImplementedError

    def diagnose(self, con: duckdb.DuckDBPyConnection) -> tuple[int, list[Problem]]:
        """After the bulk load refused this source: how many things are malformed, and
        the first MAX_PROBLEMS of them."""
        try:
            run(con, "BEGIN")
            run(con, f"CREATE TEMP TABLE _pagedkv_probe AS {self.scan_sql(con)}")
        except duckdb.Error as e:
            return 1, [problem_from_duckdb(self.label, e)]
        finally:
            rollback(con)
        return 0, []

    def duckdb_path(self, path: Path) -> str:
        """``path`` spelled for DuckDB's readers, which would expand a glob in it."""
        spelling = paths.DuckDBPath(path)
        self.duckdb_paths.append(spelling)
        return sql_string(str(spelling))

    def locate(
        self, con: duckdb.DuckDBPyConnection, rows: set[tuple[int, ...]]
    ) -> dict[tuple[int, ...], list[str]]:
        return {}

    def close(self) -> None:
        """Release what the source holds (spooled files, DuckDB's spellings of paths)."""
        for spelling in self.duckdb_paths:
            spelling.close()
        self.duckdb_paths.clear()
        for spool in self.spools:
            spool.close()
        self.spools.clear()
