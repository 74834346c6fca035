"""relations.py: the relations and their Arrow schemas."""

from __future__ import annotations

import pyarrow as pa

from pagedkv_sql.relations import INPUT_RELATIONS, arrow_schema


def test_every_relation_schema_is_non_nullable_int64() -> None:
    for relation in (*INPUT_RELATIONS, "resolved_kv_address"):
        schema = arrow_schema(relation)
        assert all(f.type == pa.int64() and not f.nullable for f in schema), relation
