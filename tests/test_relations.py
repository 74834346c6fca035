"""relations.py: the relations and their Arrow schemas."""

from __future__ import annotations

import pyarrow as pa

from pagedkv_sql.relations import INPUT_RELATIONS, arrow_schema

# =================================================================================================
# Moved from the mutation runs' files (issue 24, tests by subject): each test pins a
# boundary or a branch a mutant of `make mutate` moved (docs/mutation.md); its comment
# names the run and the file it was first written in.
# =================================================================================================


# -- relations.py --------------------------------------------------------------------------
# (from tests/test_mutation_kills.py)


# killed a mutant of relations.py (mutation run, 2026-11-30)
def test_every_relation_schema_is_non_nullable_int64() -> None:
    for relation in (*INPUT_RELATIONS, "resolved_kv_address"):
        schema = arrow_schema(relation)
        assert all(f.type == pa.int64() and not f.nullable for f in schema), relation
