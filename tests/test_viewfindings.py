"""A check's view row as the house's finding (pagedkv_sql/viewfindings.py): every view declares
the columns that name its requests and blocks, and `check`, `check --format json` and
`violations` give those ids."""

from __future__ import annotations

import json
from typing import Any

import pagedkv_sql
from pagedkv_sql import findings, sqlfiles
from pagedkv_sql.engines.tables import write
from pagedkv_sql.viewfindings import VIEW_IDS

from .conformance import BASE_TABLES, BASE_TOKENS, engine_state
from .helpers import DATA, Cli


def _views() -> set[str]:
    spec = {
        s.name
        for s in sqlfiles.statements_in("constraints.sql")
        if s.name.startswith(("spec_", "diag_"))
    }
    engine = {s.name for s in sqlfiles.statements_in("engines.sql")}
    return spec | {n for n in engine if n.startswith("diag_engine_")}


def test_every_view_declares_its_request_and_block_columns_and_has_them() -> None:
    assert set(VIEW_IDS) == _views()
    with pagedkv_sql.connect(":memory:") as db:
        write(db.con, engine_state(BASE_TABLES, BASE_TOKENS), "<test>")
        columns: dict[str, set[str]] = {}
        for view, column in db.sql(
            "SELECT table_name, column_name FROM duckdb_columns() WHERE table_name IN "
            "(SELECT unnest(?::VARCHAR[]))",
            params=[sorted(VIEW_IDS)],
        ).fetchall():
            columns.setdefault(view, set()).add(column)
    for view, (requests, blocks) in VIEW_IDS.items():
        assert set(requests) | set(blocks) <= columns[view], view


def test_a_views_row_is_a_finding_naming_its_request_and_block(db: pagedkv_sql.Database) -> None:
    state = engine_state(BASE_TABLES, BASE_TOKENS, ref_cnt={3: 2})
    report = write(db.con, state, "<test>")
    (result,) = [r for r in report.warnings if r.name == "diag_engine_refcount_mismatch"]
    (f,) = result.findings
    assert isinstance(f, findings.Finding)
    assert (f.model, f.check, f.request_ids, f.block_ids) == (
        "engine",
        "diag_engine_refcount_mismatch",
        ("r2",),
        (3,),
    )
    assert findings.line(f) == (
        "ref_count (diag_engine_refcount_mismatch): ref_cnt 2 but 1 block-list entry hold "
        "block 3 [request r2; block 3]"
    )


def test_check_json_and_violations_carry_the_findings_ids(cli: Cli) -> None:
    assert cli("load", str(DATA)).exit_code == 0  # type: ignore[attr-defined]
    r: Any = cli("check", "--format", "json")
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    (refcount,) = checks["diag_refcount_mismatch"]["findings"]
    assert checks["diag_refcount_mismatch"]["rows"][0]["physical_block_base"] == 268435456
    assert refcount["invariant"] == "ref_count" and refcount["model"] == "spec"
    assert refcount["blocks"] == [268435456 // 256] and refcount["requests"] == []
    assert refcount["message"] == "refcount 2 but 1 holder(s)"
    assert checks["diag_overlapping_blocks"]["findings"] == []
    with pagedkv_sql.connect(cli.cwd / "pagedkv.duckdb") as db:  # type: ignore[attr-defined]
        table = db.violations()
    assert table.column_names == [
        "check",
        "severity",
        "row",
        "reason",
        "invariant",
        "model",
        "request_ids",
        "block_ids",
    ]
    rows = {r["check"]: r for r in table.to_pylist()}
    assert rows["diag_refcount_mismatch"]["block_ids"] == [1048576]
    assert rows["diag_unresolved_token"]["invariant"] == "unresolved_token"


def test_a_sequence_is_named_by_its_request_where_an_import_labels_it() -> None:
    """The spec's views name sequences; an engine import labels them with request ids."""
    import pyarrow as pa

    from pagedkv_sql.check import CheckResult
    from pagedkv_sql.invariants import Check

    check = Check("diag_unresolved_token", "warning", "", None, "spec")
    rows = pa.table({"seq_id": [1, 7], "token_pos": [0, 0], "reason": ["x", "y"]})
    result = CheckResult(check, 2, rows, {1: "chat-1"})
    assert [f.request_ids for f in result.findings] == [("chat-1",), ()]
    assert result.findings[0].extra() == {"seq_id": 1, "token_pos": 0}
