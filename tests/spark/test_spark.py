"""Spark gives DuckDB's answers: resolved_kv_address, the spec's checks and every
diagnostic, row for row, on the random facts of the DuckDB suite's differential tests
(tests/test_property.py, tests/test_sql_constraints_plans.py), each case one partition
value of a single Spark run, and on the 2^63 edge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ..helpers import check_facts, resolve_facts
from ..reference import resolve as reference
from .helpers import Facts, duckdb_answers, duckdb_spec_rows, spark_rows, write_fleet

pytestmark = [
    pytest.mark.spark,
    # a failing run of 60 cases has a large repr: the assertion names the case instead
    pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning"),
]
CASES = 40
ONE_RUN = settings(
    max_examples=1,
    deadline=None,
    database=None,
    phases=(Phase.generate,),  # a failure names its replica: no shrinking
    suppress_health_check=list(HealthCheck),
)


def many(strategy: Any) -> Any:
    """CASES cases of ``strategy``, most of them with facts (not the minimal example
    Hypothesis tries first)."""
    return st.lists(strategy, min_size=CASES, max_size=CASES).filter(
        lambda cases: sum(any(c.values()) for c in cases) > CASES // 2
    )


def spark_answers(kv: Any, partitioned: bool = True) -> dict[str, dict[str, set[tuple[Any, ...]]]]:
    out = {"resolved_kv_address": spark_rows(kv.resolve().toArrow(), partitioned)}
    for result in kv.check(limit=None).results:
        out[result.name] = spark_rows(result.rows, partitioned)
    return out


def assert_same(cases: list[Facts], block_size: int, got: dict[str, dict[str, Any]]) -> None:
    for i, case in enumerate(cases):
        expected = duckdb_answers(case, block_size)
        oracle = reference(*(case[r] for r in expected_relations()))
        assert expected["resolved_kv_address"] == set(oracle)
        for name, rows in expected.items():
            assert got[name].get(str(i), set()) == rows, (name, i, case)


def expected_relations() -> tuple[str, ...]:
    return ("root_table", "block_table_entry", "virtual_token", "swapped_block")


@pytest.mark.parametrize(
    ("strategy", "block_size"),
    [(resolve_facts, 16), (check_facts, 16), (check_facts, 4)],
    ids=["property-facts", "plans-facts-bs16", "plans-facts-bs4"],
)
def test_every_differential_case_gives_duckdbs_rows(
    spark: Any, tmp_path_factory: pytest.TempPathFactory, strategy: Any, block_size: int
) -> None:
    from pagedkv_sql.spark import SparkKV

    @ONE_RUN
    @given(many(strategy))
    def run(cases: list[Facts]) -> None:
        # the plans tests add exact duplicates from SQL: here they are in the files
        cases = [{k: v + v[: len(v) // 3] for k, v in c.items()} for c in cases]
        root = write_fleet(tmp_path_factory.mktemp("fleet"), cases)
        kv = SparkKV.from_parquet(spark, root, partition_by="replica", block_size=block_size)
        assert_same(cases, block_size, spark_answers(kv))

    run()


EDGE: Facts = {
    "root_table": [(1, 10), (2, 20), (3, 30)],
    "block_table_entry": [(10, 0, 2**63 - 256, 1), (30, 0, -(2**63), 1)],
    "virtual_token": [(1, 0, 0, 255), (2, 0, 0, 5), (2, 1, 0, 255), (3, 0, 0, 0), (3, 1, 1, 0)],
    "swapped_block": [
        (
            20,
            0,
            2**63 - 1,
        ),
        (30, 1, -(2**63)),
    ],
}


@pytest.mark.parametrize("ansi", ["true", "false"])
def test_the_cpu_wrap_near_2_63_unpartitioned(spark: Any, tmp_path: Path, ansi: str) -> None:
    """Base + offset wraps as a 64-bit Soufflé build does, whatever ANSI mode the session
    had before: Spark pins it on (an overflow elsewhere raises, as in DuckDB)."""
    from pagedkv_sql.spark import SparkKV

    spark.conf.set("spark.sql.ansi.enabled", ansi)
    root = write_fleet(tmp_path / "in", [EDGE], partitioned=False)
    kv = SparkKV.from_parquet(spark, root)
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"
    got = sorted(tuple(r) for r in kv.resolve().collect())
    assert got == [
        (1, 0, 2**63 - 1),
        (2, 0, -(2**63) + 4),
        (2, 1, -(2**63) + 254),
        (3, 0, -(2**63)),
        (3, 1, -(2**63)),
    ]
    assert got == reference(*(EDGE[r] for r in expected_relations()))
    answers = spark_answers(kv, partitioned=False)
    for name, rows in duckdb_answers(EDGE, 16).items():
        assert answers[name].get("", set()) == rows, name


def seed_case() -> Facts:
    from ..helpers import DATA

    case: Facts = {}
    for relation in expected_relations():
        lines = (DATA / f"{relation}.facts").read_text().split("\n")
        case[relation] = [tuple(int(x) for x in line.split("\t")) for line in lines if line]
    return case


def test_the_seed_data_unpartitioned(spark: Any, tmp_path: Path) -> None:
    from pagedkv_sql.spark import SparkKV

    case = seed_case()
    kv = SparkKV.from_parquet(spark, write_fleet(tmp_path / "in", [case], partitioned=False))
    answers = spark_answers(kv, partitioned=False)
    expected = duckdb_answers(case, 16)
    for name, rows in expected.items():
        assert answers[name].get("", set()) == rows, name
    assert expected["diag_refcount_mismatch"] and expected["diag_unresolved_token"]


offsets = st.integers(-300, 300)
violating = st.fixed_dictionaries(
    {
        "root_table": st.lists(st.tuples(st.integers(0, 3), st.integers(10, 12)), max_size=3),
        "block_table_entry": st.lists(
            st.tuples(
                st.integers(10, 12),
                st.integers(0, 3),
                st.one_of(st.integers(-600, 600), st.sampled_from([2**63 - 1, -(2**63) + 1])),
                st.integers(-2, 2),
            ),
            max_size=6,
        ),
        "virtual_token": st.lists(
            st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(0, 3), offsets),
            max_size=8,
        ),
        "swapped_block": st.lists(
            st.tuples(st.integers(10, 12), st.integers(0, 3), st.integers(0, 9)), max_size=3
        ),
    }
).map(lambda f: {k: v + v[:1] for k, v in f.items()})


def test_spec_checks_name_the_same_rows_and_refuse_the_job(
    spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from pagedkv_sql.spark import SparkKV, SpecViolationError

    @ONE_RUN
    @given(many(violating))
    def run(cases: list[Facts]) -> None:
        root = write_fleet(tmp_path_factory.mktemp("bad"), cases)
        kv = SparkKV.from_parquet(spark, root, partition_by="replica")
        got = {r.name: spark_rows(r.rows) for r in kv.check(severity="error", limit=None).results}
        per_check = dict.fromkeys(got, 0)
        for i, case in enumerate(cases):
            for name, rows in duckdb_spec_rows(case).items():
                assert got[name].get(str(i), set()) == rows, (name, i, case)
                per_check[name] += len(rows)
        total = sum(per_check.values())
        assert total, "the strategy made no violation"
        with pytest.raises(SpecViolationError) as raised:
            kv.validate(limit=5)
        assert raised.value.total == total  # type: ignore[attr-defined]
        assert len(raised.value.details) == sum(min(n, 5) for n in per_check.values())
        assert all(d.startswith("spec_") and "(replica " in d for d in raised.value.details)

    run()


def test_existing_spark_tables(spark: Any) -> None:
    """Relations from tables (here temporary views standing for a catalog's tables)."""
    from pagedkv_sql.spark import SparkKV

    from ..helpers import arrow_table

    names = {}
    for relation in expected_relations():
        frame = spark.createDataFrame(arrow_table(relation, EDGE[relation]))
        frame.createOrReplaceTempView(f"fleet_{relation}")
        names[relation] = f"fleet_{relation}"
    kv = SparkKV.from_tables(spark, names)
    got = sorted(tuple(r) for r in kv.resolve().collect())
    assert got == reference(*(EDGE[r] for r in expected_relations()))


def test_bad_inputs_are_refused_with_the_reason(spark: Any, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from pagedkv_sql.errors import InputError
    from pagedkv_sql.spark import SparkKV

    from ..helpers import arrow_table

    # a replica=... layout read without --partition-by would mix the replicas
    root = write_fleet(tmp_path / "fleet", [EDGE, EDGE])
    with pytest.raises(InputError, match=r"partitioned by replica .* no --partition-by"):
        SparkKV.from_parquet(spark, root)
    # a float column
    bad = write_fleet(tmp_path / "float", [EDGE], partitioned=False)
    floats = pa.table({"seq_id": [1.5], "block_table_ptr": [10.0]})
    pq.write_table(floats, bad / "root_table" / "part-0.parquet")
    with pytest.raises(InputError, match=r"root_table.seq_id is double"):
        SparkKV.from_parquet(spark, bad)
    # a NULL
    nulls = write_fleet(tmp_path / "nulls", [EDGE], partitioned=False)
    table = arrow_table("root_table", [(1, 10)])
    table = table.set_column(1, "block_table_ptr", pa.array([None], pa.int64()))
    pq.write_table(table, nulls / "root_table" / "part-0.parquet")
    kv = SparkKV.from_parquet(spark, nulls)
    with pytest.raises(InputError, match="NULL") as raised:
        kv.validate()
    assert raised.value.details == ['root_table: {"seq_id":1,"block_table_ptr":null}']


def as_uint64(root: Path) -> None:
    """Every Parquet file under ``root`` rewritten with uint64 columns."""
    import pyarrow.parquet as pq

    for path in root.rglob("*.parquet"):
        table = pq.ParquetFile(path).read()
        pq.write_table(table.cast(pa.schema([(n, pa.uint64()) for n in table.column_names])), path)


def test_uint64_columns_are_read_when_every_value_fits(spark: Any, tmp_path: Path) -> None:
    """As the DuckDB load takes a uint64 Parquet column whose values all fit in int64."""
    from pagedkv_sql.spark import SparkKV

    case = seed_case()
    root = write_fleet(tmp_path / "in", [case, case])
    as_uint64(root)
    kv = SparkKV.from_parquet(spark, root, partition_by="replica")
    answers = spark_answers(kv)
    for name, rows in duckdb_answers(case, 16).items():
        assert answers[name].get("0", set()) == rows == answers[name].get("1", set()), name


def test_a_uint64_value_beyond_int64_is_refused_naming_column_and_row(
    spark: Any, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    from pagedkv_sql.errors import InputError
    from pagedkv_sql.spark import SparkKV

    from ..helpers import arrow_table

    root = write_fleet(tmp_path / "in", [seed_case()], partitioned=False)
    file = root / "root_table" / "part-0.parquet"
    rows = {"seq_id": [1, 2, 3], "block_table_ptr": [100, 2**63 + 5, 2**64 - 1]}
    pq.write_table(pa.table({k: pa.array(v, pa.uint64()) for k, v in rows.items()}), file)
    with pytest.raises(InputError) as raised:
        SparkKV.from_parquet(spark, root)
    assert raised.value.message == (
        "root_table: 2 row(s) with a uint64 value beyond the signed 64-bit range; nothing was read"
    )
    assert raised.value.details == [
        f"{file} row 2: column block_table_ptr holds 9223372036854775813, "
        "beyond the signed 64-bit range",
        f"{file} row 3: column block_table_ptr holds 18446744073709551615, "
        "beyond the signed 64-bit range",
    ]
    # a table (no file behind it): the row is named by its other values
    from decimal import Decimal

    names = {}
    for relation in expected_relations():
        frame = spark.createDataFrame(arrow_table(relation, []))
        if relation == "root_table":
            frame = spark.createDataFrame(
                [(Decimal(2**63), 10)], "seq_id DECIMAL(20,0), block_table_ptr BIGINT"
            )
        frame.createOrReplaceTempView(f"u64_{relation}")
        names[relation] = f"u64_{relation}"
    with pytest.raises(InputError) as raised:
        SparkKV.from_tables(spark, names)
    assert raised.value.details == [
        "root_table row (block_table_ptr 10): column seq_id holds 9223372036854775808, "
        "beyond the signed 64-bit range"
    ]
