"""The Spark tier: one local SparkSession for the whole run (starting one costs seconds),
and the DuckDB answers the Spark ones must equal."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from pagedkv_sql.spark import session

    spark = session(
        "local[2]",
        {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
        app_name="pagedkv-sql tests",
    )
    yield spark
    spark.stop()
