"""Where facts come from: files of every supported format, stdin, and Arrow objects.
One module a format family (``text``, ``arrow``) on a common ``base``; this one finds
the sources of a load (``discover``) and opens each file with its family's reader.

A Source knows how to give DuckDB a SELECT of its relation's columns as strictly
validated BIGINTs (`scan_sql`), how to explain a refusal precisely (`diagnose`), and how
to find the rows a constraint refused (`locate`).
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

import pyarrow as pa

from .. import compression, paths
from ..datalog import looks_like_facts, read_facts
from ..errors import InputError, UsageError
from ..relations import INPUT_RELATIONS, check_relation, did_you_mean
from ..types import BINARY_NAMES, INPUT_FORMATS, binary_format
from .arrow import ArrowSource, DatalogRows, arrow_source, pq_read
from .base import MAX_PROBLEMS, Source, problem_from_duckdb, sql_string
from .text import (
    PLAIN_BYTES,
    TEXT_FORMATS,
    Preflight,
    TextSource,
    contains,
    only_plain_decimals,
    preflight,
)

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
FORMATS = INPUT_FORMATS


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
    device such as /dev/null, a /proc file that says it is empty), read once; gzip or
    zstd (told by the first bytes) decompressed into the copy."""
    try:
        st = path.stat()
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{label}: a directory where a fact file was expected")
        with path.open("rb") as f:
            packed = compression.sniff(f.peek(compression.HEAD)[: compression.HEAD])
            if packed is None and stat.S_ISREG(st.st_mode) and st.st_size > 0:
                return path, None
            stream = f if packed is None else compression.decompressing(f, packed, label)
            spool = _spool(stream, label)
            return spool.path, spool
    except OSError as e:
        raise _unreadable(label, e, path) from None


def _refuse_binary(path: Path, label: str, fmt: str) -> None:
    """A text format asked of a file that starts as Parquet or Arrow IPC is a usage error
    naming the format to pass, never hundreds of lines that are not UTF-8."""
    with path.open("rb") as f:
        found = binary_format(f.read(8))
    if found is not None:
        raise UsageError(
            f"{label}: this is {BINARY_NAMES[found]}, not {fmt} text; nothing was loaded",
            hint=f"pass -f {found}" + ("" if label == STDIN else f" (or name it .{found})"),
        )


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
        _refuse_binary(path, label, fmt)
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
                sources.extend(_stdin_source(stdin, fmt, relation))
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
        name = compression.strip(entry.name)[0]  # virtual_token.facts.gz: its facts
        ext = PurePath(name).suffix.lower()
        if ext not in EXTENSIONS:
            ignored.append(entry.name)
            continue
        label = str(entry)
        if EXTENSIONS[ext] == "dl":
            sources.extend(_datalog_sources(entry, label))
            continue
        stem = name[: -len(ext)]
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
            f"...; extensions {' '.join(e for e in EXTENSIONS if e != '.dl')}, each "
            "optionally .gz or .zst) or give .dl files",
        )
    return sources


def _argument_sources(
    path: Path, given: str, fmt: str | None, relation: str | None
) -> list[Source]:
    """The sources of one file named on the command line."""
    if not os.path.lexists(path):
        raise InputError(f"{given}: no such file or directory")
    name = compression.strip(path.name)[0]  # virtual_token.facts.gz: its facts
    ext = PurePath(name).suffix.lower()
    use = fmt or EXTENSIONS.get(ext)
    if use is None:
        raise UsageError(f"{given}: unknown extension '{ext}'; use --format ({', '.join(FORMATS)})")
    if use == "dl":
        return _datalog_sources(path, given)
    stem = name[: -len(ext)] if ext else name
    rel = relation or stem
    if rel not in INPUT_RELATIONS:
        raise InputError(
            f"{given}: '{rel}' is not a relation name{did_you_mean(rel)}",
            hint="name the file after its relation or pass --relation",
        )
    return [_file_source(path, given, use, rel)]


STDIN = "<stdin>"


def _stdin_source(stdin: Any, fmt: str | None, relation: str | None) -> list[Source]:
    """The sources of stdin: decompressed if gzip or zstd; Datalog facts (``-f dl``, or
    told by their first bytes without --relation) name their relations; Parquet and Arrow
    IPC need their -f, which is named when they come without one."""
    if stdin is None:
        raise UsageError("no standard input to read")
    stream: Any = compression.reader(stdin, STDIN)
    head = stream.peek(64)[:64]
    if fmt is None and relation is None and looks_like_facts(head):
        fmt = "dl"
    if fmt == "dl":
        if relation is not None:
            raise UsageError(
                "--relation does not apply to Datalog facts, which name their relations"
            )
        spool = _spool(stream, STDIN)
        try:
            return _datalog_sources(spool.path, STDIN)
        finally:
            spool.close()
    found = binary_format(head)
    if found is not None and fmt in (None, *TEXT_FORMATS):
        raise UsageError(
            f"{STDIN}: this is {BINARY_NAMES[found]}, not {fmt or 'facts'} text; nothing was "
            "loaded",
            hint=f"pass -f {found}" + (" and --relation NAME" if relation is None else ""),
        )
    if relation is None:
        raise UsageError(
            "reading stdin ('-') needs --relation NAME",
            hint="Datalog facts name their relations: pass -f dl for those",
        )
    fmt = fmt or "facts"
    if fmt in ("arrow", "arrows") and found != "arrow":  # a stream, read as it comes
        import pyarrow.ipc as ipc

        try:
            reader = ipc.open_stream(pa.PythonFile(stream, mode="r"))
        except (OSError, pa.ArrowException) as e:
            raise InputError(f"{STDIN}: not an Arrow IPC stream ({e})") from None
        return [arrow_source(relation, reader, STDIN)]
    spool = _spool(stream, STDIN)  # text is read more than once; Parquet and IPC files seek
    try:
        source = _open_file(spool.path, STDIN, fmt, relation)
    except BaseException:
        spool.close()
        raise
    source.spools.append(spool)
    return [source]


__all__ = [
    "EXTENSIONS",
    "FORMATS",
    "MAX_PROBLEMS",
    "PLAIN_BYTES",
    "TEXT_FORMATS",
    "ArrowSource",
    "DatalogRows",
    "Discovery",
    "Preflight",
    "Source",
    "TextSource",
    "arrow_source",
    "contains",
    "discover",
    "only_plain_decimals",
    "pq_read",
    "preflight",
    "problem_from_duckdb",
    "sql_string",
]
