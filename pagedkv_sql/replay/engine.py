"""Replay in bulk: load the event table, build the intervals once, run each invariant as
one query over the whole log (sql/replay.sql), materialize the state at a step into the
spec's tables, diff two steps."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

import duckdb
import pyarrow as pa

from .. import findings, kv_groups
from ..dbutil import rollback, run, scalar
from ..errors import InputError, PagedKVError, Problem, UsageError
from ..invariants import BY_NAME, REPLAY, Check, checks, idea_of
from ..relations import INPUT_RELATIONS
from ..sqlfiles import Statement, statements_in
from . import marks
from .header import EVENT_DEFAULTS, groups_from
from .log import EVENT_SCHEMA, Header, LogSource, ParquetEvents, event_source, header_of
from .marks import Mark, mark_of

REPLAY_SQL = "replay.sql"
_BUILD = (
    "build_replay_location",
    "build_replay_written",
    "build_replay_holder_change",
)
FINDING_COLUMNS = (  # check_name: the replay check (Finding.check)
    "check_name",
    "event",
    "step",
    "op",
    "request",
    "other_requests",
    "block_id",
    "block_index",
    "expected",
    "found",
    "message",
)


@cache
def statements() -> dict[str, Statement]:
    return {s.name: s for s in statements_in(REPLAY_SQL)}


def sql(name: str) -> str:
    return statements()[name].sql.rstrip().rstrip(";")


@cache
def replay_checks() -> tuple[Check, ...]:
    """Replay's checks: the ``replay_check_*`` queries of sql/replay.sql, in its order."""
    return tuple(
        Check(s.name.removeprefix("replay_check_"), "warning", s.doc, None, REPLAY)
        for s in statements().values()
        if s.name.startswith("replay_check_")
    )


# the old names of replay's checks, kept for one release
Invariant = Check
invariants = replay_checks


@dataclass(frozen=True)
class Finding:
    """One step that broke one invariant: replay's finding (``findings.Finding``)."""

    check: str  # the replay check (sql/replay.sql's replay_check_<check>)
    event: int
    step: int
    op: str
    request: str | None
    other_requests: str | None  # comma-separated
    block_id: int | None
    block_index: int | None
    expected: str
    found: str
    message: str
    cause: str | None = None  # for a consequence, the earlier finding that explains it

    model = REPLAY

    @property
    def invariant(self) -> str:
        """The catalogue's name of the idea (pagedkv_sql/invariants.py)."""
        return findings.invariant(self)

    @property
    def where(self) -> str:
        return f"step {self.step}"

    @property
    def request_ids(self) -> tuple[str, ...]:
        others = tuple(r for r in (self.other_requests or "").split(",") if r)
        return ((self.request,) if self.request is not None else ()) + others

    @property
    def block_ids(self) -> tuple[int, ...]:
        return () if self.block_id is None else (self.block_id,)

    def extra(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "op": self.op,
            "block_index": self.block_index,
            "expected": self.expected,
            "found": self.found,
        }

    def to_dict(self) -> dict[str, Any]:
        """The shared keys (``findings.as_dict``), then every column of the finding."""
        return {**findings.as_dict(self), **asdict(self), "invariant": self.invariant}


@dataclass(frozen=True)
class ReplayReport:
    steps: int
    events: int
    requests: int
    findings: list[Finding] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    mark: Mark | None = None  # where a recorder's log stopped being checkable

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def first(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "events": self.events,
            "requests": self.requests,
            "counts": self.counts,
            "findings": [f.to_dict() for f in self.findings],
            "mark": None if self.mark is None else self.mark.to_dict(),
        }


def _create_objects(con: duckdb.DuckDBPyConnection) -> None:
    for s in statements().values():
        if s.sql.lstrip().upper().startswith("CREATE OR REPLACE MACRO"):
            run(con, s.sql)


def insert_header(con: duckdb.DuckDBPyConnection, header: Header) -> None:
    """The log's header as the row of replay_log (its counts are filled in after the load)."""
    run(
        con,
        "INSERT INTO replay_log (engine, block_size, block_bytes, gpu_base, num_gpu_blocks, "
        "reserved_blocks, groups) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            header.engine,
            header.block_size,
            header.block_bytes,
            header.gpu_base,
            header.num_gpu_blocks,
            list(header.reserved_blocks),
            json.dumps([asdict(g) for g in header.groups]) if header.groups else None,
        ],
    )


def load_events(
    con: duckdb.DuckDBPyConnection,
    events: pa.Table | ParquetEvents,
    *,
    validate: bool,
    _intern_by_join: bool = False,
) -> Header:
    """Replace the stored log with ``events`` and build its intervals, all or nothing.
    ``validate``: check the event table's format (Parquet / Arrow input; the JSON Lines
    reader only makes valid tables)."""
    header = events.header if isinstance(events, ParquetEvents) else header_of(events)
    if isinstance(events, ParquetEvents):
        mark = events.mark
    else:
        mark = mark_of(events.schema.metadata, "the event table")
    params: list[Any] = []
    if isinstance(events, ParquetEvents):
        import pyarrow.parquet as pq

        present = set(pq.read_schema(events.path).names)
        casts = ", ".join(
            f"{f.name}::{'VARCHAR' if f.type == pa.string() else 'BIGINT'} AS {f.name}"
            if f.name in present
            else f"{EVENT_DEFAULTS[f.name]}::BIGINT AS {f.name}"  # written before the column
            for f in EVENT_SCHEMA
        )
        source = f"(SELECT {casts} FROM read_parquet(?))"
        params = [events.path]
    else:
        con.register("_pagedkv_events", events)
        source = "_pagedkv_events"
    run(con, "BEGIN")
    try:
        if scalar(con, sql("replay_op_outdated")):
            run(con, sql("drop_replay_op"))
        run(con, sql("create_replay_event"))
        run(con, sql("create_replay_log"))
        run(con, sql("replay_event_problem_macro"))
        kv_groups.create_macros(con)  # pagedkv_kept_start, which replay_kept_from calls
        run(con, sql("replay_key_macros"))
        # the request ids are read once, numbered, and replaced by their key
        run(con, sql("build_replay_request").replace("_replay_source", source), params)
        _group_constants(con, header)
        insert = "insert_replay_event"
        if _intern_by_join or scalar(
            con, "SELECT count(DISTINCT rkey) < count(*) FROM replay_request"
        ):  # two request ids hash alike: key the requests by key_no
            run(con, "UPDATE replay_request SET rkey = key_no")
            insert = "insert_replay_event_joined"
        run(con, sql(insert).replace("_replay_source", source), params)
        insert_header(con, header)
        run(con, "UPDATE replay_log SET mark = ?", [None if mark is None else mark.to_json()])
        run(con, sql("replay_event_quick_check"))
        run(con, sql("replay_request_facts"))
        bad_rows, unordered, unborn, steps, count, first, last = run(
            con, sql("replay_event_quick_counts")
        )[0]
        run(con, "DROP TABLE _replay_key_facts")
        if validate and (bad_rows or unordered or unborn):
            text = sql("replay_event_problems")
            problems = run(
                con,
                text.replace("_replay_source", source),
                params * text.count("_replay_source"),
            )
            if problems:
                raise InputError(
                    f"the event table has {len(problems)} malformed row(s); nothing was loaded",
                    [Problem("event table", None, None, f"event {e}: {p}") for e, _, p in problems],
                    hint="the event table's format: https://github.com/pagedkv-sql/pagedkv-sql/blob/main/docs/replay.md",
                )
        if unordered:  # valid, but its rows are not in event order: count the steps apart
            steps = scalar(con, "SELECT count(DISTINCT step) FROM replay_event")
        run(
            con,
            "UPDATE replay_log SET steps = ?, events = ?, first_step = ?, last_step = ?",
            [steps, count, first, last],
        )
        for name in _BUILD:
            run(con, sql(name))
        _create_objects(con)
        run(con, "COMMIT")
    except BaseException:
        rollback(con)
        raise
    finally:
        if not isinstance(events, ParquetEvents):
            con.unregister("_pagedkv_events")
    return header


def _group_constants(con: duckdb.DuckDBPyConnection, header: Header) -> None:
    """Each request's row of a KV-cache group gets the group's block size and window, and
    whether it is the primary group (the one the spec's relations describe); a row of a
    group the header does not have is refused."""
    groups = header.groups or (header.group(0),)
    stray = run(
        con,
        "SELECT DISTINCT group_id FROM replay_request WHERE group_id NOT BETWEEN 0 AND ?",
        [len(groups) - 1],
    )
    if stray:
        raise InputError(
            f"the event table names KV-cache group {stray[0][0]}, which the header does not "
            f"have ({len(groups)} group(s)); nothing was loaded",
            hint="give the header's 'groups' (docs/replay.md, \"KV-cache groups\")",
        )
    for g, group in enumerate(groups):
        run(
            con,
            "UPDATE replay_request SET block_size = ?, sliding_window = ?, "
            "attention_chunk_size = ?, is_primary = ? WHERE group_id = ?",
            [
                group.block_size,
                group.sliding_window,
                group.attention_chunk_size,
                g == header.primary,
                g,
            ],
        )


def store(con: duckdb.DuckDBPyConnection, log: LogSource) -> Header:
    """Store a step log (a path, a stream or an event table) in the database, replacing
    the one stored, and build its intervals: the step of ``replay.run`` that ``watch``
    takes too, on the cursor it holds."""
    events, validate = event_source(log)
    return load_events(con, events, validate=validate)


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection, failure: str) -> Iterator[None]:
    """One transaction, all or nothing: a DuckDB error rolls back and becomes a PagedKVError
    starting with ``failure``; anything else (Ctrl-C, a refused step) rolls back and goes on."""
    run(con, "BEGIN")
    try:
        yield
        run(con, "COMMIT")
    except duckdb.Error as e:
        rollback(con)
        raise PagedKVError(f"{failure}: {str(e).splitlines()[0]}") from None
    except BaseException:
        rollback(con)
        raise


def has_log(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(
        scalar(con, "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'replay_location'")
    )


def require_log(con: duckdb.DuckDBPyConnection) -> None:
    if not has_log(con):
        raise UsageError(
            "no step log in this database",
            hint="replay one first: `pagedkv-sql replay LOG` (or give LOG here)",
        )
    if not scalar(
        con,
        "SELECT count(*) FROM duckdb_columns() WHERE table_name = 'replay_written' "
        "AND column_name = 'end_step'",
    ):
        raise UsageError(
            "the step log in this database was stored by an older pagedkv-sql",
            hint="replay it again: `pagedkv-sql replay LOG`",
        )


def findings_query(only: list[str] | None = None) -> str:
    """All invariants (or those named) as one UNION ALL with the finding columns."""
    cols = ", ".join(FINDING_COLUMNS)
    return "\nUNION ALL\n".join(
        f"SELECT * FROM ({sql('replay_check_' + i.name)}) AS t({cols})"
        for i in replay_checks()
        if only is None or i.name in only
    )


def _rank_sql() -> str:
    """Each check's rank in the catalogue, as a SQL expression over the finding's check."""
    cases = " ".join(f"WHEN '{name}' THEN {inv.rank}" for name, inv in checks(REPLAY))
    return f"CASE check_name {cases} ELSE 1000 END"


def _causes_sql() -> str:
    """(check, a check whose finding can cause its finding, that check's idea) triples, as
    a VALUES list."""
    pairs = [
        f"('{name}', '{cause}', '{idea}')"
        for name, inv in checks(REPLAY)
        for idea in inv.causes
        for cause in BY_NAME[idea].checks.get(REPLAY, ())
    ]
    return "VALUES " + ", ".join(pairs)


def check(
    con: duckdb.DuckDBPyConnection, *, keep_going: bool = False, limit: int | None = None
) -> ReplayReport:
    """Every invariant at every step, all at once: the first finding, or all of them with
    ``keep_going``. A step's findings come cause before consequence (the catalogue's rank),
    and a consequence names the finding that can explain it (``Finding.cause``)."""
    require_log(con)
    several = len(header(con).groups) > 1  # a finding in a group's table names the group
    run(
        con,
        "CREATE OR REPLACE TEMP MACRO replay_in_group(g) AS "
        + ("' in group ' || g" if several else "''"),
    )
    order = (
        f"ORDER BY step, {_rank_sql()}, event, check_name, request NULLS FIRST, "
        "block_id NULLS FIRST"
    )
    counts: dict[str, int] = {}
    if not keep_going:  # the first finding: a top-1 over the union, nothing kept
        rows = run(con, f"SELECT * FROM ({findings_query()}) {order} LIMIT 1")
        found = [Finding(*r) for r in rows]
    else:
        run(con, f"CREATE OR REPLACE TEMP TABLE _replay_found AS {findings_query()}")
        try:
            shown = f" LIMIT {int(limit)}" if limit else ""
            rows = run(
                con,
                sql("replay_finding_causes").replace("$CAUSES", _causes_sql()) + f" {order}{shown}",
            )
            found = [Finding(*r) for r in rows]
            for name, n in run(
                con, "SELECT check_name, count(*) FROM _replay_found GROUP BY ALL ORDER BY ALL"
            ):
                idea = idea_of(REPLAY, name).name
                counts[idea] = counts.get(idea, 0) + int(n)
        finally:
            run(con, "DROP TABLE IF EXISTS _replay_found")
    steps, events = run(con, "SELECT steps, events FROM replay_log")[0]
    requests = int(scalar(con, "SELECT count(DISTINCT request_id) FROM replay_request"))
    return ReplayReport(
        int(steps), int(events), requests, found, dict(sorted(counts.items())), stored_mark(con)
    )


def stored_mark(con: duckdb.DuckDBPyConnection) -> Mark | None:
    """The recorder's mark of the stored log (none in a log stored before marks)."""
    if not scalar(
        con,
        "SELECT count(*) FROM duckdb_columns() WHERE table_name = 'replay_log' "
        "AND column_name = 'mark'",
    ):
        return None
    return marks.stored(run(con, "SELECT mark FROM replay_log")[0][0], "the stored log")


def step_range(con: duckdb.DuckDBPyConnection) -> tuple[int, int] | None:
    row = run(con, "SELECT first_step, last_step FROM replay_log")[0]
    return None if row[0] is None else (int(row[0]), int(row[1]))


def _check_step(con: duckdb.DuckDBPyConnection, step: int, what: str) -> None:
    bounds = step_range(con)
    if bounds is None:
        raise UsageError("the stored step log is empty")
    if step < 0:
        raise UsageError(f"{what} {step} is negative")
    if step > bounds[1]:
        raise UsageError(f"{what} {step} is after the log's last step ({bounds[1]})")


@dataclass(frozen=True)
class Materialized:
    step: int
    rows: dict[str, int]


def materialize(con: duckdb.DuckDBPyConnection, step: int) -> Materialized:
    """Replace the spec's four tables with the state at the end of ``step``, all or nothing
    (a failure leaves the database as it was)."""
    require_log(con)
    _check_step(con, step, "--at")
    rows: dict[str, int] = {}
    with transaction(con, f"cannot materialize step {step}"):
        for relation, columns in INPUT_RELATIONS.items():
            run(con, f"DELETE FROM {relation}")
            cols = ", ".join(columns)
            inserted = run(
                con,
                f"INSERT INTO {relation} SELECT {cols} FROM replay_{relation}_at(?) "
                f"ORDER BY {cols}",
                [step],
            )
            rows[relation] = int(inserted[0][0])
        run(
            con,
            "INSERT OR REPLACE INTO pagedkv_settings SELECT 'block_size', block_size "
            "FROM replay_log",
        )
        run(con, sql("replay_request_label"))
    return Materialized(step, rows)


def diff(con: duckdb.DuckDBPyConnection, a: int, b: int) -> pa.Table:
    """What changed from the end of step ``a`` to the end of step ``b``."""
    require_log(con)
    _check_step(con, a, "--from")
    _check_step(con, b, "--to")
    return con.sql("SELECT * FROM replay_diff(?, ?)", params=[a, b]).to_arrow_table()


def header(con: duckdb.DuckDBPyConnection) -> Header:
    """The stored log's header (a log stored before groups: none)."""
    row = run(con, "SELECT * FROM replay_log")[0]
    groups = groups_from(json.loads(row[11])) if len(row) > 11 and row[11] else ()
    return Header(row[0], row[1], row[2], row[3], row[4], tuple(row[5]), groups)
