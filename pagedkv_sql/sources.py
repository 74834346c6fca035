"""Where facts come from: files of every supported format, stdin, and Arrow objects.

A Source knows how to give DuckDB a SELECT of its relation's columns as strictly
validated BIGINTs (`scan_sql`), how to explain a refusal precisely (`diagnose`), and how
to find the rows a constraint refused (`locate`).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any, NamedTuple

import duckdb
import pyarrow as pa

from . import paths, textscan
from .datalog import read_facts
from .dbutil import run
from .errors import InputError, Problem, UsageError
from .numbers import strict_bigint_sql
from .relations import INPUT_RELATIONS, arrow_schema, check_relation, did_you_mean

# format -> (delimiter, has a header, quoted)
TEXT_FORMATS: dict[str, tuple[str, bool, bool]] = {
    "facts": ("\t", False, False),
    "tsv": ("\t", True, False),
    "csv": (",", True, True),
}
EXTENSIONS = {
    ".facts": "facts",
    ".tsv": "tsv",
    ".csv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".feather": "arrow",
    ".arrows": "arrows",
    ".dl": "dl",
}
FORMATS = ("facts", "tsv", "csv", "parquet", "arrow", "arrows", "dl")
MAX_PROBLEMS = 1000  # problems kept per load; the total is still counted
_names = count()
log = logging.getLogger(__name__)
_PAGEDKV_ERROR = re.compile(r"pagedkv: (.*)")


def sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


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
            run(con, "ROLLBACK")
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
        missing = [c for c in columns if c not in found]
        unknown = [c for c in found if c not in columns]
        dupes = sorted({c for c in found if found.count(c) > 1})
        if missing or unknown or dupes:
            parts = []
            if missing:
                parts.append(f"missing column(s) {', '.join(missing)}")
            if unknown:
                parts.append(f"unknown column(s) {', '.join(repr(c) for c in unknown)}")
            if dupes:
                parts.append(f"repeated column(s) {', '.join(dupes)}")
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
        name = f"_pagedkv_src_{next(_names)}"
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

        name = f"_pagedkv_src_{next(_names)}"
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


@dataclass
class ArrowSource(Source):
    """Anything DuckDB scans as Arrow (Table, RecordBatchReader, PyCapsule stream, Dataset)
    or a Parquet file. Integer columns of any width are cast to BIGINT when they fit."""

    data: Any = None
    parquet: Path | None = None
    schema: pa.Schema = field(default_factory=pa.schema)
    name: str = ""

    def __post_init__(self) -> None:
        self.name = f"_pagedkv_src_{next(_names)}"
        columns = INPUT_RELATIONS[self.relation]
        names = list(self.schema.names)
        missing = [c for c in columns if c not in names]
        unknown = [c for c in names if c not in columns]
        dupes = sorted({c for c in names if names.count(c) > 1})
        problems = []
        if missing:
            problems.append(f"missing column(s) {', '.join(missing)}")
        if unknown:
            problems.append(f"unknown column(s) {', '.join(repr(c) for c in unknown)}")
        if dupes:
            problems.append(f"repeated column(s) {', '.join(dupes)}")
            raise InputError(
                f"{self.label}: {self.relation}: {'; '.join(problems)}",
                hint=f"give each of the columns {', '.join(columns)} once",
            )
        for f in self.schema:
            if f.name in columns and not pa.types.is_integer(f.type):
                kind = "null (every value is missing)" if pa.types.is_null(f.type) else f.type
                problems.append(f"column {f.name} has type {kind}, not an integer type")
        if problems:
            raise InputError(
                f"{self.label}: {self.relation}: {'; '.join(problems)}",
                hint=f"give integer columns named {', '.join(columns)} "
                "(any width; values must fit in a signed 64-bit integer)",
            )

    def _column_sql(self, column: str) -> str:
        typ = self.schema.field(column).type
        c = f'"{column}"'
        where = f"column {column}"
        checks = f"WHEN {c} IS NULL THEN error('pagedkv: {where} holds a null') "
        if typ in (pa.uint64(),):
            checks += (
                f"WHEN {c} > 9223372036854775807 THEN error('pagedkv: {where} holds ' || "
                f"{c} || ', beyond the signed 64-bit range') "
            )
        return f"CASE {checks}ELSE CAST({c} AS BIGINT) END AS {column}"

    def scan_sql(self, con: duckdb.DuckDBPyConnection) -> str:
        if self.parquet is not None:
            table = f"read_parquet({self.duckdb_path(self.parquet)})"
        else:
            con.register(self.name, self.data)
            table = self.name
        select = ", ".join(self._column_sql(c) for c in INPUT_RELATIONS[self.relation])
        return f"SELECT {select} FROM {table}"

    def locate(
        self, con: duckdb.DuckDBPyConnection, rows: set[tuple[int, ...]]
    ) -> dict[tuple[int, ...], list[str]]:
        if self.parquet is None and not isinstance(self.data, pa.Table):
            return {}
        table = pq_read(self.parquet) if self.parquet is not None else self.data
        columns = INPUT_RELATIONS[self.relation]
        arrays = [table.column(c).cast(pa.int64()).to_pylist() for c in columns]
        found: dict[tuple[int, ...], list[str]] = {}
        for i, key in enumerate(zip(*arrays, strict=True)):
            if key in rows:
                found.setdefault(key, []).append(f"{self.label} row {i + 1}")
        return found

    def close(self) -> None:
        self.data = None
        super().close()


def _batch(rows: list[tuple[int, ...]], schema: pa.Schema) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    return pa.RecordBatch.from_arrays([pa.array(c, pa.int64()) for c in columns], schema=schema)


def pq_read(path: Path) -> pa.Table:
    import pyarrow.parquet as pq

    return pq.read_table(path)


@dataclass
class DatalogRows(Source):
    """The facts of one relation from a .dl file, already parsed (with their lines)."""

    rows: list[tuple[int, ...]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    inner: ArrowSource | None = None

    def __post_init__(self) -> None:
        columns = INPUT_RELATIONS[self.relation]
        table = pa.Table.from_arrays(
            [pa.array([r[i] for r in self.rows], pa.int64()) for i in range(len(columns))],
            schema=arrow_schema(self.relation),
        )
        self.inner = ArrowSource(self.relation, self.label, data=table, schema=table.schema)

    def scan_sql(self, con: duckdb.DuckDBPyConnection) -> str:
        assert self.inner is not None
        return self.inner.scan_sql(con)

    def locate(
        self, con: duckdb.DuckDBPyConnection, rows: set[tuple[int, ...]]
    ) -> dict[tuple[int, ...], list[str]]:
        found: dict[tuple[int, ...], list[str]] = {}
        for row, line in zip(self.rows, self.lines, strict=True):
            if row in rows:
                found.setdefault(row, []).append(f"{self.label}:{line}")
        return found


def arrow_source(relation: str, data: Any, label: str) -> ArrowSource:
    """An ArrowSource for any Arrow-shaped Python object, scanned without copying."""
    reusable = True
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        schema = data.schema
    elif isinstance(data, pa.RecordBatchReader):
        schema, reusable = data.schema, False
    elif hasattr(data, "schema") and hasattr(data, "to_batches") and hasattr(data, "scanner"):
        schema = data.schema  # a pyarrow.dataset.Dataset: DuckDB scans it lazily
    elif hasattr(data, "__arrow_c_stream__"):
        data = pa.RecordBatchReader.from_stream(data)
        schema, reusable = data.schema, False
    else:
        raise UsageError(
            f"cannot load a {type(data).__name__} as {relation}: give a pyarrow Table, "
            "RecordBatch, RecordBatchReader, Dataset or an object with __arrow_c_stream__"
        )
    return ArrowSource(relation, label, reusable=reusable, data=data, schema=schema)


def _unreadable(label: str, error: OSError, path: Path | None = None) -> InputError:
    if isinstance(error, FileNotFoundError) and path is not None and os.path.lexists(path):
        return InputError(f"{label}: a broken symbolic link (to {os.readlink(path)})")
    if isinstance(error, FileNotFoundError):
        return InputError(f"{label}: no such file or directory")
    hint = ""
    if isinstance(error, PermissionError):
        hint = "make it (and the directories above it) readable by this user"
    return InputError(f"{label}: cannot read it: {error.strerror or error}", hint=hint)


def _spool(stream: Any, label: str) -> paths.Spool:
    """Copy a stream to a temporary file that DuckDB and the Python reader can both read,
    as often as they need; gone when the source closes."""
    try:
        return paths.Spool(stream)
    except OSError as e:
        raise InputError(
            f"{label}: cannot copy it to a temporary file in {tempfile.gettempdir()}: "
            f"{e.strerror or e}",
            hint="free some space there, or set TMPDIR to a roomier directory",
        ) from None


def _readable(path: Path, label: str) -> tuple[Path, paths.Spool | None]:
    """The file to read for ``path``, and the spool that holds it if any: the file itself
    when it is a regular file that reports its size, else a copy of its bytes (a FIFO, a
    device such as /dev/null, a /proc file that says it is empty), read once."""
    try:
        st = path.stat()
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{label}: a directory where a fact file was expected")
        with path.open("rb") as f:
            if stat.S_ISREG(st.st_mode) and st.st_size > 0:
                return path, None
            spool = _spool(f, label)
            return spool.path, spool
    except OSError as e:
        raise _unreadable(label, e, path) from None


def _file_source(path: Path, label: str, fmt: str, relation: str) -> Source:
    path, spool = _readable(path, label)
    try:
        source = _open_file(path, label, fmt, relation)
    except BaseException:
        if spool is not None:
            spool.close()
        raise
    if spool is not None:
        source.spools.append(spool)
    return source


def _open_file(path: Path, label: str, fmt: str, relation: str) -> Source:
    if fmt in TEXT_FORMATS:
        return TextSource(relation, label, path=path, format=fmt)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(path)
        except (OSError, pa.ArrowException) as e:
            raise InputError(f"{label}: not a readable Parquet file ({e})") from None
        return ArrowSource(relation, label, parquet=path, schema=schema)
    if fmt in ("arrow", "arrows"):
        import pyarrow.ipc as ipc

        try:
            # an IPC file starts with its magic; anything else is read as a stream, so
            # .arrow, .feather and .arrows each take both (what `resolve` writes too)
            with path.open("rb") as f:
                is_file = f.read(6) == b"ARROW1"
            source = pa.memory_map(str(path))
            reader: Any = ipc.open_file(source) if is_file else ipc.open_stream(source)
            table = reader.read_all()
        except (OSError, pa.ArrowException) as e:
            raise InputError(f"{label}: not a readable Arrow IPC file or stream ({e})") from None
        return ArrowSource(relation, label, data=table, schema=table.schema)
    raise UsageError(f"unknown format '{fmt}'")


def _datalog_sources(path: Path, label: str) -> list[Source]:
    path, spool = _readable(path, label)
    try:
        facts = read_facts(path, label)
    finally:
        if spool is not None:
            spool.close()
    if facts.problems:
        raise InputError(
            f"{label}: {facts.problem_count} malformed fact(s)",
            facts.problems[:MAX_PROBLEMS],
            total=facts.problem_count,
            hint="facts look like 'root_table(1, 100).' with integer literals",
        )
    return [
        DatalogRows(rel, label, rows=facts.rows[rel], lines=facts.lines[rel])
        for rel in INPUT_RELATIONS
        if rel in facts.rows
    ]


@dataclass
class Discovery:
    sources: list[Source]
    complete: bool  # a directory was given: the report lists every relation
    dirs: list[str]


def discover(
    paths: Iterable[str],
    fmt: str | None = None,
    relation: str | None = None,
    stdin: Any = None,
) -> Discovery:
    """Turn command-line SOURCE arguments into sources, refusing ambiguity up front."""
    if fmt is not None and fmt not in FORMATS:
        raise UsageError(f"unknown format '{fmt}'; formats are: {', '.join(FORMATS)}")
    if relation is not None:
        check_relation(relation)
    sources: list[Source] = []
    dirs: list[str] = []
    given_paths = list(paths)
    if not given_paths:
        raise UsageError("no SOURCE given; name a directory, fact files, or - for stdin")
    try:
        for given in given_paths:
            if given == "-":
                sources.append(_stdin_source(stdin, fmt or "facts", relation))
            elif os.path.isdir(given):
                if relation is not None:
                    raise UsageError("--relation names the relation of one file, not a directory")
                dirs.append(given)
                sources.extend(_directory_sources(Path(given), fmt))
            else:
                sources.extend(_argument_sources(Path(given), given, fmt, relation))
        seen: dict[str, str] = {}
        for s in sources:
            if s.relation in seen:
                raise InputError(
                    f"two sources for {s.relation} in one load: {seen[s.relation]} and {s.label}",
                    hint="load one of them, or add the second with a separate `load --append`",
                )
            seen[s.relation] = s.label
    except BaseException:
        for s in sources:
            s.close()
        raise
    return Discovery(sources, bool(dirs), dirs)


def _directory_sources(directory: Path, fmt: str | None) -> list[Source]:
    """The sources of a directory: a file a relation named after it, and .dl files. A
    directory that yields none is an error, never an empty load."""
    try:
        entries = sorted(directory.iterdir())
    except OSError as e:
        raise _unreadable(str(directory), e) from None
    sources: list[Source] = []
    ignored: list[str] = []
    for entry in entries:
        ext = entry.suffix.lower()
        if ext not in EXTENSIONS:
            ignored.append(entry.name)
            continue
        label = str(entry)
        if EXTENSIONS[ext] == "dl":
            sources.extend(_datalog_sources(entry, label))
            continue
        stem = entry.name[: -len(ext)]
        if stem not in INPUT_RELATIONS:
            raise InputError(
                f"{label}: '{stem}' is not a relation name{did_you_mean(stem)}",
                hint="name each file after its relation, e.g. root_table.facts",
            )
        sources.append(_file_source(entry, label, fmt or EXTENSIONS[ext], stem))
    if not sources:
        found = f" (found only: {', '.join(ignored[:5])}{', ...' if len(ignored) > 5 else ''})"
        raise InputError(
            f"{directory}: no facts in this directory{found if ignored else ''}; "
            "nothing was loaded",
            hint="name each file after its relation (root_table.facts, block_table_entry.csv, "
            f"...; extensions {' '.join(e for e in EXTENSIONS if e != '.dl')}) or give .dl files",
        )
    return sources


def _argument_sources(
    path: Path, given: str, fmt: str | None, relation: str | None
) -> list[Source]:
    """The sources of one file named on the command line."""
    if not os.path.lexists(path):
        raise InputError(f"{given}: no such file or directory")
    ext = path.suffix.lower()
    use = fmt or EXTENSIONS.get(ext)
    if use is None:
        raise UsageError(f"{given}: unknown extension '{ext}'; use --format ({', '.join(FORMATS)})")
    if use == "dl":
        return _datalog_sources(path, given)
    stem = path.name[: -len(ext)] if ext else path.name
    rel = relation or stem
    if rel not in INPUT_RELATIONS:
        raise InputError(
            f"{given}: '{rel}' is not a relation name{did_you_mean(rel)}",
            hint="name the file after its relation or pass --relation",
        )
    return [_file_source(path, given, use, rel)]


def _stdin_source(stdin: Any, fmt: str, relation: str | None) -> Source:
    if relation is None:
        raise UsageError("reading stdin ('-') needs --relation NAME")
    if stdin is None:
        raise UsageError("no standard input to read")
    if fmt in TEXT_FORMATS:
        spool = _spool(stdin, "<stdin>")
        try:
            source = TextSource(relation, "<stdin>", path=spool.path, format=fmt)
        except BaseException:
            spool.close()
            raise
        source.spools.append(spool)
        return source
    if fmt in ("arrow", "arrows"):
        import pyarrow.ipc as ipc

        try:
            reader = ipc.open_stream(pa.PythonFile(stdin, mode="r"))
        except (OSError, pa.ArrowException) as e:
            raise InputError(f"<stdin>: not an Arrow IPC stream ({e})") from None
        return arrow_source(relation, reader, "<stdin>")
    raise UsageError(f"--format {fmt} cannot be read from stdin; use facts, tsv, csv or arrow")
