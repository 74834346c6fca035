"""The step log (docs/replay.md): read JSON Lines steps, or the flat event table from
Parquet / Arrow, into one Arrow table of block-level events, keeping each request's block
table only as far as it needs to number block indices and to expand request-level
operations (free, fork, swap) into block-level events. It never judges the engine: what an
engine did wrong (a block handed out twice, a double free) passes through as events for
the invariant queries of ``sql/replay.sql``. Refused whole: a log that cannot be read
(each offending line named), and one whose KV-cache groups replay cannot check yet.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from .. import compression, progress
from ..arguments import argument
from ..errors import InputError
from ..limits import MAX_POOL_TOKENS, LineTooLong, bounded_lines
from ..numbers import INT64_MAX
from ..types import binary_format
from .builder import Builder, Request
from .header import (
    EVENT_DEFAULTS,
    EVENT_OPS,
    EVENT_SCHEMA,
    EVENT_SUFFIXES,
    FORMAT_VERSION,
    HEADER_KEY,
    MAX_PROBLEMS,
    STEP_KEYS,
    STEP_OPS,
    Header,
    LogLineError,
    as_object,
    events_format,
    header_from,
    replayable,
    write_events,
)
from .jsonl import parse_line, read_jsonl
from .marks import Mark, mark_of, with_mark

# -- reading files ---------------------------------------------------------------------------
LOG_TYPES = "a path, a binary stream, an event table or a list of steps"


def kind_of(head: bytes) -> str:
    """What the first bytes of a log say it is: parquet, arrow (IPC file), arrows (IPC
    stream), compressed (gzip, zstd: any of those inside) or jsonl. Logs are read by their
    content, never by their name."""
    binary = binary_format(head)
    if binary is not None:
        return binary
    return "compressed" if compression.sniff(head) else "jsonl"


def file_kind(path: str | os.PathLike[str]) -> str | None:
    """The kind (``kind_of``) of a regular file's content; None for anything else."""
    try:
        with open(path, "rb") as f:
            return kind_of(f.read(8)) if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else None
    except OSError:
        return None


def read_log(path: Any) -> pa.Table:
    """A step log as the event table, from JSON Lines, Parquet or Arrow IPC (file or
    stream), told apart by their first bytes; a path, ``-`` (stdin), a FIFO, a binary
    stream or a list of steps (dicts or JSON lines). Header values in the schema
    metadata."""
    if isinstance(path, list | tuple):
        return read_jsonl(path, "<steps>")
    if not isinstance(path, str | os.PathLike):
        if isinstance(path, bytes | bytearray) or not hasattr(path, "read"):
            argument(path, "log", (str, os.PathLike), LOG_TYPES)
        return _read_stream(path, "<stream>")
    p = Path(path)
    if str(path) == "-":
        import sys

        return _read_stream(sys.stdin.buffer, "<stdin>")
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise InputError(
            f"no step log at {p}", hint="give a .jsonl, .parquet or .arrow file"
        ) from None
    except OSError as e:
        raise InputError(f"{p}: cannot read it: {e.strerror or e}") from None
    if stat.S_ISDIR(mode):
        raise InputError(
            f"{p} is a directory, not a step log", hint="give a .jsonl, .parquet or .arrow file"
        )
    try:
        with p.open("rb") as f:
            if not stat.S_ISREG(mode):  # a FIFO, a process substitution, a device
                return _read_stream(f, str(p))
            kind = kind_of(f.read(8))
    except OSError as e:
        raise InputError(f"{p}: cannot read it: {e.strerror or e}") from None
    if kind == "compressed":
        try:
            with compression.open_input(p) as f:
                return _read_stream(f, str(p))
        except OSError as e:
            raise InputError(f"{p}: cannot read it: {e.strerror or e}") from None
    if kind != "jsonl":
        return read_events(p)
    with p.open("rb") as f:
        return _read_lines(f, str(p))


def _read_lines(stream: Any, source: str) -> pa.Table:
    """A JSON Lines log from a binary stream, no line longer than MAX_LINE_BYTES; the lines
    read so far, and their share of a plain file, on the command's progress line."""
    try:
        with progress.metering("lines", progress.file_size(stream)) as meter:
            return read_jsonl(progress.counted(bounded_lines(stream), meter), source)
    except LineTooLong as e:
        raise InputError(
            f"{source}:{e.number}: a line longer than {e.limit:,} bytes; nothing was loaded",
            hint="a step log has one step a line (is this a step log?)",
        ) from None


def _read_stream(stream: Any, source: str) -> pa.Table:
    """A log from a stream that cannot seek (decompressed, if it is): its first bytes
    peeked to tell its kind."""
    import io

    buffered: Any = compression.reader(stream, source)
    kind = kind_of(buffered.peek(8)[:8])
    if kind == "jsonl":
        return _read_lines(buffered, source)
    data: Any = buffered if kind == "arrows" else io.BytesIO(buffered.read())
    return _events_from(data, kind, source)


def read_events(path: Path) -> pa.Table:
    """The flat event table from Parquet or Arrow IPC, by the file's first bytes."""
    try:
        with path.open("rb") as f:
            kind = kind_of(f.read(8))
            f.seek(0)
            return _events_from(f, "arrows" if kind == "jsonl" else kind, str(path))
    except OSError as e:
        raise InputError(f"{path}: not a readable event table: {e}") from None


def _events_from(f: Any, kind: str, source: str) -> pa.Table:
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(f)
        else:
            import pyarrow.ipc as ipc

            table = (ipc.open_file(f) if kind == "arrow" else ipc.open_stream(f)).read_all()
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{source}: not a readable event table: {e}") from None
    return conform(table, source)


def conform(table: pa.Table, source: str) -> pa.Table:
    """Cast a flat event table to EVENT_SCHEMA, naming missing or mistyped columns."""
    return conformed(table, source)[0]


def conformed(table: pa.Table, source: str) -> tuple[pa.Table, Header, Mark | None]:
    """``conform``'s table, with the header and the recorder's mark its schema metadata
    carries, each read once (what ``parquet_events`` keeps of them)."""
    meta_header = _meta_header(table, source)
    for name, default in EVENT_DEFAULTS.items():  # a table written before the column
        if name not in table.column_names:
            if name == "group_id" and len(meta_header.groups) > 1:
                raise InputError(
                    f"{source}: the event table has no group_id column, but its header names "
                    f"{len(meta_header.groups)} KV-cache groups: no event's group can be known "
                    "(nothing was loaded)",
                    hint="write the table again with its group_id column (replay LOG "
                    "--events FILE writes one)",
                )
            table = table.append_column(name, pa.array([default] * table.num_rows, pa.int64()))
    missing = [n for n in EVENT_SCHEMA.names if n not in table.column_names]
    extra = [n for n in table.column_names if n not in EVENT_SCHEMA.names]
    if missing or extra:
        raise InputError(
            f"{source}: not a step-log event table"
            + (f"; missing column(s) {', '.join(missing)}" if missing else "")
            + (f"; unknown column(s) {', '.join(extra)}" if extra else ""),
            hint="the columns: 'The event table' in https://github.com/pagedkv-sql/pagedkv-sql/blob/main/docs/replay.md",
        )
    columns = []
    for f in EVENT_SCHEMA:
        col = table.column(f.name)
        if col.type != f.type:
            ok = (
                pa.types.is_integer(col.type)
                if f.type == pa.int64()
                else (
                    pa.types.is_string(col.type)
                    or pa.types.is_large_string(col.type)
                    or pa.types.is_dictionary(col.type)
                )
            )
            if not ok and not pa.types.is_null(col.type):
                raise InputError(f"{source}: column {f.name} is {col.type}, not {f.type}")
            col = col.cast(f.type)
        columns.append(col)
    meta = table.schema.metadata or {}
    checked = pa.Table.from_arrays(columns, schema=EVENT_SCHEMA)
    _no_nulls(checked, source)
    _tokens_fit(_widest(checked, source), meta_header, source)
    _addressable(_highest_block(checked), meta_header, source)
    checked = checked.replace_schema_metadata({HEADER_KEY: meta_header.to_json()})
    mark = mark_of(meta, source)
    return with_mark(checked, mark), meta_header, mark


def _meta_header(table: pa.Table, source: str) -> Header:
    """The header in an event table's schema metadata (none: a log without groups)."""
    header = (table.schema.metadata or {}).get(HEADER_KEY.encode())
    if header is None:
        return Header()
    try:
        text = header.decode("utf-8") if isinstance(header, bytes) else header
        obj = parse_line(text)
        meta_header = header_from(as_object(obj, "the header"))
        replayable(meta_header, f"{source} (the header in its schema metadata)")
    except (LogLineError, UnicodeDecodeError) as e:
        raise InputError(f"{source}: bad step-log header in the schema metadata: {e}") from None
    return meta_header


def _no_nulls(table: pa.Table, source: str, offset: int = 0) -> None:
    """Every event has its number, step, op and group: a null in one is refused naming the
    row (a NULL op replayed as nothing at all)."""
    for name in ("event", "step", "op", "group_id"):
        if name not in table.column_names:
            continue
        column = table.column(name)
        if column.null_count:
            row = offset + pc.index(pc.is_null(column), True).as_py()
            raise InputError(
                f"{source}: event table row {row} has a null '{name}'; every event has an "
                "event number, a step, an op and a KV-cache group (nothing was loaded)",
                hint="the columns: 'The event table' in https://github.com/pagedkv-sql/pagedkv-sql/blob/main/docs/replay.md",
            )


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _tokens_fit(widest: int | None, header: Header, source: str) -> None:
    """No event appends more tokens at once than a pool holds (Builder.bound_tokens for
    JSON Lines): ``widest`` is the table's largest token_to - token_from."""
    blocks = header.num_gpu_blocks
    limit = min(blocks * header.block_size, MAX_POOL_TOKENS) if blocks else MAX_POOL_TOKENS
    if widest is not None and widest > limit:
        why = f"the pool's {blocks:,} blocks x {header.block_size} tokens" if blocks else ""
        raise InputError(
            f"{source}: an event appends {widest:,} tokens at once, more than {limit:,} "
            f"({why or 'what a real engine pool holds'}); nothing was loaded",
            hint="a request holds at most what the pool holds (num_gpu_blocks x block_size)",
        )


# the ops that give a request a GPU block, so that it needs an address (Builder.acquire)
_ACQUIRE = pa.array(["allocate", "share", "swap_in"])


def _highest_block(table: pa.Table) -> int | None:
    """The highest block id an event of ``table`` gives a request."""
    ops = table.column("op").cast(pa.string())  # a Parquet column may be a dictionary
    ids = pc.filter(table.column("block_id"), pc.is_in(ops, _ACQUIRE))
    top = pc.max(ids).as_py()
    return None if top is None else int(top)


def _addressable(block: int | None, header: Header, source: str) -> None:
    """The highest block an event table hands out has a 64-bit address (as
    Builder.addressable holds each JSON line to): else the table is refused naming the
    block, not by --at's "Overflow in multiplication" after a clean replay."""
    if block is not None and header.base(block) > INT64_MAX:
        raise InputError(
            f"{source}: block {block} has no address: gpu_base {header.gpu_base} + {block} x "
            f"block_bytes {header.block_bytes} passes 2^63 - 1; nothing was loaded",
            hint="block ids index the pool: 0 .. num_gpu_blocks - 1",
        )


# a token position of an event table: 0 .. 2^62, so that the SQL's arithmetic on one (plus
# a block size, minus a window) stays in int64
MAX_TOKEN_POSITION = 1 << 62


def _widest(table: pa.Table, source: str, offset: int = 0) -> int | None:
    """The largest token_to - token_from of ``table``, each position first held to 0 ..
    MAX_TOKEN_POSITION (a row past it refused, naming it), so that nothing overflows."""
    for name in ("token_from", "token_to"):
        column = table.column(name)
        bad = pc.or_(pc.less(column, 0), pc.greater(column, MAX_TOKEN_POSITION))
        if pc.any(bad).as_py():
            row = pc.index(bad, True).as_py()
            raise InputError(
                f"{source}: event table row {offset + row}: {name} {column[row].as_py()} is out "
                "of range (a token position is 0 .. 2^62); nothing was loaded",
                hint="the columns: 'The event table' in https://github.com/pagedkv-sql/pagedkv-sql/blob/main/docs/replay.md",
            )
    width = pc.subtract(table.column("token_to"), pc.coalesce(table.column("token_from"), 0))
    top = pc.max(width).as_py()
    return None if top is None else int(top)


@dataclass(frozen=True)
class ParquetEvents:
    """An event table in a Parquet file, scanned by DuckDB in place (no copy through Arrow);
    its schema and header were checked by ``parquet_events``."""

    path: str
    header: Header
    mark: Mark | None = None


_GLOB = set("[]*?{}")


def parquet_events(path: Path) -> ParquetEvents | None:
    """The Parquet file as ParquetEvents, or None when DuckDB cannot read it by name (a
    path DuckDB would glob-expand): then pyarrow reads it."""
    if _GLOB & set(str(path)):
        return None
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise InputError(f"{path}: not a readable event table: {e}") from None
    empty = pa.Table.from_batches([], schema=schema).replace_schema_metadata(schema.metadata)
    _, header, mark = conformed(empty, str(path))  # the schema and metadata checked
    # the checks conform makes of the rows, batch by batch over the columns they need
    offset, widest, highest = 0, None, None
    names = ["event", "step", "op", "block_id", "token_from", "token_to"]
    names += ["group_id"] if "group_id" in schema.names else []
    for batch in pq.ParquetFile(path).iter_batches(columns=names):
        rows = pa.Table.from_batches([batch])
        _no_nulls(rows, str(path), offset)
        widest = _max(widest, _widest(rows, str(path), offset))
        offset += rows.num_rows
        highest = _max(highest, _highest_block(rows))
    _tokens_fit(widest, header, str(path))
    _addressable(highest, header, str(path))
    return ParquetEvents(str(path), header, mark)


def header_of(table: pa.Table) -> Header:
    meta = (table.schema.metadata or {}).get(HEADER_KEY.encode())
    return header_from(as_object(parse_line(meta.decode()), "the header")) if meta else Header()


LogSource: TypeAlias = "str | os.PathLike[str] | IO[bytes] | pa.Table"


def event_source(log: LogSource) -> tuple[pa.Table | ParquetEvents, bool]:
    """The event table of a log (a path, a stream or an event table), and whether it still
    needs validating (read from an event table rather than made by the JSON Lines reader).
    A Parquet file (told by its first bytes, not its name) is left for DuckDB to scan."""
    if isinstance(log, pa.Table):
        return conform(log, "<arrow events>"), True
    kind = file_kind(log) if isinstance(log, str | os.PathLike) and os.fspath(log) != "-" else None
    if kind == "parquet":
        found = parquet_events(Path(log))  # type: ignore[arg-type]
        if found is not None:
            return found, True
    table = read_log(log)
    return table, kind not in ("jsonl", None) or not isinstance(log, str | os.PathLike)


__all__ = [
    "EVENT_OPS",
    "EVENT_SCHEMA",
    "EVENT_SUFFIXES",
    "FORMAT_VERSION",
    "HEADER_KEY",
    "MAX_PROBLEMS",
    "STEP_KEYS",
    "STEP_OPS",
    "Builder",
    "Header",
    "LogLineError",
    "LogSource",
    "ParquetEvents",
    "Request",
    "conform",
    "event_source",
    "events_format",
    "file_kind",
    "header_from",
    "header_of",
    "kind_of",
    "parquet_events",
    "parse_line",
    "read_events",
    "read_jsonl",
    "read_log",
    "write_events",
]
