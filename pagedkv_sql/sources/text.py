"""The text family: facts (TSV without a header, Soufflé's), TSV and CSV files, read by
DuckDB's CSV reader where it can be trusted with the file and by pagedkv's own scanner
(textscan.py) where it cannot."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import duckdb
import pyarrow as pa

from .. import textscan
from ..errors import InputError, Problem
from ..numbers import strict_bigint_sql
from ..relations import INPUT_RELATIONS, arrow_schema
from .base import MAX_PROBLEMS, Source, column_problems, log, source_serial, sql_string

# format -> (delimiter, has a header, quoted)
TEXT_FORMATS: dict[str, tuple[str, bool, bool]] = {
    "facts": ("\t", False, False),
    "tsv": ("\t", True, False),
    "csv": (",", True, True),
}
PLAIN_BYTES = b"0123456789+-\n"
_CHUNK = textscan.CHUNK
# A line of 2 * _BLOCK bytes or more covers a whole aligned block: no block may lack a line end.
_BLOCK = textscan.MAX_LINE // 2


class Preflight(NamedTuple):
    plain: bool  # only digits, signs, the delimiter and newlines
    python_only: bool  # NUL bytes or a line of a MiB or more: DuckDB's reader loses those


# read by the Python reader, which never asks whether the file is plain
_PYTHON_ONLY = Preflight(plain=False, python_only=True)


def preflight(path: Path, delimiter: str, header: bool) -> Preflight:
    """One C-speed pass over a text file (bytes.translate, ~1.5 GB/s; memchr for the
    rest): is it plain, and can DuckDB's reader be trusted with every byte of it? DuckDB
    reads a NUL byte as the end of a file and silently drops a line of tens of MB at the
    start or end of one; the Python reader loads or names every line instead."""
    allowed = PLAIN_BYTES + delimiter.encode()
    plain = True
    with path.open("rb") as f:
        if header and len(f.readline(textscan.MAX_LINE + 1)) > textscan.MAX_LINE:
            return _PYTHON_ONLY
        while chunk := f.read(_CHUNK):
            if b"\0" in chunk:
                return _PYTHON_ONLY
            for i in range(0, len(chunk) - _BLOCK + 1, _BLOCK):
                if chunk.find(b"\n", i, i + _BLOCK) < 0 and chunk.find(b"\r", i, i + _BLOCK) < 0:
                    return _PYTHON_ONLY
            if plain and chunk.translate(None, allowed):
                plain = False
    return Preflight(plain, False)


def contains(path: Path, needle: bytes) -> bool:
    """Does the file hold ``needle`` (one byte)? A C-speed pass that stops at the first."""
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            if needle in chunk:
                return True
    return False


def only_plain_decimals(path: Path, delimiter: str, header: bool) -> bool:
    """Does the file (after its header line) hold only digits, signs, the delimiter and
    newlines?"""
    return preflight(path, delimiter, header).plain


@dataclass
class TextSource(Source):
    path: Path = Path()
    format: str = "facts"
    columns_in_file: tuple[str, ...] = ()
    # None: not looked at yet; True: only digits, signs, delimiters and newlines
    plain: bool | None = None
    carriage_returns: bool | None = None  # None: not looked at yet

    def __post_init__(self) -> None:
        columns = INPUT_RELATIONS[self.relation]
        delimiter, header, quoted = TEXT_FORMATS[self.format]
        if not header:
            self.columns_in_file = columns
            return
        found = [c.strip() for c in textscan.read_header(self.path, delimiter, quoted)]
        parts = column_problems(columns, found)
        if parts:
            raise InputError(
                f"{self.label}:1: header of {self.relation}: {'; '.join(parts)}",
                hint=f"the header must name the columns {', '.join(columns)} (in any order)",
            )
        self.columns_in_file = tuple(found)

    def scan_sql(self, con: duckdb.DuckDBPyConnection) -> str:
        if self.fallback:
            return self._fallback_sql(con)
        delimiter, header, quoted = TEXT_FORMATS[self.format]
        if self.plain is None:
            checked = preflight(self.path, delimiter, header)
            self.plain = checked.plain
            if checked.python_only:
                self.fallback = True
                return self._fallback_sql(con)
        if not self.plain and self.carriage_returns is None:
            self.carriage_returns = contains(self.path, b"\r")
        if self.carriage_returns:
            # DuckDB's reader wants one kind of line end; pyarrow's takes LF, CRLF and CR
            # mixed, at the same speed, before the same strict cast
            found = self._arrow_csv_sql(con)
            if found is not None:
                return found
        # One column more than the relation has: DuckDB drops a trailing delimiter
        # silently, but then fills the extra column with '' (a padded line leaves it NULL),
        # so a line with too many fields is caught. nullstr keeps empty fields '' too.
        # A plain file is read as BIGINT straight away: on those bytes DuckDB's integer
        # parser accepts exactly our decimal syntax (its leniencies, `1.5`, `1e3`, `1_0`,
        # spaces, need a byte that is not plain). Any other file is read as text and cast
        # strictly, which costs about half as much again.
        width = len(self.columns_in_file)
        kind = "BIGINT" if self.plain else "VARCHAR"
        cols = ", ".join(f"'c{i}': '{kind}'" for i in range(width)) + f", 'c{width}': 'VARCHAR'"
        position = {c: i for i, c in enumerate(self.columns_in_file)}

        def value(column: str) -> str:
            field = f"c{position[column]}"
            if self.plain:
                return field
            return strict_bigint_sql(field, f"{self.relation}.{column}")

        select = ", ".join(f"{value(c)} AS {c}" for c in INPUT_RELATIONS[self.relation])
        quote = "'\"'" if quoted else "''"
        return (
            f"SELECT {select} FROM read_csv({self.duckdb_path(self.path)}, compression='none', "
            f"delim={sql_string(delimiter)}, header={str(header).lower()}, quote={quote}, "
            f"escape={quote}, auto_detect=false, strict_mode=true, null_padding=true, "
            f"nullstr='\x01', columns={{{cols}}}) "
            f"WHERE CASE WHEN c{width} IS NULL THEN TRUE "
            f"ELSE error('pagedkv: a line has too many fields') END"
        )

    def _arrow_csv_sql(self, con: duckdb.DuckDBPyConnection) -> str | None:
        """The file through pyarrow's streaming CSV reader (every field a string), cast
        strictly in SQL; None when pyarrow cannot even start on it."""
        import pyarrow.csv as pacsv

        delimiter, header, quoted = TEXT_FORMATS[self.format]
        names = [f"c{i}" for i in range(len(self.columns_in_file))]
        try:
            reader = pacsv.open_csv(
                str(self.path),
                read_options=pacsv.ReadOptions(
                    column_names=names, skip_rows=1 if header else 0, block_size=1 << 24
                ),
                parse_options=pacsv.ParseOptions(
                    delimiter=delimiter,
                    quote_char='"' if quoted else False,
                    double_quote=quoted,
                    ignore_empty_lines=True,
                ),
                convert_options=pacsv.ConvertOptions(
                    column_types=dict.fromkeys(names, pa.string()),
                    # no field is null: unquoted ones never are (pyarrow's default), nor these
                    quoted_strings_can_be_null=False,
                ),
            )
        except (OSError, pa.ArrowException):
            return None
        log.info("%s: CR line ends; reading it with pyarrow's CSV reader", self.label)
        name = f"_pagedkv_src_{next(source_serial)}"
        # a plain RecordBatchReader: older DuckDB releases do not scan pyarrow's CSV reader
        con.register(name, pa.RecordBatchReader.from_batches(reader.schema, reader))
        position = {c: i for i, c in enumerate(self.columns_in_file)}
        select = ", ".join(
            f"{strict_bigint_sql(f'c{position[c]}', f'{self.relation}.{c}')} AS {c}"
            for c in INPUT_RELATIONS[self.relation]
        )
        return f"SELECT {select} FROM {name}"

    def _fallback_sql(self, con: duckdb.DuckDBPyConnection) -> str:
        schema = arrow_schema(self.relation)
        order = [self.columns_in_file.index(c) for c in INPUT_RELATIONS[self.relation]]

        def batches() -> Any:
            rows: list[tuple[int, ...]] = []
            for _, row in self._scan():
                if not isinstance(row, tuple):
                    raise InputError(f"{self.label}: changed while it was being loaded")
                rows.append(tuple(row[i] for i in order))
                if len(rows) == 65536:
                    yield _batch(rows, schema)
                    rows = []
            yield _batch(rows, schema)

        name = f"_pagedkv_src_{next(source_serial)}"
        con.register(name, pa.RecordBatchReader.from_batches(schema, batches()))
        return f"SELECT * FROM {name}"

    def _scan(self) -> Any:
        delimiter, header, quoted = TEXT_FORMATS[self.format]
        return textscan.scan(self.path, self.label, self.columns_in_file, delimiter, header, quoted)

    def diagnose(self, con: duckdb.DuckDBPyConnection) -> tuple[int, list[Problem]]:
        total, problems = 0, list[Problem]()
        for _, p in self._scan():
            if isinstance(p, Problem):
                total += 1
                if len(problems) < MAX_PROBLEMS:
                    problems.append(p)
        if total or self.fallback:
            return total, problems
        if super().diagnose(con)[0]:
            # DuckDB's reader refuses what our grammar accepts: the retry reads it in Python
            log.warning("%s: the bulk reader refused it; reading it in Python (slow)", self.label)
            self.fallback = True
        return 0, []

    def locate(
        self, con: duckdb.DuckDBPyConnection, rows: set[tuple[int, ...]]
    ) -> dict[tuple[int, ...], list[str]]:
        order = [self.columns_in_file.index(c) for c in INPUT_RELATIONS[self.relation]]
        found: dict[tuple[int, ...], list[str]] = {}
        for line, row in self._scan():
            if isinstance(row, tuple):
                key = tuple(row[i] for i in order)
                if key in rows:
                    found.setdefault(key, []).append(f"{self.label}:{line}")
        return found


def _batch(rows: list[tuple[int, ...]], schema: pa.Schema) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    return pa.RecordBatch.from_arrays([pa.array(c, pa.int64()) for c in columns], schema=schema)
