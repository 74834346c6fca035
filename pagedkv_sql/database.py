"""The library's front door: a Database over one DuckDB file (or ``:memory:``)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from . import dbutil, inspect, stream
from .check import CheckReport, all_checks, discovered_checks, label_stream, run_checks
from .dbutil import run, scalar
from .errors import DatabaseError, DatabaseLockedError, PagedKVError, UsageError
from .inspect import Explanation, Stats
from .load import LoadReport, load_sources
from .relations import (
    INPUT_RELATIONS,
    OUTPUT_RELATION,
    OUTPUT_SCHEMA,
    arrow_schema,
    check_relation,
)
from .sources import arrow_source, discover
from .sqlfiles import SQL_FILES, statement, statements_in

DEFAULT_DB = "pagedkv.duckdb"
ENV_DB = "PAGEDKV_DB"
SCHEMA_VERSION = 1
BATCH_SIZE = 1 << 20
# A file written with this setting also opens in the DuckDB 1.5 shell (duckdb-cli on PyPI).
STORAGE_COMPATIBILITY = "v1.5.0"
_LOCK = re.compile(r"Conflicting lock is held in (.*?)(?: by user \S+)?\.(?: See|$)", re.S)


def default_path() -> str:
    return os.environ.get(ENV_DB) or DEFAULT_DB


def connect(
    path: str | os.PathLike[str] | None = None,
    *,
    read_only: bool = False,
    must_exist: bool = False,
) -> Database:
    """Open (and, unless read-only, create) a pagedkv database. ``None`` means the
    ``PAGEDKV_DB`` environment variable, else ``pagedkv.duckdb`` in the working directory."""
    return Database(path, read_only=read_only, must_exist=must_exist)


class Database:
    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        read_only: bool = False,
        must_exist: bool = False,
    ) -> None:
        self.path = str(path) if path is not None else default_path()
        memory = self.path == ":memory:"
        if memory and read_only:
            read_only = False
        if (must_exist or read_only) and not memory and not Path(self.path).exists():
            raise DatabaseError(
                f"no database at {self.path}",
                hint="create it with `pagedkv-sql load SOURCE`, or pass --db / set PAGEDKV_DB",
            )
        try:
            self.con = duckdb.connect(
                self.path,
                read_only=read_only,
                config={"storage_compatibility_version": STORAGE_COMPATIBILITY},
            )
        except duckdb.IOException as e:
            raise _open_error(self.path, e) from None
        except duckdb.Error as e:
            raise DatabaseError(
                f"cannot open {self.path}: {str(e).splitlines()[0]}",
                hint="is it a DuckDB database file?",
            ) from None
        self.read_only = read_only
        # progress is tracked for the CLI's bar, never printed by DuckDB itself
        run(self.con, "SET enable_progress_bar = true")
        run(self.con, "SET enable_progress_bar_print = false")
        if read_only:
            self._check_schema()
        else:
            self._create_schema()

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create_schema(self) -> None:
        self._check_schema(missing_ok=True)
        run(self.con, "BEGIN")
        for file in SQL_FILES:
            for stmt in statements_in(file):
                if stmt.sql.lstrip().upper().startswith(("CREATE", "INSERT")):
                    run(self.con, stmt.sql)
        run(self.con, "COMMIT")

    def _check_schema(self, missing_ok: bool = False) -> None:
        if not scalar(
            self.con, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'pagedkv_settings'"
        ):
            if missing_ok:
                if self._has_foreign_tables():
                    raise DatabaseError(
                        f"{self.path} is a DuckDB database but not a pagedkv-sql one",
                        hint="point --db at a new file or at one made by pagedkv-sql",
                    )
                return
            raise DatabaseError(
                f"{self.path} is not a pagedkv-sql database (no pagedkv_settings table)",
                hint="create one with `pagedkv-sql load SOURCE`",
            )
        version = self.setting("schema_version")
        if version != SCHEMA_VERSION:
            raise DatabaseError(
                f"{self.path} has schema version {version}; this pagedkv-sql reads "
                f"version {SCHEMA_VERSION}"
            )

    def _has_foreign_tables(self) -> bool:
        return bool(scalar(self.con, "SELECT count(*) FROM duckdb_tables() WHERE NOT temporary"))

    def progress(self) -> float:
        """Percent done of the statement running now (from another thread), or -1."""
        return float(self.con.query_progress())

    def setting(self, name: str) -> int:
        value = dbutil.setting(self.con, name)
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
        format: str | None = None,
        relation: str | None = None,
        block_size: int | None = None,
        stdin: Any = None,
        diagnostics: bool = True,
    ) -> LoadReport:
        """Load fact directories and files (or '-' for ``stdin``), all or nothing."""
        self._writable()
        _check_block_size(block_size)
        found = discover([str(s) for s in sources], format, relation, stdin)
        return load_sources(
            self.con,
            found.sources,
            append=append,
            complete=found.complete,
            strict=strict,
            block_size=block_size,
            diagnostics=diagnostics,
        )

    def load_arrow(
        self,
        relation: str,
        data: Any,
        *,
        append: bool = False,
        strict: bool = False,
        label: str | None = None,
        diagnostics: bool = True,
    ) -> LoadReport:
        """Load one relation from Arrow data, scanned by DuckDB in place (no copy through
        Python objects): a pyarrow Table, RecordBatch, RecordBatchReader, Dataset, or any
        object with ``__arrow_c_stream__`` (polars, nanoarrow, DuckDB relations...)."""
        self._writable()
        check_relation(relation)
        source = arrow_source(relation, data, label or f"<arrow {relation}>")
        return load_sources(
            self.con, [source], append=append, strict=strict, diagnostics=diagnostics
        )

    def load_engine(
        self,
        snapshot: Any,
        engine: str | None = None,
        *,
        strict: bool = False,
        diagnostics: bool = True,
        convert: bool = False,
    ) -> Any:
        """Replace the stored state with a serving engine's: a ``Snapshot`` (from a
        capture function) or a ``.safetensors`` / ``.npz`` snapshot file, all or nothing.
        Returns an ``engines.ImportReport``. See docs/engines.md."""
        self._writable()
        from .engines import load_engine

        return load_engine(
            self.con, snapshot, engine, strict=strict, diagnostics=diagnostics, convert=convert
        )

    def export_engine(self, engine: str) -> Any:
        """The stored relations as an engine's own arrays (``engines.Export``; its
        ``write(DIR)`` writes them): ``flashinfer`` or ``vllm``."""
        from .engines import export_engine

        return export_engine(self.con, engine)

    def kv_addresses(self, seq_id: int, token_pos: int, layer: int, head: int) -> list[Any]:
        """The real byte addresses of one token's K and V for a layer and head, from the
        cache-tensor layouts an engine import recorded (``engines.layout.KVAddress``)."""
        from .engines.layout import token_addresses

        return token_addresses(self.con, seq_id, token_pos, layer, head)

    # -- reading -----------------------------------------------------------------------
    def resolve(self, batch_size: int = BATCH_SIZE) -> pa.RecordBatchReader:
        """``resolved_kv_address`` as a stream of record batches, sorted by seq_id,
        token_pos, physical_address; a set, as the spec defines it."""
        cursor = self.con.cursor()
        reader = cursor.sql(statement("resolve_sorted")).to_arrow_reader(batch_size)
        return pa.RecordBatchReader.from_batches(OUTPUT_SCHEMA, _distinct_sorted(reader, cursor))

    def label_requests(self, reader: pa.RecordBatchReader) -> pa.RecordBatchReader:
        """``reader`` with the engine's request id beside each seq_id, after an engine
        import; unchanged otherwise."""
        return label_stream(self.con, reader)

    def resolve_table(self) -> pa.Table:
        return self.resolve().read_all()

    def relation(self, name: str, batch_size: int = BATCH_SIZE) -> pa.RecordBatchReader:
        """Any relation or validation view as a stream of record batches."""
        checks = (*all_checks(), *discovered_checks(self.con))
        known = [*INPUT_RELATIONS, OUTPUT_RELATION, *(c.name for c in checks)]
        if name not in known:
            raise UsageError(f"unknown relation or view '{name}'; known: {', '.join(known)}")
        if name == OUTPUT_RELATION:
            return self.resolve(batch_size)
        cursor = self.con.cursor()
        reader = cursor.sql(f"SELECT * FROM {name}").to_arrow_reader(batch_size)
        schema = arrow_schema(name) if name in INPUT_RELATIONS else reader.schema
        return pa.RecordBatchReader.from_batches(schema, _passthrough(reader, cursor, schema))

    def resolve_stream(
        self, token_batches: Iterable[Any], *, distinct: bool = True
    ) -> Iterator[pa.RecordBatch]:
        """Resolve a stream of ``virtual_token`` batches against the stored block tables,
        batch by batch, without writing the tokens into the database."""
        return stream.resolve_stream(self.con, token_batches, distinct=distinct)

    def check(self, *, block_size: int | None = None, limit: int | None = 100) -> CheckReport:
        """Run every validation view: spec constraints (errors) and diagnostics (warnings)."""
        _check_block_size(block_size)
        return CheckReport(run_checks(self.con, block_size=block_size, limit=limit))

    def explain(self, seq_id: int, token_pos: int) -> Explanation:
        """The resolution path of one token, or exactly where it breaks."""
        return inspect.explain(self.con, seq_id, token_pos)

    def stats(self, block_size: int | None = None) -> Stats:
        """Sequences, tokens, blocks per tier, sharing, refcounts, fragmentation, bytes."""
        _check_block_size(block_size)
        return inspect.stats(self.con, block_size or self.setting("block_size"))

    def violations(self, *, block_size: int | None = None) -> pa.Table:
        """Every offending row of every check as one table: check, severity, row (JSON),
        reason."""
        import json

        rows = []
        for result in self.check(block_size=block_size, limit=None).results:
            for r in result.rows.to_pylist():
                reason = r.pop("reason")
                rows.append((result.name, result.severity, json.dumps(r), reason))
        names = ["check", "severity", "row", "reason"]
        return pa.table(
            {n: pa.array([r[i] for r in rows], pa.string()) for i, n in enumerate(names)}
        )

    # -- replay (pagedkv_sql/replay: docs/replay.md) -------------------------------------
    def replay(self, log: Any = None, *, keep_going: bool = False, limit: int | None = None) -> Any:
        """Store a step log (a path, a stream or an event table; None: the one stored) and
        check every invariant at every step: a ReplayReport with the first finding, or all
        of them with ``keep_going``."""
        from . import replay

        if log is not None:
            self._writable()
        return replay.replay(self.con, log, keep_going=keep_going, limit=limit)

    def replay_at(self, step: int) -> Any:
        """Replace the spec's tables with the stored log's state at the end of ``step``."""
        from . import replay

        self._writable()
        return replay.materialize(self.con, step)

    def diff(self, from_step: int, to_step: int) -> pa.Table:
        """What changed in the stored log's state from one step to another."""
        from . import replay

        return replay.diff(self.con, from_step, to_step)

    def apply(self, step: Any) -> Any:
        """Apply one step of a step log (a dict or a JSON line) in one transaction: refcount
        kept equal to the holders, only the touched keys checked, a breaking step refused
        (StepRefused, nothing written). Returns the change to resolved_kv_address
        (``.added``, ``.removed``)."""
        from .replay import apply

        self._writable()
        return apply.apply(self.con, step)

    def sql(self, query: str, params: list[Any] | None = None) -> pa.Table:
        """Run any SQL and return the result as an Arrow table."""
        try:
            return self.con.sql(query, params=params).to_arrow_table()
        except duckdb.Error as e:
            raise PagedKVError(f"SQL error: {str(e).splitlines()[0]}") from None


def resolve_arrow(
    *,
    root_table: Any = None,
    block_table_entry: Any = None,
    virtual_token: Any = None,
    swapped_block: Any = None,
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


def _check_block_size(block_size: int | None) -> None:
    if block_size is not None and block_size <= 0:
        raise UsageError(f"--block-size must be a positive number of tokens, not {block_size}")


def _open_error(path: str, e: duckdb.Error) -> DatabaseError:
    text = str(e)
    if "lock" in text.lower():
        match = _LOCK.search(text)
        holder = match.group(1).strip() if match else "another process"
        return DatabaseLockedError(
            f"database {path} is locked by {holder}",
            hint="wait for that process to finish (or close that DuckDB shell) and retry",
        )
    return DatabaseError(f"cannot open {path}: {text.splitlines()[0]}")


def _passthrough(
    reader: pa.RecordBatchReader, cursor: duckdb.DuckDBPyConnection, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    try:
        for batch in reader:
            yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)
    finally:
        reader.close()
        cursor.close()


def _distinct_sorted(
    reader: Iterable[pa.RecordBatch], cursor: duckdb.DuckDBPyConnection | None = None
) -> Iterator[pa.RecordBatch]:
    """Drop exact duplicates from sorted batches: they can only be neighbours."""
    last: tuple[int, int, int] | None = None
    try:
        for batch in reader:
            if batch.num_rows == 0:
                continue
            cols = [c.to_numpy(zero_copy_only=False) for c in batch.columns]
            keep = np.empty(batch.num_rows, dtype=bool)
            same = (cols[0][1:] == cols[0][:-1]) & (cols[1][1:] == cols[1][:-1])
            keep[1:] = ~(same & (cols[2][1:] == cols[2][:-1]))
            first = (int(cols[0][0]), int(cols[1][0]), int(cols[2][0]))
            keep[0] = first != last
            last = (int(cols[0][-1]), int(cols[1][-1]), int(cols[2][-1]))
            if not keep.all():
                batch = batch.filter(pa.array(keep))
            yield pa.RecordBatch.from_arrays(batch.columns, schema=OUTPUT_SCHEMA)
    finally:
        if cursor is not None:
            cursor.close()
