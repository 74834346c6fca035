"""A load: stage, validate and commit facts in one transaction, or change nothing.

The bulk path streams each source straight into its table through DuckDB's readers and
a strict cast; the CHECK clauses enforce the spec's constraints on the way in. Only when
DuckDB refuses something does the load look closer, to name every malformed line or every
row that breaks a constraint (relation, file:line, values), before it raises.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import duckdb

from . import paths
from .check import CheckResult, diagnose, staged_violations
from .dbutil import is_io_error, rollback, run, scalar
from .errors import ConstraintError, InputError, PagedKVError, Problem, Violation
from .relations import INPUT_RELATIONS, KEYS
from .sources import MAX_PROBLEMS, Source, problem_from_duckdb

MAX_VIOLATIONS = 10_000  # offending rows fetched (and located) per load; all are counted
# told each stage of a load as it begins: its label, and whether DuckDB's progress of the
# running statement measures it (one statement does the stage's work)
Stage = Callable[[str, bool], None]


def _no_stage(label: str, measured: bool) -> None:
    pass


@dataclass(frozen=True)
class RelationLoad:
    relation: str
    source: str | None  # None: the directory had no file for it
    mode: str  # "replaced" | "appended" | "emptied" | "kept"
    rows_read: int
    duplicates_dropped: int
    rows_total: int


@dataclass(frozen=True)
class LoadReport:
    relations: list[RelationLoad]
    warnings: list[CheckResult] = field(default_factory=list)


def _ident(name: str) -> str:
    assert name in INPUT_RELATIONS or name.startswith("_pagedkv_"), name
    return name


def _key_order_sql(relation: str) -> str:
    """Count the rows whose key is not strictly greater than the previous row's in scan
    order. Zero means the keys are strictly increasing, so unique, whatever that order."""
    key = KEYS[relation]

    def greater(keys: tuple[str, ...]) -> str:
        k = keys[0]
        if len(keys) == 1:
            return f"{k} > p_{k}"
        return f"({k} > p_{k} OR ({k} = p_{k} AND {greater(keys[1:])}))"

    cols = ", ".join(f"{k}, lag({k}) OVER () AS p_{k}" for k in key)
    return (
        f"SELECT count(*) FROM (SELECT {cols} FROM {_ident(relation)}) "
        f"WHERE p_{key[0]} IS NOT NULL AND NOT {greater(key)}"
    )


def _dedupe(con: duckdb.DuckDBPyConnection, relation: str) -> int:
    """Collapse exact duplicates; return how many rows were dropped. Cheap proofs first:
    keys in strictly increasing order, then unique keys; only then the full hash."""
    rel = _ident(relation)
    if scalar(con, _key_order_sql(relation)) == 0:
        return 0
    key = ", ".join(KEYS[relation])
    total = scalar(con, f"SELECT count(*) FROM {rel}")
    if scalar(con, f"SELECT count(*) FROM (SELECT DISTINCT {key} FROM {rel})") == total:
        return 0
    distinct = scalar(con, f"SELECT count(*) FROM (SELECT DISTINCT * FROM {rel})")
    if distinct == total:
        return 0
    run(con, f"CREATE TEMP TABLE _pagedkv_dedup AS SELECT DISTINCT * FROM {rel}")
    run(con, f"DELETE FROM {rel}")
    run(con, f"INSERT INTO {rel} SELECT * FROM _pagedkv_dedup")
    run(con, "DROP TABLE _pagedkv_dedup")
    return int(total - distinct)


class _Retry(Exception):
    """A source switched to its fallback reader: run the load again."""


def load_sources(
    con: duckdb.DuckDBPyConnection,
    sources: list[Source],
    *,
    append: bool,
    complete: bool = False,
    empty_missing: bool = False,
    strict: bool,
    block_size: int | None = None,
    diagnostics: bool,
    on_stage: Stage = _no_stage,
) -> LoadReport:
    """Load every source in one transaction; see ``_load``. When DuckDB's reader refused a
    file that our grammar accepts, the source switches to its Python reader and the whole
    load runs once more."""
    attempt = partial(
        _load,
        con,
        sources,
        append=append,
        complete=complete,
        empty_missing=empty_missing,
        strict=strict,
        block_size=block_size,
        diagnostics=diagnostics,
        on_stage=on_stage,
    )
    try:
        try:
            return attempt(retry=True)
        except _Retry:
            return attempt(retry=False)
    finally:
        for s in sources:
            s.close()


def _load(
    con: duckdb.DuckDBPyConnection,
    sources: list[Source],
    *,
    append: bool,
    complete: bool,
    empty_missing: bool,
    strict: bool,
    block_size: int | None,
    diagnostics: bool,
    on_stage: Stage = _no_stage,
    retry: bool,
) -> LoadReport:
    """Load every source in one transaction. ``complete``: a directory was given, so the
    report lists every relation; one without a source is kept as it is, or emptied under
    ``empty_missing`` (never with ``append``). ``diagnostics``: run the checks beyond the spec
    and report their findings as warnings (``strict`` refuses the load on any). Raises
    InputError / ConstraintError and leaves the database as it was."""
    reports: list[RelationLoad] = []
    try:
        run(con, "BEGIN")
        try:
            if not append:
                _clear_engine_tables(con)
            given = {s.relation: s for s in sources}
            for relation in INPUT_RELATIONS:
                source = given.get(relation)
                rel = _ident(relation)
                if source is None and not complete:
                    continue
                if source is None and (append or not empty_missing):
                    kept = scalar(con, f"SELECT count(*) FROM {rel}")
                    reports.append(RelationLoad(relation, None, "kept", 0, 0, kept))
                    continue
                before = 0 if not append else scalar(con, f"SELECT count(*) FROM {rel}")
                if not append:
                    run(con, f"DELETE FROM {rel}")
                read = 0
                if source is not None:
                    on_stage(f"read and check {relation}", True)
                    scan = source.scan_sql(con)
                    if not source.reusable:
                        stage = f"_pagedkv_stage_{relation}"
                        run(con, f"CREATE TEMP TABLE {stage} AS {scan}")
                        # read once: a refused INSERT could not be explained afterwards
                        _refuse_staged_violations(con, relation, stage)
                        scan = f"SELECT * FROM {stage}"
                    read = scalar(con, f"INSERT INTO {rel} {scan}")
                dropped = _dedupe(con, relation) if read else 0
                reports.append(
                    RelationLoad(
                        relation,
                        source.label if source else None,
                        ("appended" if append else "replaced") if source else "emptied",
                        read,
                        dropped,
                        before + read - dropped,
                    )
                )
            if block_size is not None:
                run(
                    con,
                    "UPDATE pagedkv_settings SET value = ? WHERE name = 'block_size'",
                    [block_size],
                )
            if diagnostics or strict:
                on_stage("diagnostics", False)
            warnings = diagnose(con, diagnostics=diagnostics, strict=strict, what="load")
            for relation in INPUT_RELATIONS:
                run(con, f"DROP TABLE IF EXISTS _pagedkv_stage_{relation}")
            on_stage("write", False)
            run(con, "COMMIT")
        except BaseException:
            rollback(con)
            raise
    except duckdb.Error as e:
        if isinstance(e, duckdb.InterruptException):
            raise  # Ctrl-C: rolled back above; nothing to diagnose
        if is_io_error(e):
            # a full disk, memory, an unreadable file: no closer look can help, fail fast
            raise paths.database_io_error("the database", e, "load into") from None
        fallbacks = [s.fallback for s in sources]
        on_stage("find what was refused", False)
        refusal = _explain_refusal(con, sources, e)
        switched = [s.fallback for s in sources] != fallbacks
        if refusal is None and retry and switched:  # a source switched to its fallback reader
            raise _Retry from e
        raise refusal or _refused(sources, e) from e
    return LoadReport(reports, warnings)


def _clear_engine_tables(con: duckdb.DuckDBPyConnection) -> None:
    """A replacing load makes the engine_* facts of an earlier `import` describe a state
    that is gone: they are emptied with it (docs/engines.md)."""
    tables = run(
        con,
        "SELECT table_name FROM duckdb_tables() "
        "WHERE starts_with(table_name, 'engine_') AND NOT temporary",
    )
    for (name,) in tables:
        run(con, f'DELETE FROM "{name}"')


def _explain_refusal(
    con: duckdb.DuckDBPyConnection, sources: list[Source], error: duckdb.Error
) -> PagedKVError | None:
    """DuckDB refused the bulk load; find out precisely why, with nothing written.
    None: no reason of ours was found (a source may have switched to its fallback)."""
    problems: list[Problem] = []
    total = 0
    fallbacks = [s.fallback for s in sources]
    for source in sources:
        if source.reusable:
            count, found = source.diagnose(con)
        else:
            found = [problem_from_duckdb(source.label, error)] if _is_ours(error) else []
            count = len(found)
        total += count
        problems.extend(found[: MAX_PROBLEMS - len(problems)])
    if problems:
        where = sorted({p.source for p in problems})
        return InputError(
            f"{total} malformed value(s) or line(s) in {', '.join(where)}; nothing was loaded",
            problems,
            total,
            hint="fix the lines named above; numbers are decimal, 0x hex or 0b binary "
            "signed 64-bit integers",
        )
    if [s.fallback for s in sources] != fallbacks:
        return None
    return _spec_violations(con, sources)


def _refused(sources: list[Source], error: duckdb.Error) -> PagedKVError:
    """No reason of ours was found: DuckDB's own, naming a stream that was read once (an
    Arrow reader, stdin) since that is where such a failure comes from."""
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    streams = [s.label for s in sources if not s.reusable]
    if streams:
        return InputError(
            f"{', '.join(streams)}: the stream failed while it was being read: {first}; "
            "nothing was loaded",
            hint="check the producer of the stream (a truncated stream, a bad batch, an "
            "exception in the producer)",
        )
    return PagedKVError(f"load refused by DuckDB: {first}")


def _is_ours(error: duckdb.Error) -> bool:
    return "pagedkv: " in str(error)


def _spec_violations(
    con: duckdb.DuckDBPyConnection, sources: list[Source]
) -> ConstraintError | None:
    """Stage each source, run the spec's checks on the staged rows, and locate the
    offenders in their files."""
    found: list[Violation] = []
    total = 0
    run(con, "BEGIN")
    try:
        for source in sources:
            if not source.reusable:
                continue
            stage = f"_pagedkv_check_{source.relation}"
            run(con, f"CREATE TEMP TABLE {stage} AS {source.scan_sql(con)}")
            count, violations = staged_violations(
                con, source.relation, stage, MAX_VIOLATIONS, partial(source.locate, con)
            )
            total += count
            found += violations
    finally:
        rollback(con)
    return _constraint_error(found, total)


def _refuse_staged_violations(con: duckdb.DuckDBPyConnection, relation: str, stage: str) -> None:
    """Raise the ConstraintError of the spec's checks on rows staged from a stream that
    cannot be read again; the offending rows are named by their values."""
    total, found = staged_violations(con, relation, stage, MAX_VIOLATIONS, lambda rows: {})
    error = _constraint_error(found, total)
    if error is not None:
        raise error


def _constraint_error(found: list[Violation], total: int) -> ConstraintError | None:
    if not found:
        return None
    relations = sorted({v.relation for v in found})
    return ConstraintError(
        f"{total} row(s) of {', '.join(relations)} violate the spec's integrity constraints; "
        "nothing was loaded",
        found,
        total,
        hint="block bases must be multiples of 256, offsets in [0, 255], refcounts >= 0",
    )
