"""`fleet check`: a fleet directory read into sql/fleet.sql's tables, its views run, the
findings in the house shape (``FleetFinding``) and the per-router summary (``FleetReport``).

The door is ``check(db, directory, lag=...)`` (exported by ``pagedkv_sql.fleet``); the
tables are written through ``db.cursor(..., write=True)`` and stay in the database (a
``--db`` file keeps them for ``sql``)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from . import tables

if TYPE_CHECKING:
    from ..database import Database

MODEL = "fleet"
DEFAULT_LAG = 0.0  # seconds: a simulated fleet is compared at the same instant
CHECKS = ("false_residency", "missed_residency", "prefix_false_hit", "misroute")
UPSTREAM = {"duplicate_copy_removed": "vllm #55092", "restart_without_clear": "llm-d-router #2853"}


def hash_text(value: int | None) -> str | None:
    """A stored hash as the files write it: vLLM's unsigned integer, in decimal."""
    return None if value is None else str(value + (1 << 64) if value < 0 else value)


@dataclass(frozen=True)
class FleetFinding:
    """One finding of `fleet check` (findings.Finding): a residency mismatch or a decision."""

    check: str
    where: str
    message: str
    cause: str | None
    replica: str
    router: str | None
    hash: str | None
    fault: str
    request_ids: tuple[str, ...] = ()
    block_ids: tuple[int, ...] = ()
    stage: str | None = None
    t_from: float | None = None
    t_to: float | None = None
    model: str = MODEL
    best: str | None = None  # a misroute: the replica with the longest true hit

    def extra(self) -> Mapping[str, Any]:
        return {
            "replica": self.replica,
            "router": self.router,
            "hash": self.hash,
            "fault": self.fault,
            "stage": self.stage,
            "t_from": self.t_from,
            "t_to": self.t_to,
        }


@dataclass
class FleetReport:
    """What `fleet check` found: the summary a router, then the findings in time order."""

    directory: str
    lag: float
    summary: list[dict[str, Any]] = field(default_factory=list)
    findings: list[FleetFinding] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # rows of each input table
    misroute_checked: bool = False


def check_lag(lag: Any) -> float:
    if (
        isinstance(lag, bool)
        or not isinstance(lag, int | float)
        or not math.isfinite(lag)
        or lag < 0
    ):
        raise UsageError(f"lag {lag!r} must be a number of seconds, 0 or more", hint="--lag 0.5")
    return float(lag)


def _span(t_from: float, t_to: float, censored: bool) -> str:
    held = "to the end of the run (never healed)" if censored else f"until t={t_to:g}s"
    return f"from t={t_from:g}s {held}"


def _residency(check: str, row: tuple[Any, ...]) -> FleetFinding:
    stage, router, replica, part, h, t_from, t_to, censored, cause, fault = row
    text = hash_text(h)
    on = f" (group {part})" if stage == "engine" else f" on replica {replica}"
    if stage == "engine" and check == "false_residency":
        what = (
            f"replica {replica}'s events claim block hash {text}{on} that its step log "
            "does not hold"
        )
    elif stage == "engine":
        what = (
            f"replica {replica}'s step log holds block hash {text}{on} that its events do not claim"
        )
    elif check == "false_residency":
        what = f"router {router}'s index claims block hash {text}{on} that its events do not claim"
    else:
        what = (
            f"replica {replica}'s events claim block hash {text} that router {router}'s index lacks"
        )
    note = f"; {UPSTREAM[cause]}" if cause in UPSTREAM else ""
    return FleetFinding(
        check,
        f"t={t_from:g}s",
        f"{what}, {_span(t_from, t_to, censored)}{note}",
        cause,
        replica,
        router or None,
        text,
        fault,
        stage=stage,
        t_from=t_from,
        t_to=t_to,
    )


def _false_hit(row: tuple[Any, ...]) -> FleetFinding:
    request, router, t, chosen, predicted, hit, cause, hybrid = row
    stage = "hybrid" if hybrid else None  # a hybrid model's hit, the request's hashes unknown
    message = (
        f"router {router} predicted {predicted} cached block(s) of request {request} on "
        f"replica {chosen}; a lookup there hits {hit}"
    )
    return FleetFinding(
        "prefix_false_hit",
        f"t={t:g}s",
        message,
        cause,
        chosen,
        router,
        None,
        "router",
        (request,),
        stage=stage,
        t_from=t,
    )


def _misroute(row: tuple[Any, ...]) -> FleetFinding:
    request, router, t, chosen, hit, best, best_blocks, reason, cause = row
    message = (
        f"router {router} sent request {request} to replica {chosen} (true hit {hit} "
        f"block(s), chosen by {reason}); replica {best} held {best_blocks}"
    )
    return FleetFinding(
        "misroute",
        f"t={t:g}s",
        message,
        cause,
        chosen,
        router,
        None,
        "router",
        (request,),
        t_from=t,
        best=best,
    )


def _inherit(found: list[FleetFinding], residency: list[FleetFinding]) -> list[FleetFinding]:
    """A decision's cause and fault: the residency finding on its replica (a misroute's: or
    on the replica it passed over) that was open at its time, if one is (engine findings
    first, as the comparison goes)."""
    out = []
    for f in found:
        if f.cause is None:
            for r in residency:
                if (
                    r.replica in (f.replica, f.best)
                    and r.cause
                    and r.t_from is not None
                    and r.t_to is not None
                    and f.t_from is not None
                    and r.t_from <= f.t_from < r.t_to
                ):
                    f = FleetFinding(**{**f.__dict__, "cause": r.cause, "fault": r.fault})
                    break
        if f.cause is None and f.stage == "hybrid":  # the index on the full group alone
            f = FleetFinding(**{**f.__dict__, "cause": "unindexed_group"})
        out.append(f)
    return out


def check(
    db: Database, directory: str | os.PathLike[str], *, lag: float = DEFAULT_LAG
) -> FleetReport:
    """Read the fleet directory into ``db`` (its fleet_* tables replaced) and run every
    check: the residency of each replica's events against its truth (fault ``engine``),
    of each router's index against the events (fault ``router``), each routing decision
    against the truth at its time, and the summary a router (docs/fleet.md)."""
    lag = check_lag(lag)
    path = Path(directory)
    statements = tables.sql()
    report = FleetReport(str(path), lag)
    with db.cursor("fleet check", write=True) as cur:
        tables.load(cur, path)
        cur.execute("DELETE FROM fleet_lag")
        cur.execute("INSERT INTO fleet_lag VALUES (?)", [lag])
        cur.execute(statements["fleet_views"])
        for _ in range(1000):  # a chain of stores onto a dropped parent, a link a pass
            ((changed,),) = cur.execute(statements["fleet_inherit_cause"]).fetchall()
            if not changed:
                break
        for name in ("fleet_event", "fleet_truth", "fleet_belief", "fleet_decision"):
            report.counts[name] = cur.execute(f"SELECT count(*) FROM {name}").fetchall()[0][0]
        report.misroute_checked = bool(
            cur.execute("SELECT count(*) FROM fleet_request_hash").fetchall()[0][0]
        )

        def rows(name: str) -> tuple[list[str], list[tuple[Any, ...]]]:
            result = cur.execute(statements[name])
            return [d[0] for d in result.description], result.fetchall()

        assemble(report, rows)
    return report


def assemble(
    report: FleetReport, rows: Callable[[str], tuple[list[str], list[tuple[Any, ...]]]]
) -> None:
    """Fill ``report``'s summary and findings from the check statements' rows: ``rows(name)``
    runs sql/fleet.sql's statement ``name`` (on DuckDB, or translated on Spark) and gives its
    column names and rows."""
    residency = [_residency("false_residency", r) for r in rows("fleet_check_false_residency")[1]]
    residency += [
        _residency("missed_residency", r) for r in rows("fleet_check_missed_residency")[1]
    ]
    residency.sort(key=lambda f: (f.stage != "engine", f.t_from or 0.0))
    decisions = [_false_hit(r) for r in rows("fleet_check_prefix_false_hit")[1]]
    decisions += [_misroute(r) for r in rows("fleet_check_misroute")[1]]
    names, summary = rows("fleet_summary")
    report.summary = [dict(zip(names, r, strict=True)) for r in summary]
    report.findings = residency + _inherit(decisions, residency)
    report.findings.sort(key=lambda f: (f.t_from or 0.0, f.stage != "engine"))
