"""The spec on DuckDB: the golden seed, set semantics, the Python API."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

import pagedkv_sql
from pagedkv_sql.relations import INPUT_RELATIONS, arrow_schema

from .conftest import DATA, SEED_OUTPUT, SPEC
from .reference import resolve as reference


def tsv(table: pa.Table) -> str:
    return "".join("\t".join(map(str, r.values())) + "\n" for r in table.to_pylist())


def test_seed_resolves_to_the_golden_output(db: pagedkv_sql.Database) -> None:
    db.load(DATA)
    assert tsv(db.resolve_table()) == SEED_OUTPUT


@pytest.mark.skipif(not SPEC.exists(), reason="shared/spec is not beside the checkout")
def test_the_spec_file_itself_loads_to_the_same_state(db: pagedkv_sql.Database) -> None:
    db.load(SPEC)
    assert tsv(db.resolve_table()) == SEED_OUTPUT


def test_schema_names_match_the_spec(db: pagedkv_sql.Database) -> None:
    for relation, columns in INPUT_RELATIONS.items():
        described = db.sql(f"DESCRIBE {relation}").to_arrow_table().to_pylist()
        assert [(c["column_name"], c["column_type"], c["null"]) for c in described] == [
            (c, "BIGINT", "NO") for c in columns
        ]
    out = db.sql("DESCRIBE resolved_kv_address").to_arrow_table().to_pylist()
    assert [(c["column_name"], c["column_type"]) for c in out] == [
        ("seq_id", "BIGINT"),
        ("token_pos", "BIGINT"),
        ("physical_address", "BIGINT"),
    ]


@pytest.mark.parametrize(
    ("statement", "constraint"),
    [
        ("INSERT INTO block_table_entry VALUES (1, 0, 257, 1)", "physical_block_base % 256"),
        ("INSERT INTO block_table_entry VALUES (1, 0, 256, -1)", "refcount >= 0"),
        ("INSERT INTO virtual_token VALUES (1, 0, 0, 256)", "offset_in_block < 256"),
        ("INSERT INTO virtual_token VALUES (1, 0, 0, -1)", "offset_in_block >= 0"),
    ],
)
def test_check_clauses_refuse_bad_rows_from_plain_sql(
    db: pagedkv_sql.Database, statement: str, constraint: str
) -> None:
    with pytest.raises(duckdb.ConstraintException, match="CHECK constraint failed"):
        db.con.execute(statement)


def test_exact_duplicates_collapse_and_are_counted(
    db: pagedkv_sql.Database, facts_dir: Callable[..., Path]
) -> None:
    d = facts_dir(
        {
            "root_table": [(1, 100), (1, 100)],
            "block_table_entry": [(100, 0, 256, 1), (100, 0, 256, 1), (100, 0, 512, 1)],
            "virtual_token": [(1, 3, 0, 3), (1, 3, 0, 3)],
        }
    )
    report = db.load(d)
    by_relation = {r.relation: r for r in report.relations}
    assert by_relation["root_table"].duplicates_dropped == 1
    assert by_relation["block_table_entry"].duplicates_dropped == 1
    assert by_relation["block_table_entry"].rows_total == 2
    assert by_relation["swapped_block"].mode == "kept"
    assert db.resolve_table().to_pylist() == [
        {"seq_id": 1, "token_pos": 3, "physical_address": 259},
        {"seq_id": 1, "token_pos": 3, "physical_address": 515},
    ]


def test_resident_and_swapped_at_the_same_address_is_one_row(
    db: pagedkv_sql.Database, facts_dir: Callable[..., Path]
) -> None:
    d = facts_dir(
        {
            "root_table": [(1, 7), (1, 8)],
            "block_table_entry": [(7, 0, 1024, 1), (8, 0, 1024, 5)],
            "virtual_token": [(1, 2, 0, 2)],
            "swapped_block": [(7, 0, 1024)],
        }
    )
    db.load(d)
    assert db.resolve_table().to_pylist() == [
        {"seq_id": 1, "token_pos": 2, "physical_address": 1026}
    ]
    shell_view = db.sql("SELECT * FROM resolved_kv_address").to_arrow_table().to_pylist()
    assert shell_view == [{"seq_id": 1, "token_pos": 2, "physical_address": 1026}]


def test_cpu_address_near_2_63_wraps_like_a_64_bit_build(
    db: pagedkv_sql.Database, facts_dir: Callable[..., Path]
) -> None:
    top = 2**63 - 1
    d = facts_dir(
        {
            "root_table": [(1, 1)],
            "virtual_token": [(1, 0, 0, 5)],
            "swapped_block": [(1, 0, top)],
        }
    )
    db.load(d)
    expected = reference([(1, 1)], [], [(1, 0, 0, 5)], [(1, 0, top)])
    assert expected == [(1, 0, -(2**63) + 4)]
    assert [tuple(r.values()) for r in db.resolve_table().to_pylist()] == expected
    assert db.sql("SELECT * FROM resolved_kv_address").to_arrow_table().to_pylist()[0][
        "physical_address"
    ] == (-(2**63) + 4)
    assert db.explain(1, 0).addresses == [-(2**63) + 4]


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


def test_arrow_in_and_out(db: pagedkv_sql.Database) -> None:
    db.load(DATA)
    tokens = db.reader("virtual_token").read_all()
    assert tokens.schema == arrow_schema("virtual_token")
    other = pagedkv_sql.connect(":memory:")
    for relation in INPUT_RELATIONS:
        other.load_arrow(relation, db.reader(relation).read_all())
    assert tsv(other.resolve_table()) == SEED_OUTPUT
    reader = db.resolve()
    assert isinstance(reader, pa.RecordBatchReader)
    assert reader.schema == arrow_schema("resolved_kv_address")
    assert reader.read_all().num_rows == 7


def test_check_reports_the_two_seed_findings(db: pagedkv_sql.Database) -> None:
    db.load(DATA)
    report = db.check()
    assert report.errors == 0
    assert {r.name: r.count for r in report.results if r.count} == {
        "diag_refcount_mismatch": 1,
        "diag_unresolved_token": 1,
    }
    assert report.ok() and not report.ok(strict=True)


def test_readers_do_not_block_the_connection(db: pagedkv_sql.Database) -> None:
    db.load(DATA)
    reader = db.resolve(batch_size=2)
    first = reader.read_next_batch()
    assert db.sql("SELECT count(*) AS n FROM root_table").to_arrow_table().to_pylist() == [{"n": 2}]
    assert first.num_rows >= 1
    reader.close()
