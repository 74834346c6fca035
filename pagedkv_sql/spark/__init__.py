"""pagedkv-sql on Apache Spark: the spec's relations, resolution and checks on a
SparkSession, for data past one machine (docs/scale.md).

An optional part: ``pip install 'pagedkv-sql[spark]'`` brings pyspark and sqlglot, and
Spark needs Java 17+. The core never imports this package; using it without the extra
raises a SparkError that says how to install it::

    from pagedkv_sql.spark import SparkKV, session
    kv = SparkKV.from_parquet(session(), "fleet/", partition_by="replica")
    kv.validate()                      # the spec's constraints, naming offending rows
    kv.resolve().write.parquet("out")  # resolved_kv_address, per replica
"""

from __future__ import annotations

from typing import Any

from ..lazy import attribute
from .session import SparkError, require, session

_LAZY = {
    "SparkKV": "kv",
    "SpecViolationError": "kv",
    "spark_views": "translate",
    "translate": "translate",
}


def __getattr__(name: str) -> Any:
    # the heavy parts load on first use, so that the CLI can list the spark commands
    # (and say how to install the extra) without pyspark and sqlglot installed
    if name in _LAZY:
        require()
    return attribute(__name__, _LAZY, name)


__all__ = [
    "SparkError",
    "SparkKV",
    "SpecViolationError",
    "require",
    "session",
    "spark_views",
    "translate",
]
