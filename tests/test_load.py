"""load.py: what a load reports, its stages, and what it refuses."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql import UsageError, sources
from pagedkv_sql.errors import ConstraintError, InputError, Problem

from .helpers import DATA, Cli, arrow_table, loaded, seed_state, snapshot, unresolved, write_facts


def test_loading_files_leaves_no_file_descriptor_open(tmp_path: Path) -> None:
    """DuckDB reads each file through /proc/self/fd/N: every N is closed after the load,
    whether it succeeded or was refused."""
    import os

    good = write_facts(
        tmp_path / "good", {"root_table": [(1, 100)], "swapped_block": [(100, 0, 256)]}
    )
    bad = tmp_path / "bad" / "root_table.facts"
    bad.parent.mkdir()
    bad.write_text("1\tx\n")
    with pagedkv_sql.connect(":memory:") as db:
        db.load(good)
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(3):
            db.load(good)
            with pytest.raises(InputError):
                db.load(bad)
        assert len(os.listdir("/proc/self/fd")) == before


def test_a_refused_arrow_table_counts_one_problem(db: pagedkv_sql.Database) -> None:
    table = pa.table({"seq_id": pa.array([1, None], pa.int64()), "block_table_ptr": [1, 2]})
    with pytest.raises(InputError) as e:
        db.load_arrow("root_table", table)
    assert str(e.value).startswith(
        "1 malformed value(s) or line(s) in <arrow root_table>; nothing was loaded"
    )
    assert e.value.total == 1


def test_a_good_arrow_source_beside_a_bad_text_file_adds_no_problem(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(arrow_table("root_table", [(1, 100)]), tmp_path / "root_table.parquet")
    (tmp_path / "swapped_block.facts").write_text("100\t0\tx\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(tmp_path)
    assert e.value.total == 1
    assert str(e.value).startswith("1 malformed value(s) or line(s) in ")


def _report(report: Any) -> list[tuple[Any, ...]]:
    return [
        (r.relation, r.source, r.mode, r.rows_read, r.duplicates_dropped, r.rows_total)
        for r in report.relations
    ]


def test_a_load_reports_each_relation_read_dropped_and_kept(tmp_path: Path) -> None:
    """Keys out of order but unique, keys repeated with other values, an exact duplicate
    and an empty file: only the exact duplicate is dropped."""
    data = tmp_path / "d"
    data.mkdir()
    (data / "root_table.facts").write_text("2\t20\n1\t10\n")
    (data / "swapped_block.facts").write_text("100\t0\t512\n100\t0\t256\n")
    (data / "block_table_entry.facts").write_text("10\t0\t256\t1\n10\t0\t256\t1\n")
    (data / "virtual_token.facts").write_text("")
    with pagedkv_sql.connect(":memory:") as db:
        report = db.load(data)
        assert _report(report) == [
            ("root_table", str(data / "root_table.facts"), "replaced", 2, 0, 2),
            ("block_table_entry", str(data / "block_table_entry.facts"), "replaced", 2, 1, 1),
            ("virtual_token", str(data / "virtual_token.facts"), "replaced", 0, 0, 0),
            ("swapped_block", str(data / "swapped_block.facts"), "replaced", 2, 0, 2),
        ]
        with pytest.raises(dataclasses.FrozenInstanceError):
            report.relations[0].rows_total = 0  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            report.warnings = []  # type: ignore[misc]
        (data / "swapped_block.facts").unlink()
        report = db.load(data)
        assert _report(report)[3] == ("swapped_block", None, "kept", 0, 0, 2)
        report = db.load(data, empty_missing=True)
        assert _report(report)[3] == ("swapped_block", None, "emptied", 0, 0, 0)
        report = db.load(data / "root_table.facts", append=True)
        assert _report(report) == [
            ("root_table", str(data / "root_table.facts"), "appended", 2, 2, 2)
        ]


def test_a_load_tells_its_stages_and_looks_closer_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_facts(tmp_path / "d", {"root_table": [(1, 100)]})
    with pagedkv_sql.connect(":memory:") as db:
        stages: list[tuple[str, bool]] = []
        monkeypatch.setattr(
            db, "_begin_stage", lambda label, measured: stages.append((label, measured))
        )
        read = ("read and check root_table", True)
        for options, expected in [
            ({}, [read, ("diagnostics", False), ("write", False)]),
            ({"diagnostics": False}, [read, ("write", False)]),
            (
                {"diagnostics": False, "strict": True},
                [read, ("diagnostics", False), ("write", False)],
            ),
        ]:
            stages.clear()
            db.load(data, **options)
            assert stages == expected, options
        (data / "root_table.facts").write_text("1\tx\n")
        stages.clear()
        with pytest.raises(InputError):
            db.load(data)
        assert stages == [read, ("find what was refused", False)]
        assert db.stage() is None


def _trtllm(rows: list[list[int | None]], lengths: list[int]) -> Any:
    """A TensorRT-LLM snapshot of one pool (16 tokens a block, 2 layers): each row a
    request's primary blocks, None for a placeholder."""
    from pagedkv_sql.engines import trtllm

    offsets = np.zeros((1, len(rows), 2, 4), dtype=np.int32)
    for r, blocks in enumerate(rows):
        for b, block in enumerate(blocks):
            k = -1 if block is None else block * 2 * 2
            offsets[0, r, 0, b], offsets[0, r, 1, b] = k, -1 if block is None else k + 1
    ids = [f"req{i}" for i in range(len(rows))]
    return trtllm.snapshot(offsets, np.array(lengths, np.int32), 16, 2, request_ids=ids)


def test_an_import_warns_by_default_and_a_replacing_load_empties_its_engine_tables() -> None:
    engine_rows = "SELECT count(*) FROM engine_block_table"
    with pagedkv_sql.connect(":memory:") as db:
        report = db.load_engine(_trtllm([[1, None]], [20]))  # a placeholder: a page fault
        assert [(w.name, w.count) for w in report.warnings] == [("diag_unresolved_token", 4)]
        held = db.sql(engine_rows).fetchall()
        assert held != [(0,)]
        db.load(DATA / "root_table.facts", append=True)
        assert db.sql(engine_rows).fetchall() == held
        db.load(DATA / "root_table.facts")
        assert db.sql(engine_rows).fetchall() == [(0,)]


def test_problems_of_several_files_are_capped_at_a_thousand_and_all_counted(
    tmp_path: Path,
) -> None:
    for name in ("root_table", "swapped_block"):
        (tmp_path / f"{name}.facts").write_text("x\n" * 600)
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(tmp_path)
    assert (len(e.value.problems), e.value.total) == (1000, 1200)


def test_a_load_locates_ten_thousand_violations_and_counts_all(tmp_path: Path) -> None:
    bte = tmp_path / "block_table_entry.facts"
    bte.write_text("".join(f"1\t{i}\t{i * 256 + 1}\t1\n" for i in range(10_001)))
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(ConstraintError) as e:
        db.load(bte)
    assert (len(e.value.violations), e.value.total) == (10_000, 10_001)


def _reader(relation: str, rows: list[tuple[int, ...]]) -> pa.RecordBatchReader:
    table = arrow_table(relation, rows)
    return pa.RecordBatchReader.from_batches(table.schema, table.to_batches())


def test_a_violation_in_a_file_loaded_after_a_stream_is_located(tmp_path: Path) -> None:
    """A stream (read once) is checked as it is staged; the files after it are still
    staged and checked when the load is refused, and their offending lines named."""
    from pagedkv_sql.load import load_sources

    bte = tmp_path / "block_table_entry.facts"
    bte.write_text("1\t0\t256\t1\n1\t1\t257\t1\n")
    with pagedkv_sql.connect(":memory:") as db:
        cur = db.con.cursor()
        given = [
            sources.arrow_source("root_table", _reader("root_table", [(1, 1)]), "<reader>"),
            *sources.discover([str(bte)], None, None, None).sources,
        ]
        with pytest.raises(ConstraintError) as e:
            load_sources(cur, given, append=False, strict=False, diagnostics=True)
        cur.close()
    assert e.value.total == 1
    assert [(v.relation, v.locations) for v in e.value.violations] == [
        ("block_table_entry", (f"{bte}:2",))
    ]


def test_load_sources_leaves_no_staging_table_on_its_connection() -> None:
    from pagedkv_sql.load import load_sources

    with pagedkv_sql.connect(":memory:") as db:
        cur = db.con.cursor()
        reader = _reader("root_table", [(1, 100)])
        load_sources(
            cur,
            [sources.arrow_source("root_table", reader, "<reader>")],
            append=False,
            strict=False,
            diagnostics=True,
        )
        left = "SELECT count(*) FROM duckdb_tables() WHERE table_name LIKE '_pagedkv%'"
        assert cur.execute(left).fetchall() == [(0,)]
        assert cur.execute("SELECT * FROM root_table").fetchall() == [(1, 100)]
        cur.close()


def test_a_source_that_switches_to_its_fallback_reader_is_loaded_by_a_second_attempt() -> None:
    """The load's side of a switch (sources.py decides when DuckDB's reader refuses what
    our grammar accepts): the first attempt is rolled back and the whole load runs again."""
    from pagedkv_sql.load import load_sources

    @dataclasses.dataclass
    class Switching(sources.Source):
        diagnosed: int = 0

        def scan_sql(self, con: duckdb.DuckDBPyConnection) -> str:
            if self.fallback:
                return "SELECT 1::BIGINT AS seq_id, 100::BIGINT AS block_table_ptr"
            return "SELECT error('the bulk reader refused it')::BIGINT AS seq_id, 1 AS p"

        def diagnose(self, con: duckdb.DuckDBPyConnection) -> tuple[int, list[Problem]]:
            self.diagnosed += 1
            self.fallback = True
            return 0, []

    with pagedkv_sql.connect(":memory:") as db:
        cur = db.con.cursor()
        source = Switching("root_table", "<switching>")
        report = load_sources(cur, [source], append=False, strict=False, diagnostics=True)
        assert [(r.relation, r.rows_read) for r in report.relations] == [("root_table", 1)]
        assert source.diagnosed == 1
        assert cur.execute("SELECT * FROM root_table").fetchall() == [(1, 100)]
        cur.close()


def test_a_file_the_bulk_reader_refuses_and_the_grammar_takes_switches_to_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("1\t100\n")
    (source,) = sources.discover([str(f)], None, None, None).sources
    refused = (1, [Problem(str(f), None, None, "DuckDB refused it")])
    monkeypatch.setattr(sources.Source, "diagnose", lambda self, con: refused)
    with pagedkv_sql.connect(":memory:") as db, caplog.at_level(logging.WARNING):
        assert source.diagnose(db.con) == (0, [])
    assert source.fallback is True
    assert "the bulk reader refused it; reading it in Python" in caplog.text
    source.close()


def test_a_load_leaves_no_descriptor_open(tmp_path: Path) -> None:
    data = write_facts(tmp_path / "d", {"root_table": [(1, 100)], "virtual_token": [(1, 0, 0, 0)]})
    with pagedkv_sql.connect(":memory:") as db:
        db.load(data)  # the first load opens what stays open (DuckDB's own files)
        before = sorted(os.listdir("/proc/self/fd"))
        db.load(data)
        with pytest.raises(InputError):
            db.load(
                write_facts(tmp_path / "bad", {"root_table": [(1, 100)]}, "csv") / "root_table.csv",
                format="facts",
            )
        assert sorted(os.listdir("/proc/self/fd")) == before


def test_strict_refusal_lists_a_hundred_findings_of_a_check_and_counts_all() -> None:
    """Under --strict the diagnostics refuse the load; the error names the first hundred
    rows of each check (the rest are counted)."""
    tokens = arrow_table("virtual_token", [(9, i, i // 16, i % 16) for i in range(101)])
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(pagedkv_sql.ConstraintError) as e:
        db.load_arrow("virtual_token", tokens, strict=True)
    assert e.value.total == 101
    assert len(e.value.violations) == 100


def test_append_adds_and_replace_replaces(db: pagedkv_sql.Database, tmp_path: Path) -> None:
    db.load(DATA)
    extra = tmp_path / "root_table.facts"
    extra.write_text("3\t102\n1\t100\n")
    report = db.load(extra, append=True)
    assert report.relations[0].rows_total == 3
    assert report.relations[0].duplicates_dropped == 1
    assert len(db.reader("virtual_token").read_all()) == 8
    db.load(extra)
    assert db.sql("SELECT * FROM root_table ORDER BY ALL").to_arrow_table().to_pylist() == [
        {"seq_id": 1, "block_table_ptr": 100},
        {"seq_id": 3, "block_table_ptr": 102},
    ]
    assert db.sql("SELECT count(*) AS n FROM virtual_token").to_arrow_table().to_pylist() == [
        {"n": 8}
    ]


def test_load_replaces_warns_and_does_not_refuse_by_default(tmp_path: Path) -> None:
    data = write_facts(tmp_path / "d", unresolved(3))
    with pagedkv_sql.connect(":memory:") as db:
        db.load(write_facts(tmp_path / "first", unresolved(5)))
        report = db.load(data)  # replaces what was there
        assert [(r.relation, r.mode, r.rows_total) for r in report.relations] == [
            ("root_table", "kept", 0),
            ("block_table_entry", "kept", 0),
            ("virtual_token", "replaced", 3),
            ("swapped_block", "kept", 0),
        ]
        assert [(w.name, w.count) for w in report.warnings] == [("diag_unresolved_token", 3)]
        arrow = db.load_arrow(
            "virtual_token", arrow_table("virtual_token", unresolved(2)["virtual_token"])
        )
        assert [(w.name, w.count) for w in arrow.warnings] == [("diag_unresolved_token", 2)]
        assert [(r.relation, r.mode) for r in arrow.relations] == [("virtual_token", "replaced")]
        assert db.sql("SELECT count(*) FROM virtual_token").fetchall() == [(2,)]


def test_relation_name_never_reaches_sql_unchecked(tmp_path: Path) -> None:
    f = tmp_path / "x.facts"
    f.write_text("1\t2\n")
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(UsageError, match="unknown relation"):
        db.load(f, relation="root_table; DROP TABLE root_table")


def test_a_directory_load_keeps_relations_without_a_file_unless_asked(cli: Cli) -> None:
    path = loaded(cli)
    d = cli.cwd / "part"
    d.mkdir()
    (d / "root_table.facts").write_text("7\t700\n")
    result: Any = cli("load", "part")
    assert result.exit_code == 0
    assert "swapped_block         1  -     -           kept      (no file: kept)" in result.stderr
    state = snapshot(path)
    assert state["root_table"] == [(7, 700)]
    assert state["swapped_block"] == seed_state()["swapped_block"]
    result = cli("load", "part", "--empty-missing")
    assert result.exit_code == 0
    assert "(no file: emptied)" in result.stderr
    assert snapshot(path) == {
        "root_table": [(7, 700)],
        "block_table_entry": [],
        "virtual_token": [],
        "swapped_block": [],
    }


def test_many_bad_lines_keep_only_what_is_printed(tmp_path: Path) -> None:
    f = tmp_path / "root_table.facts"
    f.write_text("x\ty\n" * 200_000)
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(f)
    assert e.value.total == 200_000
    assert len(e.value.problems) == 1000
    dl = tmp_path / "x.dl"
    dl.write_text("root_table(x, y).\n" * 50_000)
    with pagedkv_sql.connect(":memory:") as db, pytest.raises(InputError) as e:
        db.load(dl)
    assert (e.value.total, len(e.value.problems)) == (50_000, 1000)
