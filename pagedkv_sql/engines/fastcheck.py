"""The engine invariants in memory: every ``diag_engine_*`` view of sql/engines.sql computed
with numpy over an engine's state, no database (docs/engines.md).

The SQL views stay the reference and the report's source; this module gives the same
findings (check name, reason text, request ids, block id) in well under a millisecond for a
pool of a thousand blocks, so that a fuzzer can check every state of an engine and an
engine's own tests can ``assert_consistent`` after every step. A differential test on
random states (tests/engines/test_fastcheck.py) keeps the two equal.

Semantics follow SQL where it matters: integer ``//`` and ``%`` truncate toward zero (as
DuckDB's do), a join on duplicated keys gives one finding a pair, a missing value (NULL) is
never equal to anything.

The invariants themselves are in engines/fastcheck_rules.py (one function a view), over the
numpy columns of engines/fastcheck_state.py; this module runs them and is the API
(``Finding``, ``CHECKS`` and ``row_codes`` are re-exported from there).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import duckdb
import numpy as np

from .. import findings
from .fastcheck_rules import CHECKS
from .fastcheck_state import Finding, State, row_codes
from .registry import engine
from .snapshot import Snapshot
from .tables import EngineState

__all__ = [
    "CHECKS",
    "Finding",
    "assert_captured",
    "check_snapshot",
    "check_sql",
    "check_state",
    "describe",
    "digest",
    "row_codes",
]


def check_snapshot(snapshot: Snapshot) -> list[Finding]:
    """Every engine invariant on one snapshot, in memory. The snapshot is first mapped by
    its engine's ``to_state``, as ``engines.load`` does: a snapshot the import refuses
    raises the same ``InputError``. ``[]`` when the state is consistent."""
    return check_state(engine(snapshot.engine).to_state(snapshot))


def check_state(state: EngineState) -> list[Finding]:
    """Every engine invariant on an ``EngineState``, sorted by check, reason, ids."""
    s = State(state)
    found = [f for check in CHECKS for f in check(s)]
    found.sort(key=Finding.sort_key)
    return found


def assert_captured(what: str, capture: Callable[[], Snapshot]) -> None:
    """Capture a live engine state and check it: an ``AssertionError`` naming every finding
    (check, reason, request ids, block id), or the capture's refusal (the state cannot be
    mapped: an ``InputError``, its ``__cause__``). The body of each engine module's
    ``assert_consistent``."""
    from ..errors import InputError

    try:
        found = check_snapshot(capture())
    except InputError as e:
        details = "".join(f"\n  {d}" for d in e.details)
        raise AssertionError(f"{what} state cannot be mapped: {e.message}{details}") from e
    if found:
        raise AssertionError(describe(what, found))


def describe(what: str, found: list[Finding]) -> str:
    """Findings as an assertion message: a count, then one line each."""
    lines = [f"{what} is inconsistent: {len(found)} finding(s)"]
    lines += [f"  {findings.line(f)}" for f in found]
    return "\n".join(lines)


def check_sql(con: duckdb.DuckDBPyConnection) -> list[Finding]:
    """The same findings from the stored engine tables through the SQL views, in one
    query (view ``engine_findings``): the reference the fast check is tested against."""
    rows = con.execute(
        "SELECT check_name, reason, request_ids, block_id FROM engine_findings"
    ).fetchall()
    found = [
        Finding(check, reason, tuple(sorted(ids)), None if block is None else int(block))
        for check, reason, ids, block in rows
    ]
    found.sort(key=Finding.sort_key)
    return found


def digest(snapshot: Snapshot) -> str:
    """A digest of everything a check reads (engine, arrays' dtypes, shapes and bytes, the
    metadata): equal digests, equal findings. For memoizing the checks of states that
    repeat (a fuzzer revisits most of its states)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(snapshot.engine.encode())
    for name in sorted(snapshot.arrays):
        a = np.ascontiguousarray(snapshot.arrays[name])
        h.update(f"\0{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    h.update(json.dumps(snapshot.meta, sort_keys=True, default=str).encode())
    h.update(json.dumps([t.to_dict() for t in snapshot.cache_tensors], default=str).encode())
    return h.hexdigest()
