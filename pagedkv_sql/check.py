"""Running the validation views of sql/constraints.sql.

The views are the single source of truth: every `spec_*` view is an error check (a spec
constraint), every `diag_*` view a warning (a consistency check beyond the spec), and the
comment under each statement's name is its explanation.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import duckdb
import pyarrow as pa

from . import findings, invariants
from .dbutil import block_size as stored_block_size
from .dbutil import run, scalar
from .errors import ConstraintError, Violation
from .invariants import ENGINE, RENAMED_VIEWS, SPEC
from .invariants import Check as Check  # the one check type of every model
from .relations import INPUT_RELATIONS
from .sqlfiles import statements_in
from .viewfindings import SEQUENCE_COLUMNS, VIEW_IDS, ViewFinding, sequences, view_finding

_SPEC_RELATION = re.compile(r"pagedkv_spec_\w+\('(\w+)'\)")
# checks that take the block size: a --block-size given for one run overrides the setting
_BLOCK_SIZE_MACROS = {"diag_token_decomposition": "pagedkv_diag_token_decomposition"}
# checks whose macro takes, for each relation named, whether its keys are proven unique
# (pagedkv_block_keys_ascending): the view passes false, the runner what it proved
_KEY_PROOF_MACROS = {
    "diag_refcount_mismatch": ("pagedkv_diag_refcount_mismatch", ("block_table_entry",)),
    "diag_conflicting_location": (
        "pagedkv_diag_conflicting_location",
        ("block_table_entry", "swapped_block"),
    ),
    "diag_unresolved_token": ("pagedkv_diag_unresolved_token", ("virtual_token",)),
}
_TOTAL = "_pagedkv_total"
_TOP_N_MAX = 1_000_000  # DuckDB: "n value must be < 1000000" for min(x, n)


@dataclass(frozen=True)
class CheckResult:
    check: Check
    count: int
    rows: pa.Table  # the first offending rows (all, when no limit was given)
    labels: Mapping[int, str] = field(default_factory=dict)  # seq_id -> request id

    @property
    def findings(self) -> list[ViewFinding]:
        """The first offending rows as the house's findings (``findings.Finding``)."""
        return [view_finding(self.check, row, self.labels) for row in self.rows.to_pylist()]

    def __repr__(self) -> str:
        return f"CheckResult({self.name!r}, {self.severity!r}, count={self.count})"

    @property
    def name(self) -> str:
        return self.check.name

    @property
    def severity(self) -> str:
        return self.check.severity

    @property
    def invariant(self) -> str:
        """The catalogue's name of the idea the check checks (pagedkv_sql/invariants.py)."""
        return self.check.invariant

    @property
    def label(self) -> str:
        """How it is printed: the idea, then the check (``invariants.name_of``)."""
        return invariants.name_of(self.check.model, self.check.name)

    @property
    def violations(self) -> list[Violation]:
        columns = [c for c in self.rows.column_names if c != "reason"]
        relation = self.check.relation or self.check.name.removeprefix("diag_")
        return [
            Violation(self.check.name, relation, {c: row[c] for c in columns}, row["reason"])
            for row in self.rows.to_pylist()
        ]


def _model(view: str) -> str:
    """The model of a discovered view: the engine's (``diag_engine_*``, sql/engines.sql), else
    another capability's (its views' prefix: ``diag_NAME_*``)."""
    return ENGINE if view.startswith("diag_engine_") else _capability_of(view)


def _order(result: CheckResult) -> tuple[bool, int]:
    """Errors first, then cause before consequence (the catalogue's rank)."""
    return (result.severity != "error", invariants.rank_of(result.check.model, result.name))


@dataclass(frozen=True)
class CheckReport:
    """Every check's result, errors first, then by the catalogue's rank (a cause before the
    checks that find its consequences)."""

    results: list[CheckResult] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.results.sort(key=_order)

    def __repr__(self) -> str:
        found = ", ".join(f"{r.name}={r.count}" for r in self.results if r.count)
        return (
            f"CheckReport(errors={self.errors}, warnings={self.warnings}"
            f"{', ' + found if found else ''})"
        )

    @property
    def errors(self) -> int:
        """Offending rows of the spec's constraints."""
        return sum(r.count for r in self.results if r.severity == "error")

    @property
    def warnings(self) -> int:
        """Findings of the diagnostics."""
        return sum(r.count for r in self.results if r.severity == "warning")

    def violations(self) -> pa.Table:
        """Every offending row of every check as one table: check, severity, row (JSON),
        reason, then the finding's own columns: invariant, model, request_ids, block_ids."""
        import json

        rows = []
        for result in self.results:
            for f in result.findings:
                row = json.dumps(dict(f.row))
                ids = (list(f.request_ids), list(f.block_ids))
                rows.append((f.check, result.severity, row, f.message, f.model, *ids))
        from .output import json_text_field

        names = ["check", "severity", "row", "reason"]
        fields = [json_text_field(n) if n == "row" else pa.field(n, pa.string()) for n in names]
        columns = [pa.array([r[i] for r in rows], pa.string()) for i in range(len(names))]
        fields += [
            pa.field("invariant", pa.string()),
            pa.field("model", pa.string()),
            pa.field("request_ids", pa.list_(pa.string())),
            pa.field("block_ids", pa.list_(pa.int64())),
        ]
        columns += [
            pa.array([findings.idea(r[4], r[0]) for r in rows], pa.string()),
            pa.array([r[4] for r in rows], pa.string()),
            pa.array([r[5] for r in rows], pa.list_(pa.string())),
            pa.array([r[6] for r in rows], pa.list_(pa.int64())),
        ]
        return pa.Table.from_arrays(columns, schema=pa.schema(fields))

    def ok(self, strict: bool = False) -> bool:
        """No errors (and, when ``strict``, no warnings)."""
        return self.errors == 0 and (not strict or self.warnings == 0)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data, what ``check --format json`` prints."""
        return {
            "errors": self.errors,
            "warnings": self.warnings,
            "checks": [
                {
                    "name": r.name,
                    "invariant": r.invariant,
                    "severity": r.severity,
                    "description": r.check.description,
                    "count": r.count,
                    "rows": r.rows.to_pylist(),
                    "findings": [findings.record(f) for f in r.findings],
                }
                for r in self.results
            ],
        }


@cache
def all_checks() -> tuple[Check, ...]:
    checks = []
    for stmt in statements_in("constraints.sql"):
        if stmt.name.startswith("spec_"):
            match = _SPEC_RELATION.search(stmt.sql)
            relation = match.group(1) if match else None
            checks.append(Check(stmt.name, "error", stmt.doc, relation, SPEC))
        elif stmt.name.startswith("diag_"):
            checks.append(Check(stmt.name, "warning", stmt.doc, None, SPEC))
    return tuple(checks)


def discovered_checks(con: duckdb.DuckDBPyConnection) -> list[Check]:
    """Warnings that a capability added to this database: every view named ``diag_*``
    that constraints.sql does not define (e.g. the engine invariants an ``import``
    creates), its description the view's comment. The core imports no capability. A view
    kept under a check's old name (``invariants.RENAMED_VIEWS``) is not run again."""
    known = {c.name for c in all_checks()} | set(RENAMED_VIEWS)
    rows = run(
        con,
        "SELECT view_name, coalesce(comment, '') FROM duckdb_views() "
        "WHERE NOT internal AND NOT temporary AND starts_with(view_name, 'diag_') "
        "ORDER BY view_name",
    )
    return [
        Check(name, "warning", doc, None, _model(name)) for name, doc in rows if name not in known
    ]


def idle_capabilities(con: duckdb.DuckDBPyConnection, names: set[str]) -> set[str]:
    """Those of the capabilities ``names`` whose data is gone. A capability NAME keeps its
    facts in tables ``NAME_*`` (an engine import: ``engine_*``); when it has such tables
    and every one is empty (a plain ``load`` replaced the imported state), its checks
    ``diag_NAME_*`` have nothing to look at and are not run (docs/decisions.md)."""
    tables = run(con, "SELECT table_name FROM duckdb_tables() WHERE NOT internal AND NOT temporary")
    held: dict[str, bool] = {}
    for (table,) in tables:
        prefix = table.partition("_")[0]
        if prefix in names and "_" in table and not held.get(prefix):
            held[prefix] = bool(scalar(con, f'SELECT EXISTS (SELECT 1 FROM "{table}")'))
    return {prefix for prefix, has_rows in held.items() if not has_rows}


def _capability(check: Check) -> str:
    """The capability a discovered check belongs to: ``diag_engine_free_count`` -> engine."""
    return _capability_of(check.name)


def _capability_of(view: str) -> str:
    return view.removeprefix("diag_").partition("_")[0]


def spec_checks() -> list[Check]:
    return [c for c in all_checks() if c.severity == "error"]


def staged_violations(
    con: duckdb.DuckDBPyConnection,
    relation: str,
    stage: str,
    limit: int,
    locate: Callable[[set[tuple[int, ...]]], dict[tuple[int, ...], list[str]]],
) -> tuple[int, list[Violation]]:
    """Run the spec's checks for ``relation`` on the rows staged in table ``stage``: the
    number of offending rows, and the first ``limit`` of each check as Violations, located
    by ``locate`` (offending keys -> where each came from)."""
    columns = INPUT_RELATIONS[relation]
    total = 0
    found: list[Violation] = []
    for check in spec_checks():
        if check.relation != relation:
            continue
        source = f"pagedkv_{check.name}('{stage}')"
        counted = run(con, _counted_sample(source, int(limit)))  # one pass, bounded memory
        if not counted:
            continue
        total += int(counted[0][-1])
        rows = [r[:-1] for r in counted]
        where = locate({tuple(r[: len(columns)]) for r in rows})
        for r in rows:
            key = tuple(r[: len(columns)])
            values = dict(zip(columns, key, strict=True))
            found.append(Violation(check.name, relation, values, r[-1], tuple(where.get(key, ()))))
    return total, found


def diagnose(
    con: duckdb.DuckDBPyConnection, *, diagnostics: bool, strict: bool, what: str
) -> list[CheckResult]:
    """The warnings found after writing (inside the writer's transaction): none when
    diagnostics are off; under ``strict`` any warning refuses the write (``what``:
    "load", "import"...) with a ConstraintError naming every finding."""
    if not (diagnostics or strict):
        return []
    warnings = [r for r in run_checks(con, severity="warning") if r.count]
    if strict and warnings:
        total = sum(r.count for r in warnings)
        raise ConstraintError(
            f"refused under --strict: {total} diagnostic finding(s) in {len(warnings)} "
            f"check(s); nothing was {what}ed",
            [v for r in warnings for v in r.violations],
            total,
            hint=f"run `pagedkv-sql check` after a plain {what} to inspect them",
        )
    return warnings


def run_checks(
    con: duckdb.DuckDBPyConnection,
    *,
    severity: str | None = None,
    block_size: int | None = None,
    limit: int | None = 100,
) -> list[CheckResult]:
    """Run the checks (those of ``severity``, or all): each finding's total and its first
    ``limit`` rows (all when None), in order. One query a check: the view runs once, its
    rows are materialized, then counted and the first ones fetched."""
    if block_size is None:
        # the macro with a constant block size plans as a filter; the view's subquery
        # for the setting would make it a nested-loop join (see docs/performance.md)
        block_size = stored_block_size(con)
    proven: dict[str, bool] = {}

    def keys_unique(relation: str) -> str:
        """One streaming pass proves the relation's keys unique (or cannot): a constant
        for the macro, so the planner drops the grouping it makes needless."""
        if relation not in proven:
            keys = "pagedkv_token_keys" if relation == "virtual_token" else relation
            sql = f"SELECT ascending FROM pagedkv_block_keys_ascending('{keys}')"
            proven[relation] = bool(scalar(con, sql))
        return "true" if proven[relation] else "false"

    results = []
    discovered = discovered_checks(con)
    if discovered:
        idle = idle_capabilities(con, {_capability(c) for c in discovered})
        discovered = [c for c in discovered if _capability(c) not in idle]
    for check in (*all_checks(), *discovered):
        if severity is not None and check.severity != severity:
            continue
        source = check.name
        params: list[Any] = []
        if check.name in _BLOCK_SIZE_MACROS:
            source, params = f"{_BLOCK_SIZE_MACROS[check.name]}(?)", [block_size]
        elif check.name in _KEY_PROOF_MACROS:
            macro, relations = _KEY_PROOF_MACROS[check.name]
            source = f"{macro}({', '.join(keys_unique(r) for r in relations)})"
        if limit == 0:
            total = int(scalar(con, f"SELECT count(*) FROM {source}", params))
            rows = con.sql(f"SELECT * FROM {source} LIMIT 0", params=params).to_arrow_table()
        else:
            table = con.sql(_counted_sample(source, limit), params=params).to_arrow_table()
            total = table.column(_TOTAL)[0].as_py() if table.num_rows else 0
            rows = table.drop_columns([_TOTAL])
        results.append(
            CheckResult(check, total, label_requests(con, rows), _labels(con, check, rows))
        )
    return results


def _labels(con: duckdb.DuckDBPyConnection, check: Check, rows: pa.Table) -> dict[int, str]:
    """The request ids of the sequences the rows name in their declared columns."""
    if not rows.num_rows or not set(VIEW_IDS.get(check.name, ((), ()))[0]) & set(SEQUENCE_COLUMNS):
        return {}
    names = [c for c in SEQUENCE_COLUMNS if c in rows.column_names]
    seqs = [s for row in rows.select(names).to_pylist() for s in sequences(check.name, row)]
    return request_labels(con, seqs)


def _counted_sample(source: str, limit: int | None) -> str:
    """The query of one check's findings: their total (column ``_TOTAL`` on each row) and
    the first ``limit`` of them in ``ORDER BY ALL`` order (all when None). With a limit it
    is one streaming pass in bounded memory, whatever the number of findings: count(*) and
    ``min(row, limit)`` (a top-N heap of whole rows; a row struct compares as ORDER BY ALL
    sorts) in one aggregate, instead of materializing every finding to sort it."""
    if limit is None or limit >= _TOP_N_MAX:
        # every row, or more than DuckDB's min(x, n) takes: they are returned (held in
        # memory) anyway, so sorting them all costs no more than the answer itself
        cap = "" if limit is None else f" LIMIT {int(limit)}"
        return (
            f"WITH found AS MATERIALIZED (SELECT * FROM {source}) "
            f"SELECT *, (SELECT count(*) FROM found) AS {_TOTAL} "
            f"FROM (SELECT * FROM found ORDER BY ALL{cap})"
        )
    return (
        f"WITH agg AS (SELECT count(*) AS total, min(found, {int(limit)}) AS first "
        f"FROM (SELECT * FROM {source}) AS found) "
        f"SELECT r.*, total AS {_TOTAL} FROM (SELECT unnest(first) AS r, total FROM agg)"
    )


LABEL_VIEW = "pagedkv_request_label"  # (seq_id, request_id), created by a capability


def request_labels(con: duckdb.DuckDBPyConnection, seq_ids: list[int]) -> dict[int, str]:
    """The request id of each seq_id, when a capability (an engine import) named them in
    a view ``pagedkv_request_label``; empty otherwise."""
    if not seq_ids:
        return {}
    if not scalar(con, "SELECT count(*) FROM duckdb_views() WHERE view_name = ?", [LABEL_VIEW]):
        return {}
    rows = run(
        con,
        f"SELECT seq_id, request_id FROM {LABEL_VIEW} WHERE seq_id IN (SELECT unnest(?::BIGINT[]))",
        [sorted(set(seq_ids))],
    )
    return {int(s): str(r) for s, r in rows}


def label_stream(
    con: duckdb.DuckDBPyConnection, reader: pa.RecordBatchReader
) -> pa.RecordBatchReader:
    """``reader`` with a request_id column after seq_id, when requests are named."""
    if not scalar(con, "SELECT count(*) FROM duckdb_views() WHERE view_name = ?", [LABEL_VIEW]):
        return reader
    labels = dict(run(con, f"SELECT seq_id, request_id FROM {LABEL_VIEW}"))
    names = reader.schema.names
    at = names.index("seq_id") + 1
    schema = reader.schema.insert(at, pa.field("request_id", pa.string()))

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in reader:
            ids = pa.array([labels.get(i) for i in batch.column("seq_id").to_pylist()], pa.string())
            columns = batch.columns
            columns.insert(at, ids)
            yield pa.RecordBatch.from_arrays(columns, schema=schema)

    return pa.RecordBatchReader.from_batches(schema, batches())


def label_requests(con: duckdb.DuckDBPyConnection, rows: pa.Table) -> pa.Table:
    """Add a request_id column after a seq_id (or block_table_id) column that lacks one."""
    names = rows.column_names
    key = next((k for k in ("seq_id", "block_table_id") if k in names), None)
    if key is None or "request_id" in names:
        return rows
    ids = rows.column(key).to_pylist()
    labels = request_labels(con, [i for i in ids if i is not None])
    if not labels:
        return rows
    column = pa.array([labels.get(i) for i in ids], pa.string())
    return rows.add_column(names.index(key) + 1, "request_id", column)
