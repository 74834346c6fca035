"""The library's front door: a Database over one DuckDB file (or ``:memory:``)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, BinaryIO

import duckdb
import pyarrow as pa

from . import connection, dbutil, inspect, kv_groups, paths, readers, schema, spill, stream
from .check import CheckReport, all_checks, discovered_checks, label_stream, run_checks
from .connection import first_line
from .dbutil import run
from .delegations import Delegations
from .errors import DatabaseError, UsageError
from .inspect import Explanation, Stats
from .load import LoadReport, load_sources
from .paths import DEFAULT_DB, ENV_DB
from .relations import (
    INPUT_RELATIONS,
    OUTPUT_RELATION,
    OUTPUT_SCHEMA,
    arrow_schema,
    check_relation,
)
from .sources import arrow_source, discover
from .sqlfiles import statement
from .types import ArrowInput, InputFormat

BATCH_SIZE = 1 << 20
# progress tracked for the CLI's bar (``progress()``), never printed by DuckDB itself
PROGRESS_SETTINGS = "SET enable_progress_bar = true; SET enable_progress_bar_print = false"
log = logging.getLogger("pagedkv_sql")


def default_path() -> str:
    """The CLI's database: ``$PAGEDKV_DB``, else ``pagedkv.duckdb`` in the working
    directory. The library never falls back to it: ``connect()`` means ``:memory:``."""
    return os.environ.get(ENV_DB) or DEFAULT_DB


def connect(
    database: str | os.PathLike[str] | duckdb.DuckDBPyConnection = ":memory:",
    *,
    read_only: bool = False,
    must_exist: bool = False,
    config: Mapping[str, Any] | None = None,
) -> Database:
    """Open a pagedkv database, as ``duckdb.connect`` opens a DuckDB one.

    ``database`` is a file path (created with the schema unless ``read_only``),
    ``":memory:"`` (the default, as in DuckDB), or an open ``duckdb.DuckDBPyConnection`` to
    use as it is (it is not closed with the Database). ``config`` is DuckDB's (``threads``,
    ``memory_limit``...). ``read_only`` refuses ``:memory:``, which cannot be read-only;
    ``must_exist`` refuses a file that is not there instead of creating it. Unless
    ``config`` names a ``temp_directory``, DuckDB spills to a directory of this open's own
    beside the file (for ``:memory:``, in the system's temp directory), removed on close.

    The Database may be used from several threads: every call runs on its own cursor."""
    return Database(database, read_only=read_only, must_exist=must_exist, config=config)


_WRITERS: dict[str, threading.RLock] = {}  # a file's real path -> its writers' lock
_WRITERS_LOCK = threading.Lock()


def _writer_lock(database: object) -> threading.RLock:
    """The lock a write through this Database holds: one per file in the process (its
    opens share one DuckDB instance, whose transactions conflict), else one of its own."""
    if (
        isinstance(database, str | os.PathLike)
        and str(database)
        and not str(database).startswith(":memory:")
    ):
        key = os.path.realpath(database)
        with _WRITERS_LOCK:
            return _WRITERS.setdefault(key, threading.RLock())
    return threading.RLock()


class Database(Delegations):
    """A pagedkv database: the spec's relations in DuckDB, loaded, checked and resolved.

    A thin facade over the core modules. Each call takes its own DuckDB cursor
    (DuckDB's rule for threads; ``cursor()``), so one Database can serve several threads;
    ``con`` is the DuckDB connection itself, for direct use from one thread (never from a
    pagedkv_sql module other than this one). The capabilities (``engines``, ``replay``,
    ``report``, ``spark``) are functions taking a Database; the methods of theirs here
    (``load_engine``, ``replay``...) are one-line delegations to those functions
    (inherited from delegations.py), and a new capability adds none. Errors are
    :class:`PagedKVError` subclasses; a DuckDB error behind one is its ``__cause__``."""

    def __init__(
        self,
        database: str | os.PathLike[str] | duckdb.DuckDBPyConnection = ":memory:",
        *,
        read_only: bool = False,
        must_exist: bool = False,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self._owned = not isinstance(database, duckdb.DuckDBPyConnection)
        self._busy: list[duckdb.DuckDBPyConnection] = []
        # one writer at a time (docs/decisions.md): DuckDB refuses two
        # transactions writing the same tables at once ("write-write conflict")
        self._writer = _writer_lock(database)
        # the streams handed out and not read to the end: close() ends them (an unfinished
        # DuckDB result keeps the database open after con.close(), and a later open of the
        # same file in this process waits for it on DuckDB 1.5.0)
        self._streams: dict[object, tuple[weakref.ref[Any], ...]] = {}
        self._stage: tuple[str, float, bool] | None = None  # of the load running now
        # this open made the file: a caller whose command then fails may remove it again
        self.created = False
        self._spill: str | None = None  # the temp directory of this open (spill.py)
        if isinstance(database, duckdb.DuckDBPyConnection):
            if config:
                raise UsageError(
                    "config applies when pagedkv opens the database, not to a connection"
                )
            self.con = database
            self.path = connection.connection_path(database)
            read_only = read_only or connection.connection_read_only(database)
        else:
            if database is None:
                raise UsageError("no database given: pass a file path or ':memory:'")
            if not isinstance(database, str | os.PathLike):  # connect(123) made a file "123"
                raise UsageError(
                    f"a database is a file path, ':memory:' or a DuckDB connection, "
                    f"not {type(database).__name__} {database!r}"
                )
            self.path = str(database)
            self.con, self.created, self._spill = connection.open_path(
                self.path, read_only=read_only, must_exist=must_exist, config=config
            )
        self.read_only = read_only
        try:
            # progress is tracked for the CLI's bar, never printed by DuckDB itself
            run(self.con, PROGRESS_SETTINGS)
            if read_only:
                schema.check(self)
            else:
                schema.create(self)
        except BaseException as e:
            self.close()
            if self.created:
                paths.remove_new_database(self.path)
            cause = e.__cause__ if isinstance(e, DatabaseError) else e
            if isinstance(cause, duckdb.Error):  # a full disk, a read-only directory...
                raise paths.database_io_error(self.path, cause, "set up") from cause
            raise

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection (one passed to ``connect`` is left open)."""
        for refs in list(self._streams.values()):
            for ref in refs:
                if (obj := ref()) is not None:
                    readers.close_quietly(obj)
        self._streams.clear()
        if self._owned:
            try:
                self.con.close()
            finally:
                spill.release(self._spill)
                self._spill = None

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self.read_only else "read-write"
        return f"<pagedkv_sql.Database {self.path!r} {mode}>"

    @contextmanager
    def cursor(
        self, what: str = "query", *, write: bool = False
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        """A DuckDB cursor of its own for one call: the one way a capability (``replay``,
        ``engines``, ``report``, ``spark``) reaches the database. Used as ``with
        db.cursor("import", write=True) as cur:``. A ``duckdb.Error`` raised inside the
        block (or in opening the cursor) becomes a ``DatabaseError`` ``"WHAT: first line
        of DuckDB's message"``, with the DuckDB error as its ``__cause__``; ``write``
        first refuses a database open read-only (``UsageError``), then waits for any other
        write through this file in the process to end (one writer at a time: DuckDB would
        fail the second with a write-write conflict). ``progress()`` measures the statement
        running on it; the cursor is closed at the end of the block."""
        if write:
            self._writable()
        with self._writer if write else contextlib.nullcontext():
            try:
                cursor = self.con.cursor()
                # a cursor is a session of its own: the connection's settings are not its
                # own, and without these its statements report no progress (-1)
                cursor.execute(PROGRESS_SETTINGS)
            except duckdb.Error as e:
                raise DatabaseError(f"{what}: {first_line(e)}") from e
            self._busy.append(cursor)
            try:
                yield cursor
            except duckdb.Error as e:
                raise DatabaseError(f"{what}: {first_line(e)}") from e
            finally:
                self._busy.remove(cursor)
                cursor.close()

    def repair(self) -> None:
        """Recreate the views, macros and settings pagedkv-sql keeps beside the facts (a
        writable open does when they are missing or out of date); the facts are untouched."""
        self._writable()
        schema.create(self, force=True)

    def progress(self) -> float:
        """Percent done of the statement running now (call it from another thread), or
        -1 when none is running."""
        busy = list(self._busy)
        if not busy:
            return -1.0
        try:
            return float(busy[-1].query_progress())
        except duckdb.Error:  # the cursor was closed between the copy and the call
            return -1.0

    def stage(self) -> tuple[str, float, bool] | None:
        """The stage of the load running now (call it from another thread): its label
        (``read and check virtual_token``, ``diagnostics``, ``write``...), when it began
        (``time.monotonic()``), and whether ``progress()`` measures it; None between loads."""
        return self._stage

    def _begin_stage(self, label: str, measured: bool) -> None:
        self._stage = (label, time.monotonic(), measured)

    def setting(self, name: str) -> int:
        """A value of the ``pagedkv_settings`` table (``block_size``, ``schema_version``)."""
        with self.cursor(f"reading setting {name}") as cur:
            value = dbutil.setting(cur, name)
        if value is None:
            raise DatabaseError(f"setting {name} is missing from {self.path}")
        return value

    def _writable(self) -> None:
        if self.read_only:
            raise UsageError(f"{self.path} is open read-only")

    # -- loading -----------------------------------------------------------------------
    def load(
        self,
        *sources: str | os.PathLike[str],
        append: bool = False,
        strict: bool = False,
        format: InputFormat | None = None,
        relation: str | None = None,
        block_size: int | None = None,
        stdin: BinaryIO | None = None,
        diagnostics: bool = True,
        empty_missing: bool = False,
    ) -> LoadReport:
        """Load fact directories and files (or ``"-"`` for ``stdin``), all or nothing.

        A directory must hold a fact file; a relation it has no file for is kept, or
        emptied with ``empty_missing``;
        ``append`` adds instead of replacing; ``format`` forces the input format
        (by default it comes from each file's extension); ``relation`` names the relation
        of a single file or of stdin. Raises InputError or ConstraintError and leaves the
        database as it was."""
        self._writable()
        dbutil.check_block_size(block_size)
        found = discover([str(s) for s in sources], format, relation, stdin)
        try:
            with self.cursor("load", write=True) as cur:
                return load_sources(
                    cur,
                    found.sources,
                    append=append,
                    complete=found.complete,
                    empty_missing=empty_missing,
                    strict=strict,
                    block_size=block_size,
                    diagnostics=diagnostics,
                    on_stage=self._begin_stage,
                )
        finally:
            self._stage = None

    def load_arrow(
        self,
        relation: str,
        data: ArrowInput,
        *,
        append: bool = False,
        strict: bool = False,
        label: str | None = None,
        diagnostics: bool = True,
    ) -> LoadReport:
        """Load one relation from Arrow data, scanned by DuckDB in place (no copy through
        Python objects): a pyarrow Table, RecordBatch, RecordBatchReader, Dataset, any
        object with ``__arrow_c_stream__`` (polars, nanoarrow, DuckDB relations...), or a
        dict of column name -> array taken as engine snapshots take arrays (numpy, torch:
        shared; a CUDA tensor copied to the host once)."""
        self._writable()
        check_relation(relation)
        source = arrow_source(relation, data, label or f"<arrow {relation}>")
        with self.cursor(f"load_arrow {relation}", write=True) as cur:
            return load_sources(
                cur, [source], append=append, strict=strict, diagnostics=diagnostics
            )

    # -- reading -----------------------------------------------------------------------
    def resolve(
        self, batch_size: int = BATCH_SIZE, *, group: int | None = None
    ) -> pa.RecordBatchReader:
        """``resolved_kv_address`` as a stream of record batches, sorted by seq_id,
        token_pos, physical_address; a set, as the spec defines it. ``group``: the same
        three columns for KV-cache group ``group`` of an engine import instead (the tokens
        it keeps, at its blocks; docs/engines.md, "KV-cache groups")."""
        if group is None:
            end, reader = self._stream(statement("resolve_sorted"), batch_size)
        else:
            with self.cursor("resolve --group") as cur:
                kv_groups.check_group(cur, group)
            end, reader = self._stream(statement("resolve_group_sorted"), batch_size, [group])
        return pa.RecordBatchReader.from_batches(
            OUTPUT_SCHEMA, readers.distinct_sorted(reader, end)
        )

    def label_requests(self, reader: pa.RecordBatchReader) -> pa.RecordBatchReader:
        """``reader`` with the engine's request id beside each seq_id, after an engine
        import; unchanged otherwise."""
        with self.cursor("labelling requests") as cur:
            return label_stream(cur, reader)

    def resolve_table(self) -> pa.Table:
        """``resolve()`` read into one Arrow table."""
        return self.resolve().read_all()

    def reader(self, name: str, batch_size: int = BATCH_SIZE) -> pa.RecordBatchReader:
        """Any relation or validation view as a stream of record batches; the spec's
        relations with their fixed schemas (non-nullable int64), the output sorted."""
        self._check_name(name)
        if name == OUTPUT_RELATION:
            return self.resolve(batch_size)
        end, reader = self._stream(f"SELECT * FROM {name}", batch_size)
        schema = arrow_schema(name) if name in INPUT_RELATIONS else reader.schema
        return pa.RecordBatchReader.from_batches(schema, readers.passthrough(reader, end, schema))

    def _check_name(self, name: str) -> None:
        with self.cursor("listing the checks") as cur:
            checks = (*all_checks(), *discovered_checks(cur))
        known = [*INPUT_RELATIONS, OUTPUT_RELATION, *(c.name for c in checks)]
        if name not in known:
            raise UsageError(f"unknown relation or view '{name}'; known: {', '.join(known)}")

    def relation(self, name: str) -> duckdb.DuckDBPyRelation:
        """A relation or validation view as a lazy DuckDB relation, like DuckDB's
        ``con.table()``: ``.arrow()``, ``.pl()``, ``.df()``, ``.filter()``... convert or
        refine it. ``resolved_kv_address`` comes sorted. See ``reader()`` for a stream
        with fixed Arrow schemas."""
        self._check_name(name)
        order = " ORDER BY ALL" if name == OUTPUT_RELATION else ""
        return self.sql(f"SELECT * FROM {name}{order}")

    def sql(self, query: str, params: Sequence[Any] | None = None) -> duckdb.DuckDBPyRelation:
        """Run SQL as DuckDB's ``con.sql()`` does: a query gives a lazy
        ``DuckDBPyRelation`` (``.arrow()``, ``.pl()``, ``.df()``, ``.fetchall()``), a
        statement runs at once. It runs on a cursor of its own, so temporary tables and
        views live only as long as the result; use ``con`` for a session. A refused
        query raises QueryError: DuckDB's first line its message, the lines after it
        (candidates, 'Did you mean', the LINE and its caret) its ``details``, DuckDB's
        error its ``__cause__``."""
        try:
            cursor = self.con.cursor()
            return cursor.sql(query, params=list(params) if params is not None else None)
        except duckdb.Error as e:
            raise connection.query_error("SQL error", e) from e

    def _track(self, *handles: Any) -> Callable[[], None]:
        """Remember open handles (closed in this order) until the returned function
        closes them; ``close()`` closes those still open. Only weak references are
        kept, so a stream dropped unread is freed as before."""
        key = object()
        self._streams[key] = tuple(weakref.ref(h) for h in handles)
        weakref.finalize(handles[0], self._streams.pop, key, None)

        def end() -> None:
            if self._streams.pop(key, None) is not None:
                for h in handles:
                    readers.close_quietly(h)

        return end

    def _stream(
        self, query: str, batch_size: int, params: list[Any] | None = None
    ) -> tuple[Callable[[], None], pa.RecordBatchReader]:
        """A reader over ``query`` on a cursor of its own, and the function that ends
        both (the reader's generator calls it when done, ``close()`` if never)."""
        cursor = None
        try:
            cursor = self.con.cursor()  # fails too: a connection its owner closed
            reader = cursor.sql(query, params=params).to_arrow_reader(batch_size)
        except duckdb.Error as e:
            if cursor is not None:
                cursor.close()
            raise DatabaseError(f"reading {self.path}: {first_line(e)}") from e
        return self._track(reader, cursor), reader

    def resolve_stream(
        self, token_batches: ArrowInput | Iterable[ArrowInput], *, distinct: bool = True
    ) -> pa.RecordBatchReader:
        """Resolve a stream of ``virtual_token`` batches against the stored block tables,
        batch by batch, without writing the tokens into the database: a
        RecordBatchReader with the output schema, one output batch (at least) an input
        batch. With ``distinct`` a row already given for an earlier batch is not given
        again, so the output is exactly ``resolve()`` over the same tokens."""
        batches = stream.resolve_stream(self.con, token_batches, distinct=distinct)
        end = self._track(batches)  # closing it closes its cursor and temporary tables
        return pa.RecordBatchReader.from_batches(
            OUTPUT_SCHEMA, readers.chained(batches, "resolve_stream", end)
        )

    def check(self, *, block_size: int | None = None, limit: int | None = 100) -> CheckReport:
        """Run every validation view: spec constraints (errors) and diagnostics (warnings),
        with the first ``limit`` offending rows of each (all with ``None``)."""
        dbutil.check_block_size(block_size)
        if limit is not None and limit < 0:
            raise UsageError(f"limit must be 0 or more rows (None for all), not {limit}")
        if limit is not None and limit >= 2**63:
            limit = None  # beyond DuckDB's BIGINT LIMIT, and more rows than any table holds
        with self.cursor("check") as cur:
            return CheckReport(run_checks(cur, block_size=block_size, limit=limit))

    def explain(self, seq_id: int, token_pos: int) -> Explanation:
        """The resolution path of one token, or exactly where it breaks."""
        for name, value in (("seq_id", seq_id), ("token_pos", token_pos)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"explain: {name} must be an integer, not {value!r}")
            if not -(2**63) <= value < 2**63:  # no row has it: not an empty Explanation
                raise UsageError(f"explain: {name} {value} is out of the signed 64-bit range")
        with self.cursor("explain") as cur:
            return inspect.explain(cur, seq_id, token_pos)

    def stats(self, block_size: int | None = None) -> Stats:
        """Sequences, tokens, blocks per tier, sharing, refcounts, fragmentation, bytes."""
        dbutil.check_block_size(block_size)
        with self.cursor("stats") as cur:
            return inspect.stats(cur, block_size or dbutil.block_size(cur))

    def violations(self, *, block_size: int | None = None) -> pa.Table:
        """Every offending row of every check as one table: check, severity, row (JSON),
        reason, then the finding's invariant, model, request_ids and block_ids."""
        return self.check(block_size=block_size, limit=None).violations()


def resolve_arrow(
    *,
    root_table: ArrowInput | None = None,
    block_table_entry: ArrowInput | None = None,
    virtual_token: ArrowInput | None = None,
    swapped_block: ArrowInput | None = None,
) -> pa.Table:
    """Resolve Arrow inputs in a throwaway in-memory database: one call for a notebook.
    A relation left out is empty."""
    given = {
        "root_table": root_table,
        "block_table_entry": block_table_entry,
        "virtual_token": virtual_token,
        "swapped_block": swapped_block,
    }
    with Database(":memory:") as db:
        for relation, data in given.items():
            if data is not None:
                db.load_arrow(relation, data, diagnostics=False)
        return db.resolve_table()
